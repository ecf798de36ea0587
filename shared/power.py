"""What a paired comparison could detect: the smallest improvement found at 80% power with its
items and the share of them on which the two models differ (McNemar's exact power, or the normal
approximation of the sign-flip statistic), and the estimand's effective number of items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from shared.paired_tests import bisect, mcnemar_p, upper_tail

#: The power the detectable difference is stated at.
POWER = 0.8
#: The shares of differing items ``benchmarks ls`` states the detectable improvement for.
DISAGREEMENTS = (0.1, 0.2, 0.3)


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
    k = next((b for b in range(m // 2, m + 1) if b > m - b and mcnemar_p(b, m - b) < alpha), None)
    if k is None:
        return None

    def reaches(pi: float) -> bool:
        return upper_tail(k, m, pi) + upper_tail(k, m, 1.0 - pi) >= power  # the mirror {b <= m - k}

    if not reaches(1.0):
        return None
    pi = bisect(reaches, 0.5, 1.0)
    return (m / items) * (2 * pi - 1)


def effective_items(subset_sizes: Sequence[int]) -> int:
    """How many equally weighted items the estimand's weights are worth (Kish's 1 / sum w_i^2): with S
    subsets of n_s items each weighing 1 / S, that is S^2 / sum(1 / n_s); equal subsets give their total."""
    sizes = [n for n in subset_sizes if n > 0]
    if not sizes:
        return 0
    return max(1, round(len(sizes) ** 2 / math.fsum(1.0 / n for n in sizes)))


def detectable_for_sizes(subset_sizes: Sequence[int], disagreement: float, *, level: float = 0.95,
                         power: float = POWER) -> float | None:
    """The smallest improvement a comparison on subsets of these sizes finds at ``power``, when a share
    ``disagreement`` of the items differ: McNemar's exact power (:func:`detectable_difference`) on the
    estimand's effective number of items (exact for subsets of one size; the weighted test's
    approximation otherwise). None: none is detectable."""
    items = effective_items(subset_sizes)
    return detectable_difference(items, disagreement, level=level, power=power) if items else None


def detectable_betting(diffs: Sequence[float], weights: Sequence[float], low: float, high: float, *,
                       power: float = POWER) -> float | None:
    """The smallest weighted mean difference the betting test finds with probability ``power``, near
    enough: its interval's half-width (what a difference must pass to exclude 0) plus z_power standard
    errors of the weighted mean, sqrt(sum w_i^2 (d_i - D)^2), from the observed differences; None when
    nothing differs."""
    total = math.fsum(weights)
    mean = math.fsum(w * x for w, x in zip(weights, diffs, strict=True)) / total
    spread = math.sqrt(math.fsum((w * (x - mean)) ** 2 for w, x in zip(weights, diffs, strict=True))) / total
    if not any(diffs):
        return None
    return (high - low) / 2 + NormalDist().inv_cdf(power) * spread
