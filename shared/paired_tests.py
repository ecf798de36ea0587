"""The paired tests and their intervals: McNemar's exact test and the weighted sign-flip test, each
with the interval that agrees with it (shared/statistics.py says which is used when).

- McNemar's exact test: items both models got right, or both got wrong, say nothing about which
  model is better; only the discordant items do, and under "no difference" each of them is equally
  likely to favour either side, so the count that favours the candidate is Binomial(discordant,
  1/2). Computed with exact integers. Its interval (``mcnemar_interval``) is built on the same
  binomial test, so it excludes 0 exactly when p < 1 - level.
- Otherwise, the betting test of the weighted mean difference and its confidence interval
  (``betting_interval``, Waudby-Smith and Ramdas 2023), valid for any bounded differences at any n;
  again 0 is inside the interval exactly when p >= 1 - level.

The betting test takes its items in an order seeded by ``seed``, so the same inputs and seed give the
same interval and p-value on every machine and every rerun.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import numpy as np

# Float64 elements per block of the betting test's grid of candidate means (about 48 MB).
_CHUNK_ELEMENTS = 6_000_000


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


# ---------------------------------------------------------------- the betting test and its interval

#: The level the bets are sized for, whatever level a comparison asks: so that one wealth gives one
#: p-value, and the interval at every level excludes 0 exactly when p is below it (a family's Holm
#: levels, a campaign's). Sized for another level, a bet is still a bet: only the power moves.
BET_LEVEL = 0.95
#: How far a bet may go: a share of what the wealth could lose on the worst outcome (Waudby-Smith and
#: Ramdas's c; 1/2 or 3/4 in their paper). Any c < 1 keeps the test valid; on the coverage grid 0.9 gave
#: intervals as narrow or narrower than 3/4 in every cell (tiny-arith's 10 + 6 items: 0.65 wide against
#: 0.73), and 12 clean wins of 16 p = 0.008 against 0.016.
BET_TRUNCATION = 0.9


def _betting_log_wealth(y: np.ndarray, bets: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The hedged capital's largest log wealth over the items of ``y`` (values in [0, 1]), for each
    candidate mean in ``m``: half the wealth bets for "the mean is above m", half for "below", with the
    predictable ``bets`` truncated so that no item can take more than BET_TRUNCATION of either half.
    By Ville's inequality, the chance that it ever reaches log(1 / alpha) at the true mean is at most
    alpha, so the largest over the items may be compared with it."""
    import numpy as np

    m = m[:, None]
    up = np.minimum(bets[None, :], BET_TRUNCATION / np.maximum(m, 1e-300))
    down = np.minimum(bets[None, :], BET_TRUNCATION / np.maximum(1.0 - m, 1e-300))
    log_up = np.cumsum(np.log1p(up * (y[None, :] - m)), axis=1)
    log_down = np.cumsum(np.log1p(-down * (y[None, :] - m)), axis=1)
    return (np.logaddexp(log_up, log_down) - math.log(2.0)).max(axis=1)


def _betting_sequence(diffs: Sequence[float], weights: Sequence[float], *, seed: int,
                      ) -> tuple[float, float, np.ndarray, np.ndarray]:
    """The betting test's inputs: the weighted mean difference, the reach n max(w) of an item, the
    items as values in [0, 1] in their seeded order, and the predictable bets tuned for n items."""
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    n = d.size
    reach = float(n * w.max())  # |x_i| <= n w_i |d_i| <= reach
    y = (n * w * d + reach) / (2.0 * reach)
    y = y[np.random.default_rng(seed).permutation(n)]
    steps = np.arange(1, n + 1)
    running_mean = (0.5 + np.cumsum(y)) / (steps + 1)
    running_var = (0.25 + np.cumsum((y - running_mean) ** 2)) / (steps + 1)
    bets = np.sqrt(2.0 * math.log(2.0 / (1.0 - BET_LEVEL)) / (n * np.concatenate([[0.25], running_var[:-1]])))
    return float(w @ d), reach, y, bets


def betting_p(diffs: Sequence[float], weights: Sequence[float], *, seed: int) -> float:
    """The betting test's p-value of "the weighted mean difference is 0" alone (``betting_interval``'s
    second value, without the interval's search): 1 / the largest wealth at 0."""
    import numpy as np

    _, _, y, bets = _betting_sequence(diffs, weights, seed=seed)
    return min(1.0, math.exp(-float(_betting_log_wealth(y, bets, np.array([0.5]))[0])))


def betting_interval(
    diffs: Sequence[float], weights: Sequence[float], *, seed: int, level: float = 0.95
) -> tuple[float, float, float, float]:
    """The weighted mean difference D = sum w_i d_i (d_i in [-1, 1]), the p-value of D = 0, and the
    confidence interval of D, from one betting test (Waudby-Smith and Ramdas 2023, "Estimating means of
    bounded random variables by betting", the hedged capital process with predictable plug-in bets
    tuned for n items, sized for BET_LEVEL). Valid at every n for any distribution of the differences:
    unlike a sign-flip test, it needs no symmetry, which one-sided wins, skewed graded scores and small
    subsets lack.

    Each item becomes x_i = n w_i d_i, whose mean is D (an item of a small subset carries more of it),
    bounded by n max(w); taken in an order seeded by ``seed``, the x_i are a sample of one bounded
    variable with mean D (the subsets' sizes fixed, as they are, only narrow the spread). A candidate
    mean m is rejected when the wealth of betting against it reaches 1 / (1 - level) (Ville's
    inequality); the interval is every m not rejected, and p = min(1, 1 / wealth at m = 0), so 0 lies
    in the interval exactly when p >= 1 - level."""
    import numpy as np

    alpha = 1.0 - level
    observed, reach, y, bets = _betting_sequence(diffs, weights, seed=seed)
    n = y.size
    threshold = math.log(1.0 / alpha)
    zero = 0.5  # y of D = 0
    p = min(1.0, math.exp(-float(_betting_log_wealth(y, bets, np.array([zero]))[0])))

    def rejected(m: float) -> bool:
        return bool(_betting_log_wealth(y, bets, np.array([m]))[0] >= threshold)

    # The wealth is smallest near the mean; the accepted means are an interval around it (each item's
    # is, Waudby-Smith and Ramdas's Proposition 4, and so their intersection), found by bisection.
    step = max(1, _CHUNK_ELEMENTS // (6 * n))
    grid = np.linspace(0.0, 1.0, 257)[1:-1]
    wealth = np.concatenate([_betting_log_wealth(y, bets, grid[i:i + step]) for i in range(0, grid.size, step)])
    inside = float(grid[int(np.argmin(wealth))])
    if rejected(inside):  # nothing accepted on the grid: the interval is narrower than its spacing
        inside = float(y.mean())

    def edge(outside: float) -> float:
        lo, hi = inside, outside  # accepted at lo, rejected at (or beyond) hi
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if rejected(mid) else (mid, hi)
        return lo

    def to_d(m: float) -> float:
        return m * 2.0 * reach - reach

    low, high = to_d(edge(0.0)), to_d(edge(1.0))
    low, high = max(-1.0, min(low, observed)), min(1.0, max(high, observed))
    # The interval and the p-value come from the same wealth; rounding at the boundary must not split them.
    if p >= alpha:
        low, high = _holding_zero(low, high)
    elif low > 0.0 or high < 0.0:
        pass
    elif observed > 0:
        low = math.nextafter(0.0, 1.0)
    else:
        high = math.nextafter(0.0, -1.0)
    return observed, p, low, high
