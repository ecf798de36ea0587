"""The paired comparison of two sets of benchmark scores on the same items, and its words.

The benchmark stage compares a candidate with its base model; the judge recomputes the comparison
at its own confidence level; a comparison of two requests uses the same call. Each side's per-item
value is the item's primary metric averaged over its runs (``BenchmarkScores.item_means``), and
every subset weighs the same, as in ``primary_value`` (the mean of the subsets' means): the
comparison's difference is the headline's difference (docs/benchmarks.md, "One estimand").
"""

from __future__ import annotations

from shared.events import BenchmarkScores
from shared.statistics import ItemsDiffer, PairedComparison, compare_paired, paired_p_value

#: The bootstrap's and the permutation test's seed: recorded in every comparison (``paired.seed``).
BOOTSTRAP_SEED = 0
DEFAULT_LEVEL = 0.95


def compare_scores(
    candidate: BenchmarkScores,
    other: BenchmarkScores,
    *,
    level: float = DEFAULT_LEVEL,
    seed: int = BOOTSTRAP_SEED,
    other_name: str = "the base model",
) -> tuple[PairedComparison | None, str]:
    """The paired comparison of ``candidate`` with ``other``, and the sentence saying it; the
    comparison is None when the two cannot be paired, and the sentence says why."""
    mine, theirs = candidate.item_means(), other.item_means()
    if not mine or not theirs:
        side = "the candidate" if not mine else other_name
        return None, f"no paired comparison with {other_name}: {side} has no per-item outcomes"
    if candidate.num_runs != other.num_runs:
        return None, (f"no paired comparison with {other_name}: {candidate.num_runs} runs per item against "
                      f"{other.num_runs}")
    try:
        paired = compare_paired(mine, theirs, seed=seed, level=level, higher_is_better=candidate.higher_is_better,
                                strata={key: subset_of(key) for key in mine})
    except ItemsDiffer as exc:
        return None, f"no paired comparison with {other_name}: {exc}"
    return paired, describe_with_power(paired, other_name)


def paired_p(candidate: BenchmarkScores, other: BenchmarkScores, *, seed: int = BOOTSTRAP_SEED) -> float | None:
    """``compare_scores``'s p-value alone (at its default level), or None where the two cannot be paired."""
    mine, theirs = candidate.item_means(), other.item_means()
    if not mine or not theirs or candidate.num_runs != other.num_runs or mine.keys() != theirs.keys():
        return None
    return paired_p_value(mine, theirs, seed=seed, strata={key: subset_of(key) for key in mine})


def subset_of(key: str) -> str:
    """The subset of an ``item_means`` key, ``<subset>/<item id>``."""
    return key.split("/", 1)[0]


def describe_with_power(paired: PairedComparison, other_name: str = "the base model") -> str:
    """The comparison in words, then what it could have detected ("...; with 40 items and 10% of them
    differing, no improvement is detectable at 80% power")."""
    power = paired.describe_power()
    return paired.describe(other_name) + (f"; {power}" if power else "")
