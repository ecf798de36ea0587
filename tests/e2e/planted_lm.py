"""lm-eval's own scoring of chosen answers: a scripted model that answers what the test plants.

Run by the toolchain's interpreter (it imports lm-eval, never ftbus)::

    python planted_lm.py PLANTS.json INCLUDE_DIR OUTPUT_DIR

``PLANTS.json``: ``{task: {"generate": [text per doc], "loglik": [[loglikelihood per choice] per doc]}}``.
lm-eval then applies its own filters and metrics to those answers (``simple_evaluate`` with the tasks
of INCLUDE_DIR) and saves the samples files as its CLI does (``EvaluationTracker``). The planted code
is the test's own, never a model's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.loggers import EvaluationTracker
from lm_eval.tasks import TaskManager


class Planted(LM):
    def __init__(self, plants: dict) -> None:
        super().__init__()
        self.plants = plants

    def generate_until(self, requests: list) -> list[str]:
        return [self.plants[r.task_name]["generate"][r.doc_id] for r in requests]

    def loglikelihood(self, requests: list) -> list[tuple[float, bool]]:
        return [(float(self.plants[r.task_name]["loglik"][r.doc_id][r.idx]), False) for r in requests]

    def loglikelihood_rolling(self, requests: list) -> list[float]:
        raise NotImplementedError("no benchmark here scores rolling log-likelihood (perplexity): nothing asks for it")


def main() -> None:
    plants_file, include, output = sys.argv[1:4]
    plants = json.loads(Path(plants_file).read_text(encoding="utf-8"))
    tracker = EvaluationTracker(output_path=output)
    results = simple_evaluate(model=Planted(plants), tasks=sorted(plants), log_samples=True,
                              evaluation_tracker=tracker, confirm_run_unsafe_code=True,
                              task_manager=TaskManager(include_path=include, include_defaults=False))
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])


if __name__ == "__main__":
    main()
