"""Repeated runs: how many samples an item gets, and what is reported over them.

``num_runs`` comes from the request (``TaskSpec.num_runs``), else the benchmark's descriptor (default 1).
The engine generates an item's runs in one batched generation: lm-eval's ``repeats`` in the task
config clones each request, the copies sort next to each other, and a batch size of ``num_runs``
makes each batch one prompt with its samples (docs/benchmarks.md, "Repeated runs").

Per subset and over all items (``BenchmarkScores.run_stats``, ``.overall``), from each item's primary
metric in each run: the mean over items of the item means (avg@n) and its standard error over items;
for code, the unbiased pass@k for k <= n; for math, avg@n and maj@n (the most frequent extracted answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from evaluation.registry import BenchmarkSpec
from shared.events import RunStats
from shared.statistics import majority_correct, mean_stderr, pass_at_k

#: Scorers whose runs vote on an extracted answer (maj@n).
VOTING_SCORERS = frozenset({"gsm8k", "math", "numeric"})
#: The k of pass@k reported for code, where k <= n.
PASS_KS = (1, 2, 5, 10, 20, 50, 100)

#: subset -> item id -> one value per run.
ItemScores = dict[str, dict[str, list[float]]]
#: subset -> item id -> (extracted answer, correct) per run.
ItemAnswers = Mapping[str, Mapping[str, Sequence[tuple[str | None, bool]]]]


def effective_runs(spec: BenchmarkSpec, requested: int | None) -> tuple[int, str | None]:
    """The samples per item for this benchmark and request, and a note when the request's is not used."""
    runs = requested or spec.num_runs
    if runs > 1 and spec.kind == "multiple_choice":
        return 1, (f"num_runs {runs} asked, 1 run made: {spec.name} is scored by log-likelihood, "
                   "which is the same in every run")
    return runs, None


def _stats(scorer: str, items: Mapping[str, Sequence[float]],
           answers: Mapping[str, Sequence[tuple[str | None, bool]]] | None) -> RunStats:
    runs = [list(values) for values in items.values()]
    n = min(len(r) for r in runs)
    mean, stderr = mean_stderr([sum(r) / len(r) for r in runs])
    stats = RunStats(items=len(runs), num_runs=n, mean=mean, stderr=stderr)
    if scorer == "code":
        ks = sorted({k for k in PASS_KS if k <= n} | {n})
        stats.pass_at_k = {
            f"pass@{k}": sum(pass_at_k(len(r), sum(1 for v in r if v >= 1.0), k) for r in runs) / len(runs)
            for k in ks
        }
    if scorer in VOTING_SCORERS:
        stats.avg_at_n = mean
        if answers is not None:
            stats.maj_at_n = sum(majority_correct(answers[item]) for item in items) / len(runs)
    return stats


def run_stats(scorer: str, item_scores: ItemScores, answers: ItemAnswers | None = None,
              ) -> tuple[dict[str, RunStats], RunStats | None]:
    """Per-subset statistics and those over every item (None when no item was scored)."""
    per_subset = {subset: _stats(scorer, items, answers.get(subset) if answers else None)
                  for subset, items in item_scores.items() if items}
    pooled = {f"{subset}/{item}": values for subset, items in item_scores.items() for item, values in items.items()}
    pooled_answers = None
    if answers is not None:
        pooled_answers = {f"{subset}/{item}": votes
                          for subset, items in answers.items() for item, votes in items.items()}
    return per_subset, (_stats(scorer, pooled, pooled_answers) if pooled else None)
