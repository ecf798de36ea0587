"""shared.statistics and shared.paired_tests against independent computations: exact enumerations, the binomial
test, analytic intervals."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from shared.paired_tests import BET_TRUNCATION, betting_interval, mcnemar_exact
from shared.statistics import ItemsDiffer, compare_paired, majority_correct, mean_stderr, pass_at_k


def hedged_log_wealth(diffs: list[float], weights: list[float], m_d: float, *, seed: int) -> float:
    """Waudby-Smith and Ramdas's hedged capital, written out item by item: the largest log wealth of
    betting against a weighted mean difference of ``m_d``, the items in the order ``seed`` gives."""
    n = len(diffs)
    total = sum(weights)
    w = [x / total for x in weights]
    reach = n * max(w)
    y = [(n * wi * di + reach) / (2 * reach) for wi, di in zip(w, diffs, strict=True)]
    order = np.random.default_rng(seed).permutation(n)
    y = [y[i] for i in order]
    m = (m_d + reach) / (2 * reach)
    alpha = 0.05  # the bets are sized for 95% whatever level is asked (BET_LEVEL)
    up = down = 1.0
    best = -math.inf
    sum_y, sum_sq, var_prev = 0.0, 0.0, 0.25
    for t, value in enumerate(y, start=1):
        bet = math.sqrt(2 * math.log(2 / alpha) / (n * var_prev))
        up *= 1 + min(bet, BET_TRUNCATION / m) * (value - m)
        down *= 1 - min(bet, BET_TRUNCATION / (1 - m)) * (value - m)
        best = max(best, math.log((up + down) / 2))
        sum_y += value
        mean_t = (0.5 + sum_y) / (t + 1)
        sum_sq += (value - mean_t) ** 2
        var_prev = (0.25 + sum_sq) / (t + 1)
    return best


def binomial_two_sided(k: int, n: int) -> Fraction:
    """Two-sided binomial p at 1/2: the total probability of outcomes no more likely than the observed one."""
    if n == 0:
        return Fraction(1)
    probs = [Fraction(math.comb(n, i), 2**n) for i in range(n + 1)]
    return sum((p for p in probs if p <= probs[k]), Fraction(0))


def discordant(b: int, c: int, both_right: int = 3, both_wrong: int = 2) -> tuple[list[bool], list[bool]]:
    candidate = [True] * b + [False] * c + [True] * both_right + [False] * both_wrong
    baseline = [False] * b + [True] * c + [True] * both_right + [False] * both_wrong
    return candidate, baseline


@pytest.mark.parametrize("b,c", [(0, 0), (1, 0), (5, 0), (3, 9), (10, 10), (40, 60), (0, 25), (9, 1), (700, 650)])
def test_mcnemar_matches_an_independent_binomial_test(b: int, c: int) -> None:
    result = mcnemar_exact(*discordant(b, c))
    assert (result.candidate_only, result.baseline_only) == (b, c)
    assert result.p_value == pytest.approx(float(binomial_two_sided(b, b + c)), abs=1e-12)


def test_mcnemar_textbook_value() -> None:
    assert mcnemar_exact(*discordant(1, 9)).p_value == pytest.approx(0.021484375, abs=1e-15)
    assert mcnemar_exact(*discordant(0, 0)).p_value == 1.0


def correlated_binary(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Baseline right half the time; the candidate mostly right where the baseline is: overall 0.6, correlated.
    rng = np.random.default_rng(seed)
    baseline = rng.random(n) < 0.5
    candidate = np.where(baseline, rng.random(n) < 0.8, rng.random(n) < 0.4)
    return candidate.astype(float), baseline.astype(float)


def test_same_seed_same_answers_and_a_different_seed_differs() -> None:
    # Graded scores from one distribution, so p is well inside (0, 1); the seed orders the items.
    graded = np.random.default_rng(12).random((2, 300))
    graded_c, graded_b = list(graded[0]), list(graded[1])
    diffs = [c - b for c, b in zip(graded_c, graded_b, strict=True)]
    p = betting_interval(diffs, [1.0] * 300, seed=42)[1]
    assert betting_interval(diffs, [1.0] * 300, seed=42)[1] == p
    assert betting_interval(diffs, [1.0] * 300, seed=43)[1] != p  # another order: the seed matters
    assert 0.0 < p <= 1.0
    pair = scores(graded_c), scores(graded_b)
    assert compare_paired(*pair, seed=9) == compare_paired(*pair, seed=9)
    assert compare_paired(*pair, seed=9) != compare_paired(*pair, seed=10)


def test_compare_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        compare_paired({}, {})
    with pytest.raises(ValueError, match="level"):
        compare_paired({"a": 1.0}, {"a": 0.0}, level=1.0)


def pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    correct = set(range(c))
    subsets = list(itertools.combinations(range(n), k))
    return sum(1 for s in subsets if correct.intersection(s)) / len(subsets)


def test_pass_at_k_matches_enumeration_of_every_subset() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_enumeration(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_known_values_and_errors() -> None:
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(200, 200, 100) == 1.0
    assert 0.0 < pass_at_k(200, 1, 100) == pytest.approx(0.5)
    for n, c, k in [(3, 1, 4), (3, 1, 0), (3, 4, 1), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_stderr() -> None:
    mean, err = mean_stderr([0, 1, 1, 1])
    assert mean == pytest.approx(0.75) and err == pytest.approx(0.25)
    assert mean_stderr([0.4]) == (0.4, None)  # one value says nothing about the spread
    with pytest.raises(ValueError):
        mean_stderr([])


@pytest.mark.parametrize(
    "runs,expected",
    [
        ([("4", True), ("4", True), ("5", False)], True),
        ([("5", False), ("4", True), ("5", False)], False),
        ([("4", True), ("5", False)], True),  # a tie goes to the answer seen first
        ([("5", False), ("4", True)], False),
        ([("5", False), ("4", True), ("4", True), ("5", False)], False),
        ([(None, False), (None, False), ("4", True)], True),  # runs without an answer do not vote
        ([(None, False), (None, True)], False),
        ([], False),
    ],
)
def test_majority_correct(runs: list[tuple[str | None, bool]], expected: bool) -> None:
    assert majority_correct(runs) is expected


def scores(values: list[float]) -> dict[str, float]:
    return {f"item-{i:03d}": v for i, v in enumerate(values)}


def test_compare_clearly_better() -> None:
    candidate = scores([1.0] * 50 + [0.0] * 10)
    baseline = scores([1.0] * 20 + [0.0] * 40)  # the baseline's right items are a subset of the candidate's
    result = compare_paired(candidate, baseline, seed=0)
    assert result.test == "mcnemar"
    assert (result.candidate_only, result.baseline_only) == (30, 0)
    assert result.difference == pytest.approx(0.5)
    assert result.ci_low > 0.0 and result.ci_high <= 1.0
    assert result.p_value == pytest.approx(2 / 2**30)
    assert result.beyond_noise() and result.direction == "better"
    assert result.describe().startswith("better than the base model by +0.50 (95% CI +")
    assert result.describe().endswith(", two-sided p = 1.9e-09, threshold 0.05, 60 items)")
    flipped = compare_paired(baseline, candidate, seed=0)
    assert flipped.direction == "worse"
    assert flipped.describe("model A").startswith("worse than model A by -0.50 (95% CI -")


def test_compare_null_cases_are_indistinguishable() -> None:
    same = scores([1.0, 0.0, 1.0, 1.0] * 15)
    identical = compare_paired(same, same)
    assert identical.p_value == 1.0 and identical.direction == "indistinguishable"
    # No item differs: the interval is the bound on a difference that 0 of 60 disagreements leave, not a point.
    assert identical.describe() == (
        "not distinguishable from the base model (difference +0.00, 95% CI -0.10 to +0.10, two-sided p = 1, "
        "threshold 0.05, 60 items)"
    )
    candidate, baseline = discordant(11, 9, both_right=100, both_wrong=80)
    tiny = compare_paired(scores([float(x) for x in candidate]), scores([float(x) for x in baseline]))
    assert tiny.direction == "indistinguishable" and not tiny.beyond_noise()
    assert tiny.ci_low < 0.0 < tiny.ci_high
    assert tiny.describe().startswith("not distinguishable from the base model (difference +0.01, 95% CI -")
    one = compare_paired({"a": 1.0}, {"a": 0.0})
    assert one.describe().startswith("too few items to say against the base model (1 item, fewer than 10:")


def test_the_betting_p_value_and_interval_match_the_wealth_written_out() -> None:
    rng = np.random.default_rng(3)
    for n, strata in ((12, None), (40, None), (60, (10, 50))):
        diffs = list(np.clip(rng.normal(0.15, 0.35, n), -1, 1))
        weights = [1.0] * n if strata is None else [1 / strata[0]] * strata[0] + [1 / strata[1]] * strata[1]
        observed, p, low, high = betting_interval(diffs, weights, seed=n)
        assert observed == pytest.approx(sum(w * d for w, d in zip(weights, diffs, strict=True)) / sum(weights))
        assert p == pytest.approx(min(1.0, math.exp(-hedged_log_wealth(diffs, weights, 0.0, seed=n))), rel=1e-9)
        threshold = math.log(1 / 0.05)
        # Every mean inside the interval is accepted, every one just beyond it rejected.
        for inside in (low + 1e-6, (low + high) / 2, high - 1e-6):
            assert hedged_log_wealth(diffs, weights, inside, seed=n) < threshold
        for outside in (low - 1e-4, high + 1e-4):
            if -1 < outside < 1:
                assert hedged_log_wealth(diffs, weights, outside, seed=n) >= threshold
        assert (low <= 0.0 <= high) == (p >= 0.05)
    # The same inputs and seed give the same interval; another seed takes the items in another order.
    diffs = list(np.clip(rng.normal(0.1, 0.3, 80), -1, 1))
    assert betting_interval(diffs, [1.0] * 80, seed=1) == betting_interval(diffs, [1.0] * 80, seed=1)


def test_compare_graded_values_use_the_betting_test() -> None:
    rng = random.Random(5)
    baseline = [rng.random() for _ in range(80)]
    candidate = [min(1.0, x + 0.2 * rng.random()) for x in baseline]
    result = compare_paired(scores(candidate), scores(baseline), seed=2)
    assert result.test == "betting" and result.interval == "betting"
    assert result.candidate_only is None and result.baseline_only is None
    # +0.10 on nearly every item: the bets are bounded by what one item could lose, so p is 1 / a wealth
    # that grows at most a few percent an item, not a t-test's 1e-30.
    assert result.direction == "better" and result.p_value < 0.01
    assert result.candidate_mean - result.baseline_mean == pytest.approx(result.difference)


def test_compare_different_items_raise_with_counts() -> None:
    candidate = scores([1.0] * 10) | {"extra-1": 1.0, "extra-2": 0.0}
    baseline = scores([1.0] * 8)
    with pytest.raises(ItemsDiffer) as raised:
        compare_paired(candidate, baseline)
    message = str(raised.value)
    assert "same items" in message and "same benchmark, split and version" in message
    assert "8 shared" in message
    assert "4 only in the candidate (e.g. extra-1, extra-2, item-008, ...)" in message
    assert "0 only in the baseline" in message
    assert isinstance(raised.value, ValueError)


def test_compare_does_not_depend_on_dict_order() -> None:
    rng = random.Random(8)
    candidate = scores([rng.choice([0.0, 0.5, 1.0]) for _ in range(40)])
    baseline = scores([rng.choice([0.0, 0.5, 1.0]) for _ in range(40)])
    reversed_c = dict(reversed(list(candidate.items())))
    shuffled = list(baseline.items())
    rng.shuffle(shuffled)
    assert compare_paired(reversed_c, dict(shuffled), seed=4) == compare_paired(candidate, baseline, seed=4)


def test_beyond_noise_at_another_level_uses_only_the_p_value() -> None:
    candidate, baseline = discordant(14, 4, both_right=30, both_wrong=30)
    result = compare_paired(scores([float(x) for x in candidate]), scores([float(x) for x in baseline]))
    assert 0.01 < result.p_value < 0.05 and result.ci_low > 0.0
    assert result.beyond_noise() and not result.beyond_noise(level=0.99)


def test_levels_p_values_and_counts_print_to_the_digits_they_need() -> None:
    from shared.statistics import p_text, percent

    # A campaign's 4th test: a level of 0.9962 is not "100%".
    assert percent(0.95) == "95%" and percent(0.9962) == "99.62%" and percent(0.99994) == "99.994%"
    # A threshold below 0.001 is printed as it is, so a p-value is never "p < 0.001" beside it.
    assert p_text(9.7e-05) == "9.7e-05" and p_text(0.012) == "0.012" and p_text(0.5) == "0.5"
    one = compare_paired(scores([1.0] + [0.0] * 199), scores([0.0] * 200))
    assert "with 200 items and 1 of them differing" in one.describe_power()


def test_the_detectable_improvement_never_passes_the_room_the_baseline_leaves() -> None:
    # Graded scores on 12 items, the baseline near the top: nothing above 1 - 0.9 can be found.
    candidate = {f"i{k}": 1.0 if k % 2 else 0.95 for k in range(12)}
    baseline = {f"i{k}": 0.9 for k in range(12)}
    result = compare_paired(candidate, baseline)
    assert result.detectable is None or result.detectable <= 1.0 - 0.9 + 1e-12
    assert result.describe_power() is not None


def test_a_graded_comparison_resolves_a_campaigns_smallest_thresholds() -> None:
    # A campaign's 25th test: one-sided 4.9e-05, so two-sided p must fall below 9.7e-05. Graded scores
    # (subsets of unequal size) and a clear gain: 10,000 sign patterns could give no p below 1 / 10,001;
    # the betting test's p is 1 / its wealth, which has no such floor.
    from shared.online_testing import OnlineState, two_sided_level

    state = OnlineState()
    for _ in range(24):
        state = state.after(False)
    level = two_sided_level(state.next_level())
    candidate = {f"{'a' if k < 40 else 'b'}/{k}": 1.0 if k % 5 else 0.5 for k in range(200)}
    baseline = {f"{'a' if k < 40 else 'b'}/{k}": 0.0 if k % 3 else 1.0 for k in range(200)}
    strata = {key: key.split("/")[0] for key in candidate}
    result = compare_paired(candidate, baseline, level=level, strata=strata)
    assert result.test == "betting"
    assert result.p_value < 1.0 - level and result.improves()
