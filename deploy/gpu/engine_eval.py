"""The GPU check's evaluator: the warm engine's model path, one process for every model.

    <toolchain python> engine_eval.py JOB.json REPORT.json

Imports the harness once, then for each model of the job: ``vllm_support.lm_eval_model`` (which
merges the adapter first where it must), one model load (``create_from_arg_obj``), every split
evaluated on that one load (``simple_evaluate`` with the job's task folder, outputs written as the
``lm_eval`` command writes them), then ``vllm_support.release`` before the next model. Writes a
report: per model the lm-eval model type and arguments chosen, and the seconds each step took.

JOB.json: {"device": "cuda", "gpus": 1, "dtype": null, "gpu_memory_utilization": 0.5, "seed": 0,
           "models": [{"name": ..., "pretrained": ..., "peft": ... | null, "scratch": ...,
                       "apply_chat_template": bool,
                       "splits": [{"split": ..., "include_path": ..., "tasks": [...], "output_path": ...}]}]}
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VLLM_SUPPORT = ROOT / "services" / "benchmark" / "engine" / "vllm_support.py"


def load_vllm_support():
    spec = importlib.util.spec_from_file_location("ftbus_vllm_support", VLLM_SUPPORT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


def evaluate_model(job: dict[str, Any], model: dict[str, Any], support: Any) -> dict[str, Any]:
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    report: dict[str, Any] = {"name": model["name"], "splits": {}}
    t0 = time.monotonic()
    name, args = support.lm_eval_model(
        model["pretrained"], model.get("peft"), device=job["device"], gpus=int(job["gpus"]),
        dtype=job.get("dtype"), scratch=model["scratch"],
        gpu_memory_utilization=float(job.get("gpu_memory_utilization", support.DEFAULT_GPU_MEMORY_UTILIZATION)),
        seed=int(job.get("seed", 0)),
    )
    report |= {"model": name, "args": args, "plan_s": round(time.monotonic() - t0, 2)}
    t0 = time.monotonic()
    lm = get_model(name).create_from_arg_obj(args, {"batch_size": 1 if name == "hf" else None})
    report["load_s"] = round(time.monotonic() - t0, 2)
    try:
        for split in model["splits"]:
            t0 = time.monotonic()
            tracker = EvaluationTracker(output_path=split["output_path"])
            results = lm_eval.simple_evaluate(
                model=lm, tasks=list(split["tasks"]),
                task_manager=TaskManager(include_path=split["include_path"], include_defaults=False),
                log_samples=True, evaluation_tracker=tracker,
                apply_chat_template=bool(model.get("apply_chat_template")),
                random_seed=int(job.get("seed", 0)),
            )
            if results is None:
                raise RuntimeError(f"lm-eval returned no results for {model['name']} / {split['split']}")
            samples = results.pop("samples")
            tracker.general_config_tracker.model_name_sanitized = "model"
            tracker.save_results_aggregated(results=results, samples=samples)
            for task in results["configs"]:
                tracker.save_results_samples(task_name=task, samples=samples[task])
            report["splits"][split["split"]] = round(time.monotonic() - t0, 2)
    finally:
        t0 = time.monotonic()
        support.release(lm)
        report["release_s"] = round(time.monotonic() - t0, 2)
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    report: dict[str, Any] = {"models": []}
    t0 = time.monotonic()
    support = load_vllm_support()
    import lm_eval  # noqa: F401  (the harness import, once, as the warm engine does)

    report["import_s"] = round(time.monotonic() - t0, 2)
    status = 0
    for model in job["models"]:
        try:
            report["models"].append(evaluate_model(job, model, support))
        except Exception as exc:  # reported per model; the driver fails the check
            report["models"].append({"name": model["name"], "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-4000:]})
            status = 1
        Path(argv[1]).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    Path(argv[1]).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
