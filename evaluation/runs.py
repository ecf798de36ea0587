"""Repeated runs: how many samples an item gets, and what is reported over them.

``num_runs`` comes from the request (``TaskSpec.num_runs``), else the benchmark's descriptor (default 1).
The engine generates an item's runs in one batched generation: lm-eval's ``repeats`` in the task
config clones each request, the copies sort next to each other, and a batch size of ``num_runs``
makes each batch one prompt with its samples (docs/benchmarks.md, "Repeated runs").

Per subset (``BenchmarkScores.run_stats``), from each item's primary metric in each run: the mean over
items of the item means (avg@n) and its standard error over items; for code, the unbiased pass@k for
k <= n; for math, avg@n and maj@n (the most frequent extracted answer). ``.overall`` is the headline's
estimand (``primary_value``, the paired comparison): every subset weighs the same, so each of its
numbers is the mean of the subsets' numbers, and its standard error sqrt(sum of se_s^2) / S.
"""

from __future__ import annotations

import math
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


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def combine_subsets(per_subset: Mapping[str, RunStats]) -> RunStats | None:
    """The statistics over all subsets, each weighing the same (``primary_value``'s mean of the subsets'
    means); None when no subset was scored. The standard error of a mean of S independent subset means
    is sqrt(sum se_s^2) / S, undefined (None) when one subset's is (a subset of one item)."""
    stats = list(per_subset.values())
    if not stats:
        return None
    errors = [s.stderr for s in stats]
    stderr = None
    if all(e is not None for e in errors):
        stderr = math.sqrt(math.fsum(e * e for e in errors if e is not None)) / len(stats)
    combined = RunStats(items=sum(s.items for s in stats), num_runs=min(s.num_runs for s in stats),
                        mean=_mean([s.mean for s in stats]), stderr=stderr)
    ks = set.intersection(*(set(s.pass_at_k) for s in stats))
    combined.pass_at_k = {k: _mean([s.pass_at_k[k] for s in stats]) for k in sorted(ks, key=lambda k: int(k[5:]))}
    if all(s.avg_at_n is not None for s in stats):
        combined.avg_at_n = combined.mean
    if all(s.maj_at_n is not None for s in stats):
        combined.maj_at_n = _mean([s.maj_at_n for s in stats if s.maj_at_n is not None])
    return combined


def run_stats(scorer: str, item_scores: ItemScores, answers: ItemAnswers | None = None,
              ) -> tuple[dict[str, RunStats], RunStats | None]:
    """Per-subset statistics and those over all subsets, each weighing the same (None when no item was scored)."""
    per_subset = {subset: _stats(scorer, items, answers.get(subset) if answers else None)
                  for subset, items in item_scores.items() if items}
    return per_subset, combine_subsets(per_subset)
