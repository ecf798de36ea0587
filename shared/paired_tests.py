"""The paired tests and their intervals: McNemar's exact test and the weighted sign-flip test, each
with the interval that agrees with it (shared/statistics.py says which is used when).

- McNemar's exact test: items both models got right, or both got wrong, say nothing about which
  model is better; only the discordant items do, and under "no difference" each of them is equally
  likely to favour either side, so the count that favours the candidate is Binomial(discordant,
  1/2). Computed with exact integers. Its interval (``mcnemar_interval``) is built on the same
  binomial test, so it excludes 0 exactly when p < 1 - level.
- The sign-flip permutation test of the weighted mean difference, exact when there are few items or
  few non-zero differences, Monte Carlo otherwise; its interval is that test inverted
  (``sign_flip_inverted``), so again 0 is inside it exactly when p >= 1 - level.

Everything random takes a seed and uses numpy's default_rng, so the same inputs and seed give the
same interval and p-value on every machine and every rerun.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import numpy as np

# Elements per resampling chunk: an int64 index and the float64 it gathers are 16 bytes, so about 96 MB.
_CHUNK_ELEMENTS = 6_000_000
# Up to this many non-zero differences the sign-flip test enumerates all 2**m assignments (65,536).
_EXACT_MAX = 16
# Slack for float rounding when a flipped mean equals the observed one in exact arithmetic.
_TIE_TOLERANCE = 1e-12


class McNemar(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_only: int  # items the candidate got right and the baseline wrong
    baseline_only: int  # items the baseline got right and the candidate wrong
    p_value: float


def mcnemar_exact(candidate: Sequence[bool], baseline: Sequence[bool]) -> McNemar:
    """McNemar's exact two-sided test: a binomial test of the discordant items at p = 1/2."""
    if len(candidate) != len(baseline):
        raise ValueError(f"paired inputs differ in length: {len(candidate)} candidate, {len(baseline)} baseline")
    b = sum(1 for x, y in zip(candidate, baseline, strict=True) if x and not y)
    c = sum(1 for x, y in zip(candidate, baseline, strict=True) if y and not x)
    return McNemar(candidate_only=b, baseline_only=c, p_value=mcnemar_p(b, c))


# ---------------------------------------------------------------- exact binomial pieces


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def upper_tail(k: int, n: int, p: float) -> float:
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


def bisect(f: Callable[[float], bool], lo: float, hi: float) -> float:
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
    low = 0.0 if k == 0 else bisect(lambda p: upper_tail(k, n, p) > half, 0.0, 1.0)
    high = 1.0 if k == n else 1.0 - bisect(lambda p: upper_tail(n - k, n, p) > half, 0.0, 1.0)
    return low, high


def mcnemar_p(b: int, c: int) -> float:
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
    p = mcnemar_p(b, c)
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
