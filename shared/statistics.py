"""Telling progress from noise when two models are scored on the same benchmark items, and the
summaries of one model's scores.

The design is paired: the candidate and the baseline answer the very same items, so each item's own
difficulty cancels out of the per-item difference, and the comparison is far sharper than comparing two
independent accuracies with overlapping error bars.

What is compared (docs/benchmarks.md, "One estimand"): the headline's own quantity. A benchmark's
``primary_value`` is the mean of its subsets' means, so the paired difference weighs every subset the
same (``stratum_weights``), and the test and the interval are of that weighted difference; with one
subset, or subsets of one size, that is the plain mean over items.

Which test and interval are used when (shared/paired_tests.py):

- Every item weighs the same and scored exactly 0 or 1 on both sides (one run per item): McNemar's
  exact test, and the exact interval built on the same binomial test.
- Otherwise (graded scores: a mean over repeated runs, partial credit; or subsets of different sizes): the
  betting test of the weighted mean difference and its confidence interval (Waudby-Smith and Ramdas),
  valid for any bounded differences at every n.
- Fewer than MIN_ITEMS items: the numbers are given, but the words say "too few items to say", and the
  comparison never counts as beyond noise.
- Every comparison states the smallest improvement it could detect at 80% power with its items and the
  share of them on which the two differ (shared/power.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared.paired_tests import betting_interval, betting_p, mcnemar_exact, mcnemar_interval
from shared.power import POWER, detectable_betting, detectable_difference


class ItemsDiffer(ValueError):
    """The two sides were scored on different items, so there is nothing to pair."""


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


def stratum_weights(strata: Sequence[str]) -> list[float]:
    """Each item's weight in the estimand: every stratum (a benchmark's subset) weighs the same, and
    within one every item does, so item i of a stratum of n_s items weighs 1 / (S * n_s).

    That is the headline's own weighting (``primary_value`` is the mean of the subsets' means), so
    the headline difference, the test and the interval are about one quantity. One stratum, or
    strata of one size, give every item the same weight: the mean over items."""
    sizes = Counter(strata)
    return [1.0 / (len(sizes) * sizes[s]) for s in strata]


def equal_weights(weights: Sequence[float]) -> bool:
    """Whether every item weighs the same (to rounding): one subset, or subsets of one size."""
    return max(weights) - min(weights) <= 1e-12 * max(weights)


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


def percent(level: float) -> str:
    """A confidence level as a percentage, to the digits that tell it from 100%: 0.95 -> "95%",
    0.9962 -> "99.62%" (never "100%" for a level below 1)."""
    digits = max(0, math.ceil(-math.log10(max(1.0 - level, 1e-15))))
    text = f"{level * 100:.{digits}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"


def p_text(p: float) -> str:
    """A p-value or a threshold to two significant digits (0.012, 0.00023, 9.7e-05): never rounded to a
    "p < 0.001" that may lie on either side of the threshold it is compared with."""
    if p >= 0.001:
        return f"{p:.2g}" if p < 0.1 else f"{p:.3f}".rstrip("0").rstrip(".") or "0"
    return f"{p:.2g}"


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
    #: "permutation" (the sign-flip test) only in verdicts from before the betting test.
    test: Literal["mcnemar", "betting", "permutation"]
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
    #: How the interval was made: "mcnemar" (exact, agreeing with McNemar's test), "betting" (the betting
    #: test's confidence interval); in older verdicts "inversion" (the sign-flip test inverted) and
    #: "bootstrap" (a percentile bootstrap).
    interval: Literal["mcnemar", "betting", "inversion", "bootstrap"] = "bootstrap"
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
        ci = f"{percent(self.level)} CI {_signed(self.ci_low)} to {_signed(self.ci_high)}"
        p = f"two-sided p = {p_text(self.p_value)}, threshold {p_text(1.0 - self.level)}"
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
        elif self.test == "betting":
            test = f"a betting test of the mean difference{weighing}"
        else:
            test = f"a paired sign-flip permutation test{weighing}"
        if self.interval == "mcnemar":
            return f"{test}, with the exact interval built on the same binomial test"
        if self.interval == "betting":
            return f"{test}, with its confidence interval (items taken in an order of seed {self.seed})"
        if self.interval == "inversion":
            return f"{test}, with the interval that inverts it (seed {self.seed})"
        return f"{test}; percentile bootstrap interval of {self.resamples} resamples, seed {self.seed}"

    def describe_power(self) -> str | None:
        """What this comparison could have found, in words; None for an old verdict without it."""
        if self.disagreement is None:
            return None
        differing = round(self.disagreement * self.items)
        share = f"{differing} of them differing"
        if self.detectable is None:
            return (f"with {self.items} items and {share}, no improvement is detectable at "
                    f"{POWER * 100:.0f}% power")
        return (f"with {self.items} items and {share}, the smallest improvement detectable at "
                f"{POWER * 100:.0f}% power is {self.detectable:+.2f}")


def _examples(ids: set[str]) -> str:
    shown = sorted(ids)[:3]
    return f" (e.g. {', '.join(shown)}{', ...' if len(ids) > 3 else ''})" if ids else ""


def _paired_items(candidate: Mapping[str, float], baseline: Mapping[str, float], strata: Mapping[str, str] | None,
                  ) -> tuple[list[str], list[float], list[float], list[str], list[float], list[float]]:
    """The items two sides share, checked: their ids (sorted, so nothing depends on dict order), each
    side's scores, the subsets, the weights and the differences."""
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
    return ids, c, b, groups, weights, diffs


