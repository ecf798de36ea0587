"""Telling progress from noise when two models are scored on the same benchmark items.

The design is paired: the candidate and the baseline answer the very same items, so each item's own
difficulty cancels out of the per-item difference, and the comparison is far sharper than comparing two
independent accuracies with overlapping error bars.

Which test is used when:

- Every item scored exactly 0 or 1 on both sides (one run per item): McNemar's exact test. Items both
  models got right, or both got wrong, say nothing about which model is better; only the discordant
  items do, and under "no difference" each of them is equally likely to favour either side, so the
  count that favours the candidate is Binomial(discordant, 1/2). Computed with exact integers.
- Graded per-item scores (a mean over repeated runs, partial credit): a paired sign-flip permutation
  test of the mean difference, exact when there are few non-zero differences, Monte Carlo otherwise.
- In both cases the confidence interval of the mean difference comes from a paired bootstrap that
  resamples items, because the item is the unit of sampling: the benchmark is one draw of items from
  the population of items like them, and the runs within an item are not independent of each other.

Everything random takes a seed and uses numpy's default_rng, so the same inputs and seed give the
same interval and p-value on every machine and every rerun.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import numpy as np

# Elements per resampling chunk: an int64 index and the float64 it gathers are 16 bytes, so about 96 MB.
_CHUNK_ELEMENTS = 6_000_000
# Up to this many non-zero differences the sign-flip test enumerates all 2**m assignments (65,536).
_EXACT_MAX = 16
# Slack for float rounding when a flipped mean equals the observed one in exact arithmetic.
_TIE_TOLERANCE = 1e-12


class ItemsDiffer(ValueError):
    """The two sides were scored on different items, so there is nothing to pair."""


class McNemar(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_only: int  # items the candidate got right and the baseline wrong
    baseline_only: int  # items the baseline got right and the candidate wrong
    p_value: float


def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation over sqrt(n)); the error is 0.0 for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_stderr needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0
    variance = math.fsum((x - mean) ** 2 for x in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. 2021 from n samples of which c are correct.

    1 - C(n-c, k) / C(n, k), in the product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the
    huge binomial coefficients.
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@k needs k <= n, got k={k} with n={n} samples")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c} with n={n}")
    if n - c < k:
        return 1.0  # every k-subset holds at least one correct sample
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_correct(runs: Sequence[tuple[str | None, bool]]) -> bool:
    """maj@n for one item: whether the most frequent extracted answer is a correct one.

    Runs without an extracted answer (None) do not vote. Ties go to the answer seen first, and an answer's
    correctness is that of its first run, so the result does not depend on anything but the run order.
    """
    counts: Counter[str] = Counter()
    correct: dict[str, bool] = {}
    for answer, is_correct in runs:
        if answer is None:
            continue
        counts[answer] += 1
        correct.setdefault(answer, is_correct)
    if not counts:
        return False
    # Counter keeps first-insertion order and max() returns the first maximum: ties go to the earliest answer.
    winner = max(counts, key=counts.__getitem__)
    return correct[winner]


def _differences(candidate: Sequence[float], baseline: Sequence[float]) -> np.ndarray:
    import numpy as np  # on first use: the events import this module's models, every CLI command with them

    if len(candidate) != len(baseline):
        raise ValueError(f"paired inputs differ in length: {len(candidate)} candidate, {len(baseline)} baseline")
    if len(candidate) == 0:
        raise ValueError("a paired comparison needs at least one item")
    return np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)


def paired_bootstrap(
    candidate: Sequence[float], baseline: Sequence[float], *, seed: int, resamples: int = 10_000, level: float = 0.95
) -> tuple[float, float, float]:
    """The mean paired difference (candidate - baseline) and its percentile bootstrap interval over items."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    import numpy as np

    diffs = _differences(candidate, baseline)
    n = diffs.size
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    rows = max(1, _CHUNK_ELEMENTS // n)  # depends on n only, so the draws (and the interval) stay reproducible
    for start in range(0, resamples, rows):
        stop = min(start + rows, resamples)
        means[start:stop] = diffs[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    alpha = 1.0 - level
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(diffs.mean()), float(low), float(high)


def mcnemar_exact(candidate: Sequence[bool], baseline: Sequence[bool]) -> McNemar:
    """McNemar's exact two-sided test: a binomial test of the discordant items at p = 1/2."""
    if len(candidate) != len(baseline):
        raise ValueError(f"paired inputs differ in length: {len(candidate)} candidate, {len(baseline)} baseline")
    b = sum(1 for x, y in zip(candidate, baseline, strict=True) if x and not y)
    c = sum(1 for x, y in zip(candidate, baseline, strict=True) if y and not x)
    n = b + c
    if n == 0:
        return McNemar(candidate_only=0, baseline_only=0, p_value=1.0)
    # Integer tail sum and one exact division: no overflow or underflow, however many discordant items.
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    p = min(Fraction(1), Fraction(2 * tail, 2**n))
    return McNemar(candidate_only=b, baseline_only=c, p_value=float(p))


def paired_permutation(
    candidate: Sequence[float], baseline: Sequence[float], *, seed: int, resamples: int = 10_000
) -> float:
    """Two-sided sign-flip permutation p-value of the mean paired difference.

    Under "no difference" each item's difference is as likely to have either sign. Zero differences are
    unchanged by a flip, so only the m non-zero ones are flipped: all 2**m ways when m <= 16, otherwise
    `resamples` random ways with p = (hits + 1) / (resamples + 1), which never reports an impossible 0.
    """
    import numpy as np

    diffs = _differences(candidate, baseline)
    n = diffs.size
    nonzero = diffs[diffs != 0.0]
    m = nonzero.size
    if m == 0:
        return 1.0
    threshold = abs(float(nonzero.sum()) / n) - _TIE_TOLERANCE
    if m <= _EXACT_MAX:
        patterns = (np.arange(2**m)[:, None] >> np.arange(m)) & 1  # row j: the bits of j
        flipped = np.abs((1 - 2 * patterns) @ nonzero / n)
        return float(np.count_nonzero(flipped >= threshold)) / 2**m
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    rng = np.random.default_rng(seed)
    hits = 0
    rows = max(1, _CHUNK_ELEMENTS // m)
    for start in range(0, resamples, rows):
        signs = 1 - 2 * rng.integers(0, 2, size=(min(rows, resamples - start), m))
        hits += int(np.count_nonzero(np.abs(signs @ nonzero / n) >= threshold))
    return (hits + 1) / (resamples + 1)


def _signed(x: float) -> str:
    text = f"{x:+.2f}"
    return "+0.00" if text == "-0.00" else text  # a difference that rounds to zero has no sign


class PairedComparison(BaseModel):
    """A candidate against a baseline on the same items: the difference, its interval and the test's p-value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: int
    candidate_mean: float
    baseline_mean: float
    difference: float
    ci_low: float
    ci_high: float
    level: float
    p_value: float
    test: Literal["mcnemar", "permutation"]
    candidate_only: int | None
    baseline_only: int | None
    seed: int
    resamples: int
    #: Whether a positive difference is an improvement (the metric's own direction).
    higher_is_better: bool = True

    def beyond_noise(self, level: float | None = None) -> bool:
        """Whether the interval excludes 0 and the p-value is below 1 - level.

        The interval was computed at self.level; asking another level changes only the p-value threshold.
        """
        level = self.level if level is None else level
        excludes_zero = self.ci_low > 0.0 or self.ci_high < 0.0
        return excludes_zero and self.p_value < 1.0 - level

    def improves(self, level: float | None = None) -> bool:
        """Better beyond noise: the interval excludes 0 on the better side, and p < 1 - level."""
        gain = self.difference if self.higher_is_better else -self.difference
        return self.beyond_noise(level) and gain > 0

    @property
    def direction(self) -> Literal["better", "worse", "indistinguishable"]:
        if not self.beyond_noise():
            return "indistinguishable"
        return "better" if self.improves() else "worse"

    def describe(self, other: str = "the base model") -> str:
        ci = f"{self.level * 100:.0f}% CI {_signed(self.ci_low)} to {_signed(self.ci_high)}"
        p = "p < 0.001" if self.p_value < 0.001 else f"p = {self.p_value:.3f}"
        items = "1 item" if self.items == 1 else f"{self.items} items"
        if self.direction == "indistinguishable":
            return f"not distinguishable from {other} (difference {_signed(self.difference)}, {ci}, {p}, {items})"
        return f"{self.direction} than {other} by {_signed(self.difference)} ({ci}, {p}, {items})"


def _examples(ids: set[str]) -> str:
    shown = sorted(ids)[:3]
    return f" (e.g. {', '.join(shown)}{', ...' if len(ids) > 3 else ''})" if ids else ""


def compare_paired(
    candidate: Mapping[str, float],
    baseline: Mapping[str, float],
    *,
    seed: int = 0,
    level: float = 0.95,
    resamples: int = 10_000,
    higher_is_better: bool = True,
) -> PairedComparison:
    """Compare per-item scores (item id -> score in [0, 1]) of a candidate and a baseline on the same items."""
    if candidate.keys() != baseline.keys():
        only_c, only_b = set(candidate) - set(baseline), set(baseline) - set(candidate)
        shared = len(set(candidate) & set(baseline))
        raise ItemsDiffer(
            "a paired comparison needs the same items (for example the same benchmark, split and version): "
            f"{shared} shared, {len(only_c)} only in the candidate{_examples(only_c)}, "
            f"{len(only_b)} only in the baseline{_examples(only_b)}"
        )
    ids = sorted(candidate)  # sorted, so neither the draws nor the result depend on dict order
    c = [float(candidate[i]) for i in ids]
    b = [float(baseline[i]) for i in ids]
    if not all(math.isfinite(x) for x in c + b):
        raise ValueError("per-item scores must be finite numbers")
    difference, low, high = paired_bootstrap(c, b, seed=seed, resamples=resamples, level=level)
    if all(x in (0.0, 1.0) for x in c + b):
        result = mcnemar_exact([x == 1.0 for x in c], [x == 1.0 for x in b])
        test: Literal["mcnemar", "permutation"] = "mcnemar"
        p, only_c_count, only_b_count = result.p_value, result.candidate_only, result.baseline_only
    else:
        test = "permutation"
        p, only_c_count, only_b_count = paired_permutation(c, b, seed=seed, resamples=resamples), None, None
    return PairedComparison(
        items=len(ids),
        candidate_mean=math.fsum(c) / len(ids),
        baseline_mean=math.fsum(b) / len(ids),
        difference=difference,
        ci_low=low,
        ci_high=high,
        level=level,
        p_value=p,
        test=test,
        candidate_only=only_c_count,
        baseline_only=only_b_count,
        seed=seed,
        resamples=resamples,
        higher_is_better=higher_is_better,
    )


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two closed intervals share a point, e.g. a leaderboard candidate's interval and the leader's."""
    return max(a[0], b[0]) <= min(a[1], b[1])
