"""What every benchmark backend does last: sample the errors and assemble ``BenchmarkScores``."""

from __future__ import annotations

import random
from collections.abc import Iterator

from evaluation.registry import BenchmarkSpec, SubsetSpec
from evaluation.runs import ItemAnswers, ItemScores, run_stats
from evaluation.splits import SplitManifest
from shared.events import BenchmarkScores, ErrorSample


def evaluated_subsets(spec: BenchmarkSpec, manifest: SplitManifest) -> Iterator[tuple[SubsetSpec, list[str]]]:
    """The subsets this split evaluated, with their item ids (a subset too small for it has none)."""
    for subset in spec.subsets:
        ids = manifest.item_ids.get(subset.name, [])
        if ids:
            yield subset, ids


def assemble_scores(
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    summary: dict[str, dict[str, float]],
    errors: list[ErrorSample],
    max_error_samples: int,
    seed: int,
    *,
    item_scores: ItemScores | None = None,
    answers: ItemAnswers | None = None,
) -> BenchmarkScores:
    """``primary_value`` is the mean of the primary metric over subsets, every subset weighing the same:
    the estimand the paired comparison tests (``shared/paired.py``) and the leaderboard ranks; at most
    ``max_error_samples`` errors are kept, drawn with ``random.Random(seed)`` so the same run always
    shows the judge the same samples (the reference's were unseeded). ``item_scores`` (each item's
    primary metric per run) give the statistics over runs (evaluation/runs.py)."""
    if len(errors) > max_error_samples:
        keep = sorted(random.Random(seed).sample(range(len(errors)), max_error_samples))
        errors = [errors[i] for i in keep]
    values = [m[spec.primary_metric] for m in summary.values()]
    item_scores = item_scores or {}
    per_subset, overall = run_stats(spec.scorer_name, item_scores, answers)
    return BenchmarkScores(
        num_runs=overall.num_runs if overall else 1,
        item_scores=item_scores,
        run_stats=per_subset,
        overall=overall,
        accuracy_summary=summary,
        error_samples=errors,
        primary_metric=spec.primary_metric,
        higher_is_better=spec.higher_is_better,
        primary_value=sum(values) / len(values) if values else None,
        item_ids={s: list(ids) for s, ids in manifest.item_ids.items() if ids},
    )