def paired_p_value(candidate: Mapping[str, float], baseline: Mapping[str, float], *, seed: int = 0,
                   strata: Mapping[str, str] | None = None) -> float:
    """``compare_paired``'s two-sided p-value alone, without its interval: for a family of many
    comparisons (the leaderboard's pairs) where only some need their intervals."""
    _, c, b, _, weights, diffs = _paired_items(candidate, baseline, strata)
    if all(x in (0.0, 1.0) for x in c + b) and equal_weights(weights):
        return mcnemar_exact([x == 1.0 for x in c], [x == 1.0 for x in b]).p_value
    return betting_p(diffs, weights, seed=seed)


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
    (``mcnemar_interval``); otherwise the betting test and its interval (``betting_interval``)."""
    check_level(level)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    ids, c, b, groups, weights, diffs = _paired_items(candidate, baseline, strata)
    n = len(ids)
    disagreement = sum(1 for x in diffs if x != 0.0) / n
    binary = all(x in (0.0, 1.0) for x in c + b)
    if binary and equal_weights(weights):
        result = mcnemar_exact([x == 1.0 for x in c], [x == 1.0 for x in b])
        test: Literal["mcnemar", "betting", "permutation"] = "mcnemar"
        p, only_c_count, only_b_count = result.p_value, result.candidate_only, result.baseline_only
        difference = math.fsum(diffs) / n
        low, high = mcnemar_interval(only_c_count, only_b_count, n, level)
        interval: Literal["mcnemar", "betting"] = "mcnemar"
        detectable = detectable_difference(n, disagreement, level=level)
    else:
        test, interval, only_c_count, only_b_count = "betting", "betting", None, None
        resamples = 0  # the betting test draws nothing: it takes the items once, in a seeded order
        difference, p, low, high = betting_interval(diffs, weights, seed=seed, level=level)
        detectable = detectable_betting(diffs, weights, low, high, power=POWER)
    # No improvement larger than the room the baseline leaves can be found: a "+1.40" says nothing is.
    room = 1.0 - math.fsum(w * x for w, x in zip(weights, b, strict=True)) if higher_is_better else \
        math.fsum(w * x for w, x in zip(weights, b, strict=True))
    if detectable is not None and detectable > room:
        detectable = None
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
        weighting="items" if equal_weights(weights) else "subsets",
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
