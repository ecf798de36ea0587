"""Telling progress from noise when two models are scored on the same benchmark items.

The design is paired: the candidate and the baseline answer the very same items, so each item's own
difficulty cancels out of the per-item difference, and the comparison is far sharper than comparing two
independent accuracies with overlapping error bars.

What is compared (docs/benchmarks.md, "One estimand"): the headline's own quantity. A benchmark's
``primary_value`` is the mean of its subsets' means, so the paired difference weighs every subset the
same (``stratum_weights``), and the test and the interval are of that weighted difference; with one
subset, or subsets of one size, that is the plain mean over items.

Which test and interval are used when:

- Every item weighs the same and scored exactly 0 or 1 on both sides (one run per item): McNemar's
  exact test. Items both models got right, or both got wrong, say nothing about which model is better;
  only the discordant items do, and under "no difference" each of them is equally likely to favour
  either side, so the count that favours the candidate is Binomial(discordant, 1/2). Computed with exact
  integers. The interval (``mcnemar_interval``) is built on the same binomial test, so it excludes 0
  exactly when p < 1 - level.
- Otherwise (graded scores: a mean over repeated runs, partial credit; or subsets of different sizes): a
  sign-flip permutation test of the weighted mean difference, exact when there are few items or few
  non-zero differences, Monte Carlo otherwise; its interval is that test inverted (``sign_flip_inverted``),
  so again 0 is inside it exactly when p >= 1 - level.
- Fewer than MIN_ITEMS items: the numbers are given, but the words say "too few items to say", and the
  comparison never counts as beyond noise.
- Every comparison states the smallest improvement it could detect at 80% power with its items and the
  share of them on which the two differ (``detectable_difference``, ``detectable_normal``).

Everything random takes a seed and uses numpy's default_rng, so the same inputs and seed give the
same interval and p-value on every machine and every rerun.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from statistics import NormalDist
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


def mean_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and its standard error (sample standard deviation over sqrt(n)).

    The error of one value is None: a single item says nothing about the spread, and 0.0 would read as
    a certainty."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_stderr needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
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


# ---------------------------------------------------------------- the estimand and its weights

#: Fewer items than this and a comparison says "too few items to say" instead of a verdict.
MIN_ITEMS = 10
#: The lowest confidence level a comparison may be made at: below it noise passes for an improvement
#: (at 0.5, 3 better items of 40, p = 0.25, would be "better beyond noise").
LEVEL_FLOOR = 0.9


def check_level(level: float, name: str = "level") -> float:
    """``level`` if it is a confidence level in [LEVEL_FLOOR, 1); a ValueError saying why otherwise."""
    if not (isinstance(level, int | float) and math.isfinite(level)) or not 0.0 < level < 1.0:
        raise ValueError(f"{name} {level!r} is not a confidence level: a number below 1, at least {LEVEL_FLOOR}, "
                         "e.g. 0.95")
    if level < LEVEL_FLOOR:
        raise ValueError(f"{name} {level:g} is below the floor of {LEVEL_FLOOR}: at such a level noise passes for "
                         f"an improvement (at 0.5, 3 better items of 40, p = 0.25, would be called better); use "
                         f"{LEVEL_FLOOR} or more, e.g. 0.95")
    return float(level)
#: The power the detectable difference is stated at.
POWER = 0.8


def stratum_weights(strata: Sequence[str]) -> list[float]:
    """Each item's weight in the estimand: every stratum (a benchmark's subset) weighs the same, and
    within one every item does, so item i of a stratum of n_s items weighs 1 / (S * n_s).

    That is the headline's own weighting (``primary_value`` is the mean of the subsets' means), so
    the headline difference, the test and the interval are about one quantity. One stratum, or
    strata of one size, give every item the same weight: the mean over items."""
    sizes = Counter(strata)
    return [1.0 / (len(sizes) * sizes[s]) for s in strata]


def _equal(weights: Sequence[float]) -> bool:
    return max(weights) - min(weights) <= 1e-12 * max(weights)


# ---------------------------------------------------------------- exact binomial pieces


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def _upper_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), in floats (for the interval's and the power's bisections)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0 or p >= 1.0:
        return float(p >= 1.0)
    # One log-pmf, then the ratio pmf(i + 1) / pmf(i) = (n - i) / (i + 1) * p / (1 - p): a term per step.
    term = math.exp(_log_pmf(k, n, p))
    ratio = p / (1.0 - p)
    total = term
    for i in range(k, n):
        term *= (n - i) / (i + 1) * ratio
        total += term
    return min(1.0, total)


def _bisect(f: Callable[[float], bool], lo: float, hi: float) -> float:
    """The boundary in [lo, hi] where a monotone condition turns from false (at lo) to true (at hi), to 1e-13."""
    while hi - lo > 1e-13:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if f(mid) else (mid, hi)
    return hi


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """The exact interval of a binomial proportion from k of n: two one-sided tests at (1 - level) / 2."""
    if n == 0:
        return 0.0, 1.0
    half = (1.0 - level) / 2
    low = 0.0 if k == 0 else _bisect(lambda p: _upper_tail(k, n, p) > half, 0.0, 1.0)
    high = 1.0 if k == n else 1.0 - _bisect(lambda p: _upper_tail(n - k, n, p) > half, 0.0, 1.0)
    return low, high


def _mcnemar_p(b: int, c: int) -> float:
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def mcnemar_interval(b: int, c: int, n: int, level: float) -> tuple[float, float]:
    """An interval of the paired difference of two proportions that agrees with McNemar's exact test.

    The difference is psi * (2 pi - 1): psi the share of items the two disagree on, pi the share of
    those the candidate wins. pi's interval is Clopper-Pearson's at ``level``, the inversion of the very
    binomial test McNemar's is (twice the smaller tail < 1 - level iff that interval excludes 1/2), so
    the interval excludes 0 exactly when p < 1 - level, whatever n. psi's is Clopper-Pearson's at
    1 - (1 - level) / 10, so that both hold with probability at least level - (1 - level) / 10 (0.945
    at 95%; the exact intervals' own slack brings it back above 0.95). With no disagreement at all it
    is +-psi's upper bound: 0 of 200 disagreeing still leaves +-0.026, not a zero-width certainty."""
    m = b + c
    pi_low, pi_high = clopper_pearson(b, m, level)
    p = _mcnemar_p(b, c)
    # The bisection's last bit must not contradict the exact p-value at the boundary.
    if p < 1.0 - level:
        if b > c:
            pi_low = max(pi_low, math.nextafter(0.5, 1.0))
        else:
            pi_high = min(pi_high, math.nextafter(0.5, 0.0))
    else:
        pi_low, pi_high = min(pi_low, 0.5), max(pi_high, 0.5)
    psi_low, psi_high = clopper_pearson(m, n, 1.0 - (1.0 - level) / 10)
    low = (2 * pi_low - 1) * (psi_high if pi_low < 0.5 else psi_low)
    high = (2 * pi_high - 1) * (psi_high if pi_high > 0.5 else psi_low)
    return _holding_zero(low, high) if p >= 1.0 - level else (low, high)


def _holding_zero(low: float, high: float) -> tuple[float, float]:
    """An interval that holds 0, with an end within rounding of 0 made 0 itself: never "-0.0000 to ..."."""
    low, high = min(low, 0.0), max(high, 0.0)
    return (0.0 if low > -1e-12 else low), (0.0 if high < 1e-12 else high)


# ---------------------------------------------------------------- the weighted sign-flip test, inverted


def _sign_rows(n: int, nonzero: np.ndarray, rng: np.random.Generator, resamples: int,
               ) -> tuple[Callable[[int, int], np.ndarray], int, bool]:
    """The sign patterns of the sign-flip test: a function giving rows [start, stop) as a +-1 matrix,
    the number of rows, and whether they are an exact enumeration (p = hits / rows) or random draws
    (p = (hits + 1) / (rows + 1)).

    All 2**n patterns when n <= 16; when only m <= 16 differences are non-zero, all 2**m patterns of
    those, each repeated with random signs for the zero ones (which move nothing at a shift of 0, so
    the p-value there is the exact one); otherwise ``resamples`` random patterns."""
    import numpy as np

    m = int(nonzero.sum())
    if n <= _EXACT_MAX:
        def exact(start: int, stop: int) -> np.ndarray:
            return (1 - 2 * ((np.arange(start, stop)[:, None] >> np.arange(n)) & 1)).astype(np.float64)
        return exact, 2**n, True
    if m <= _EXACT_MAX:
        repeat = max(1, -(-resamples // 2**m))
        cols = np.flatnonzero(nonzero)
        # Drawn once, in full: the rows must not depend on how they are chunked.
        zero_signs = 1 - 2 * rng.integers(0, 2, size=(2**m * repeat, n), dtype=np.int8)

        def enumerated(start: int, stop: int) -> np.ndarray:
            rows = zero_signs[start:stop].astype(np.float64)
            pattern = np.arange(start, stop) // repeat
            rows[:, cols] = 1 - 2 * ((pattern[:, None] >> np.arange(m)) & 1)
            return rows
        return enumerated, 2**m * repeat, True
    drawn = 1 - 2 * rng.integers(0, 2, size=(resamples, n), dtype=np.int8)
    return (lambda start, stop: drawn[start:stop].astype(np.float64)), resamples, False


def sign_flip_inverted(
    diffs: Sequence[float], weights: Sequence[float], *, seed: int, resamples: int = 10_000, level: float = 0.95
) -> tuple[float, float, float, float]:
    """The weighted mean difference D = sum w_i d_i, the two-sided sign-flip p-value of D = 0, and the
    interval that inverts that same test: every shift delta at which the differences d_i - delta pass it.

    With one set of sign patterns eps_j, the statistic at a shift is A_j - delta * B_j (A_j = sum w eps d,
    B_j = sum w eps, weights summing to 1) against the observed D - delta; pattern j counts as extreme on
    an interval of delta that holds D, so the accepted shifts are an interval, its ends order statistics
    of those intervals' ends, and 0 lies in it exactly when p >= 1 - level (checked, so that a rounding
    at a tie cannot contradict it). The items' scores are in [0, 1], so the interval is clipped to [-1, 1].
    """
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    n = d.size
    alpha = 1.0 - level
    observed = float(w @ d)
    nonzero = d != 0.0
    if not nonzero.any():
        # Nothing differs: no pattern can say anything about the spread, so bound it instead. |d_i| <= 1, so a
        # stratum's difference is at most the share of its items that differ, 0 of n_s seen (exact upper bound).
        bound = 0.0
        for weight_sum, size in _strata_of(w):
            bound += weight_sum * (1.0 - (alpha / 2) ** (1.0 / size))
        return 0.0, 1.0, -bound, bound
    rng = np.random.default_rng(seed)
    rows_of, total, exact = _sign_rows(n, nonzero, rng, resamples)
    a_all, b_all = np.empty(total), np.empty(total)
    step = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, total, step):
        stop = min(start + step, total)
        rows = rows_of(start, stop)
        a_all[start:stop], b_all[start:stop] = rows @ (w * d), rows @ w
    hits = int(np.count_nonzero(np.abs(a_all) >= abs(observed) - _TIE_TOLERANCE))
    p = hits / total if exact else (hits + 1) / (total + 1)
    # Extreme at delta iff (A - delta B)^2 >= (D - delta)^2: a quadratic with leading coefficient B^2 - 1 <= 0.
    qa = b_all**2 - 1.0
    qb = 2.0 * (observed - a_all * b_all)
    qc = a_all**2 - observed**2
    everywhere = np.abs(qa) < 1e-12  # all signs alike: A = +-D, always as extreme as the observed
    qa_safe = np.where(everywhere, -1.0, qa)
    root = np.sqrt(np.maximum(qb**2 - 4.0 * qa_safe * qc, 0.0))
    r_low = np.where(everywhere, -np.inf, (-qb + root) / (2.0 * qa_safe))
    r_high = np.where(everywhere, np.inf, (-qb - root) / (2.0 * qa_safe))
    # Accepted where at least `need` patterns are extreme (the observed pattern itself counts when drawn).
    need = math.ceil(alpha * total - 1e-9) if exact else math.ceil(alpha * (total + 1) - 1e-9) - 1
    if need <= 0:
        low, high = -1.0, 1.0
    else:
        low = float(np.sort(r_low)[need - 1])
        high = float(-np.sort(-r_high)[need - 1])
    low, high = max(-1.0, min(low, observed)), min(1.0, max(high, observed))
    if p >= alpha:
        low, high = _holding_zero(low, high)
    elif observed > 0:
        low = max(low, math.nextafter(0.0, 1.0))
    else:
        high = min(high, math.nextafter(0.0, -1.0))
    return observed, p, low, high


def _strata_of(w: np.ndarray) -> list[tuple[float, int]]:
    """(total weight, items) of each group of equal weights: a stratum's items share one weight."""
    groups: Counter[float] = Counter(round(float(x), 15) for x in w)
    return [(weight * count, count) for weight, count in groups.items()]


# ---------------------------------------------------------------- power


def detectable_difference(items: int, disagreement: float, *, level: float = 0.95, power: float = POWER,
                          ) -> float | None:
    """The smallest improvement McNemar's exact test at ``level`` finds with probability ``power``, with
    ``items`` items of which a share ``disagreement`` differ between the two models; None when none is
    (too few disagreements for any split of them to reach p < 1 - level).

    The disagreements m = round(items * disagreement) are taken as given (as observed); the candidate wins
    each with probability pi, so the difference is (m / items) * (2 pi - 1), and the power at pi is
    P(Binomial(m, pi) lands where McNemar's p < 1 - level), exact."""
    if items < 1:
        raise ValueError(f"detectable_difference needs at least one item, got {items}")
    if not 0.0 <= disagreement <= 1.0:
        raise ValueError(f"disagreement must be a share in [0, 1], got {disagreement}")
    m = round(items * disagreement)
    alpha = 1.0 - level
    # The fewest wins of m that reject: the rejection region is {b >= k} and its mirror {b <= m - k}.
    k = next((b for b in range(m // 2, m + 1) if b > m - b and _mcnemar_p(b, m - b) < alpha), None)
    if k is None:
        return None

    def reaches(pi: float) -> bool:
        return _upper_tail(k, m, pi) + _upper_tail(k, m, 1.0 - pi) >= power  # the mirror {b <= m - k}

    if not reaches(1.0):
        return None
    pi = _bisect(reaches, 0.5, 1.0)
    return (m / items) * (2 * pi - 1)


def effective_items(subset_sizes: Sequence[int]) -> int:
    """How many equally weighted items the estimand's weights are worth (Kish's 1 / sum w_i^2): with S
    subsets of n_s items each weighing 1 / S, that is S^2 / sum(1 / n_s); equal subsets give their total."""
    sizes = [n for n in subset_sizes if n > 0]
    if not sizes:
        return 0
    return max(1, round(len(sizes) ** 2 / math.fsum(1.0 / n for n in sizes)))


def score_interval(mean: float, items: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a score in [0, 1] averaged over ``items`` items: never a point, and
    inside [0, 1]. For items right or wrong it is Wilson's; for graded items it is conservative, the
    variance of a value in [0, 1] with mean p being at most p (1 - p)."""
    if items < 1:
        raise ValueError(f"score_interval needs at least one item, got {items}")
    z = NormalDist().inv_cdf(1.0 - (1.0 - level) / 2)
    p = min(1.0, max(0.0, mean))
    shrink = 1.0 + z * z / items
    centre = (p + z * z / (2 * items)) / shrink
    half = z * math.sqrt(p * (1.0 - p) / items + z * z / (4 * items * items)) / shrink
    return max(0.0, centre - half), min(1.0, centre + half)


#: The shares of differing items ``benchmarks ls`` states the detectable improvement for.
DISAGREEMENTS = (0.1, 0.2, 0.3)


def detectable_for_sizes(subset_sizes: Sequence[int], disagreement: float, *, level: float = 0.95,
                         power: float = POWER) -> float | None:
    """The smallest improvement a comparison on subsets of these sizes finds at ``power``, when a share
    ``disagreement`` of the items differ: McNemar's exact power (:func:`detectable_difference`) on the
    estimand's effective number of items (exact for subsets of one size; the weighted test's
    approximation otherwise). None: none is detectable."""
    items = effective_items(subset_sizes)
    return detectable_difference(items, disagreement, level=level, power=power) if items else None


def detectable_normal(diffs: Sequence[float], weights: Sequence[float], *, level: float = 0.95,
                      power: float = POWER) -> float | None:
    """The smallest weighted mean difference a two-sided test at ``level`` finds with probability
    ``power``, by the normal approximation of the sign-flip statistic: (z_{1-a/2} + z_power) times its
    standard deviation, sqrt(sum w_i^2 d_i^2), from the observed differences; None when nothing differs."""
    spread = math.sqrt(math.fsum((w * x) ** 2 for w, x in zip(weights, diffs, strict=True)))
    if spread == 0.0:
        return None
    z = NormalDist()
    return (z.inv_cdf(1.0 - (1.0 - level) / 2) + z.inv_cdf(power)) * spread / math.fsum(weights)


def _signed(x: float) -> str:
    text = f"{x:+.2f}"
    return "+0.00" if text == "-0.00" else text  # a difference that rounds to zero has no sign


class PairedComparison(BaseModel):
    """A candidate against a baseline on the same items: the difference, its interval and the test's p-value.

    The difference is the estimand the headline reports (``weighting``): with ``subsets`` subsets of unequal
    size, the mean over subsets of each subset's mean difference; otherwise the mean over items."""

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
    #: "items": every item weighs the same; "subsets": every subset weighs the same (``primary_value``'s
    #: mean of the subsets' means), the items of a subset equally within it.
    weighting: Literal["items", "subsets"] = "items"
    #: How many subsets (strata) the items fall in.
    subsets: int = 1
    #: How the interval was made: "mcnemar" (exact, agreeing with McNemar's test), "inversion" (the
    #: sign-flip test inverted), "bootstrap" (the percentile bootstrap of verdicts before these).
    interval: Literal["mcnemar", "inversion", "bootstrap"] = "bootstrap"
    #: The share of items on which the two differ at all.
    disagreement: float | None = None
    #: The smallest improvement this comparison finds at 80% power with its items and disagreement;
    #: None when none is detectable (or, in an old verdict, not computed).
    detectable: float | None = None

    @property
    def too_few(self) -> bool:
        """Fewer than MIN_ITEMS items: too few to say anything either way."""
        return self.items < MIN_ITEMS

    def beyond_noise(self, level: float | None = None) -> bool:
        """Whether the interval excludes 0 and the p-value is below 1 - level (never with too few items).

        The interval was computed at self.level; asking another level changes only the p-value threshold.
        """
        level = self.level if level is None else level
        excludes_zero = self.ci_low > 0.0 or self.ci_high < 0.0
        return excludes_zero and self.p_value < 1.0 - level and not self.too_few

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
        if self.too_few:
            return (f"too few items to say against {other} ({items}, fewer than {MIN_ITEMS}: difference "
                    f"{_signed(self.difference)}, {ci}, {p})")
        if self.direction == "indistinguishable":
            return f"not distinguishable from {other} (difference {_signed(self.difference)}, {ci}, {p}, {items})"
        return f"{self.direction} than {other} by {_signed(self.difference)} ({ci}, {p}, {items})"

    @property
    def method(self) -> str:
        """How the p-value and the interval were computed, in words (a verdict's details line)."""
        weighing = f", each of the {self.subsets} subsets weighing the same" if self.weighting == "subsets" else ""
        if self.test == "mcnemar":
            test = "McNemar's exact test"
        else:
            test = f"a paired sign-flip permutation test{weighing}"
        if self.interval == "mcnemar":
            return f"{test}, with the exact interval built on the same binomial test"
        if self.interval == "inversion":
            return f"{test}, with the interval that inverts it (seed {self.seed})"
        return f"{test}; percentile bootstrap interval of {self.resamples} resamples, seed {self.seed}"

    def describe_power(self) -> str | None:
        """What this comparison could have found, in words; None for an old verdict without it."""
        if self.disagreement is None:
            return None
        share = f"{self.disagreement * 100:.0f}% of them differing"
        if self.detectable is None:
            return (f"with {self.items} items and {share}, no improvement is detectable at "
                    f"{POWER * 100:.0f}% power")
        return (f"with {self.items} items and {share}, the smallest improvement detectable at "
                f"{POWER * 100:.0f}% power is {self.detectable:+.2f}")


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
    strata: Mapping[str, str] | None = None,
) -> PairedComparison:
    """Compare per-item scores (item id -> score in [0, 1]) of a candidate and a baseline on the same items.

    ``strata`` (item id -> subset) weighs every subset the same (``stratum_weights``); without it every item
    weighs the same. Equal weights and outcomes all 0 or 1: McNemar's exact test and its interval
    (``mcnemar_interval``); otherwise the weighted sign-flip test and its inversion (``sign_flip_inverted``)."""
    check_level(level)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if candidate.keys() != baseline.keys():
        only_c, only_b = set(candidate) - set(baseline), set(baseline) - set(candidate)
        shared = len(set(candidate) & set(baseline))
        raise ItemsDiffer(
            "a paired comparison needs the same items (for example the same benchmark, split and version): "
            f"{shared} shared, {len(only_c)} only in the candidate{_examples(only_c)}, "
            f"{len(only_b)} only in the baseline{_examples(only_b)}"
        )
    if not candidate:
        raise ValueError("a paired comparison needs at least one item")
    ids = sorted(candidate)  # sorted, so neither the draws nor the result depend on dict order
    c = [float(candidate[i]) for i in ids]
    b = [float(baseline[i]) for i in ids]
    if not all(math.isfinite(x) for x in c + b):
        raise ValueError("per-item scores must be finite numbers")
    groups = [strata[i] for i in ids] if strata is not None else ["" for _ in ids]
    weights = stratum_weights(groups)
    diffs = [x - y for x, y in zip(c, b, strict=True)]
    n = len(ids)
    disagreement = sum(1 for x in diffs if x != 0.0) / n
    binary = all(x in (0.0, 1.0) for x in c + b)
    if binary and _equal(weights):
        result = mcnemar_exact([x == 1.0 for x in c], [x == 1.0 for x in b])
        test: Literal["mcnemar", "permutation"] = "mcnemar"
        p, only_c_count, only_b_count = result.p_value, result.candidate_only, result.baseline_only
        difference = math.fsum(diffs) / n
        low, high = mcnemar_interval(only_c_count, only_b_count, n, level)
        interval: Literal["mcnemar", "inversion"] = "mcnemar"
        detectable = detectable_difference(n, disagreement, level=level)
    else:
        test, interval, only_c_count, only_b_count = "permutation", "inversion", None, None
        difference, p, low, high = sign_flip_inverted(diffs, weights, seed=seed, resamples=resamples, level=level)
        detectable = detectable_normal(diffs, weights, level=level)
    return PairedComparison(
        items=n,
        candidate_mean=math.fsum(w * x for w, x in zip(weights, c, strict=True)),
        baseline_mean=math.fsum(w * x for w, x in zip(weights, b, strict=True)),
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
        weighting="items" if _equal(weights) else "subsets",
        subsets=len(set(groups)),
        interval=interval,
        disagreement=disagreement,
        detectable=detectable,
    )


def holm(p_values: Sequence[float], alpha: float = 0.05) -> tuple[list[bool], list[float]]:
    """Holm's step-down correction of several tests: which are rejected at family-wise level ``alpha``,
    and the level each was tested at (alpha / (k - i) for the i-th smallest p, and for those after the
    first that stands, that one's level: no later one is rejected either)."""
    k = len(p_values)
    order = sorted(range(k), key=lambda i: p_values[i])
    rejected, levels = [False] * k, [alpha] * k
    stopped: float | None = None
    for step, i in enumerate(order):
        threshold = alpha / (k - step) if stopped is None else stopped
        levels[i] = threshold
        if stopped is None and p_values[i] < threshold:
            rejected[i] = True
        elif stopped is None:
            stopped = threshold
    return rejected, levels
