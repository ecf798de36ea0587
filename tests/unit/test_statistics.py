"""shared.statistics and shared.paired_tests against independent computations: exact enumerations, the binomial
test, analytic intervals."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.paired_tests import mcnemar_exact, sign_flip_inverted
from shared.statistics import ItemsDiffer, compare_paired, majority_correct, mean_stderr, pass_at_k


def sign_flip_p(candidate: list[float], baseline: list[float], *, seed: int, resamples: int = 10_000) -> float:
    """The sign-flip test's p-value with every item weighing the same (sign_flip_inverted's second value)."""
    diffs = [float(c) - float(b) for c, b in zip(candidate, baseline, strict=True)]
    return sign_flip_inverted(diffs, [1.0] * len(diffs), seed=seed, resamples=resamples)[1]


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


def test_inverted_interval_matches_the_analytic_one_on_many_items() -> None:
    # Graded, symmetric differences: the inverted sign-flip test's interval is the t interval, near enough.
    rng = np.random.default_rng(7)
    baseline = rng.random(2000) * 0.8
    candidate = np.clip(baseline + 0.1 + rng.normal(0, 0.1, 2000), 0, 1)
    diffs = candidate - baseline
    half = 1.96 * diffs.std(ddof=1) / math.sqrt(diffs.size)
    mean, p, low, high = sign_flip_inverted(list(diffs), [1.0] * diffs.size, seed=1)
    assert mean == pytest.approx(diffs.mean(), abs=1e-12)
    assert p < 0.001
    assert abs(low - (diffs.mean() - half)) < 0.002
    assert abs(high - (diffs.mean() + half)) < 0.002


def test_sign_flip_chunks_give_the_same_draws_as_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    import shared.paired_tests as paired_tests

    diffs = list(np.random.default_rng(3).normal(0.05, 0.3, 50))
    whole = sign_flip_inverted(diffs, [1.0] * 50, seed=5, resamples=1000)
    monkeypatch.setattr(paired_tests, "_CHUNK_ELEMENTS", 50 * 7)  # 7 patterns a chunk, the last one partial
    assert sign_flip_inverted(diffs, [1.0] * 50, seed=5, resamples=1000) == whole


def test_same_seed_same_answers_and_a_different_seed_differs() -> None:
    # Graded scores from one distribution, so p is well inside (0, 1); 300 non-zero differences: Monte Carlo.
    graded = np.random.default_rng(12).random((2, 300))
    graded_c, graded_b = list(graded[0]), list(graded[1])
    p = sign_flip_p(graded_c, graded_b, seed=42)
    assert sign_flip_p(graded_c, graded_b, seed=42) == p
    assert sign_flip_p(graded_c, graded_b, seed=43) != p  # Monte Carlo: the seed matters
    assert 0.0 < p < 1.0
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


def test_permutation_exact_cases_by_hand() -> None:
    # Of the 8 sign patterns of [1, 1, 1] only all-plus and all-minus reach |mean| = 1.
    assert sign_flip_p([1, 1, 1], [0, 0, 0], seed=0) == pytest.approx(0.25)
    # Zero differences do not flip: [1, 1, 1, 0] is the same test on 3 non-zero differences.
    assert sign_flip_p([1, 1, 1, 0.5], [0, 0, 0, 0.5], seed=0) == pytest.approx(0.25)
    # [0.5, -0.25]: sums 0.25, 0.75, -0.75, -0.25; |sum| >= 0.25 everywhere.
    assert sign_flip_p([0.5, 0.0], [0.0, 0.25], seed=0) == 1.0
    assert sign_flip_p([0.3, 0.7, 0.1], [0.3, 0.7, 0.1], seed=0) == 1.0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.25, 1.0]), min_size=1, max_size=10))
def test_permutation_exact_matches_brute_force(diffs: list[float]) -> None:
    observed = abs(sum(diffs))
    flips = list(itertools.product([1, -1], repeat=len(diffs)))
    expected = sum(1 for s in flips if abs(sum(a * b for a, b in zip(s, diffs, strict=True))) >= observed - 1e-9)
    p = sign_flip_p(diffs, [0.0] * len(diffs), seed=0)
    assert p == pytest.approx(expected / len(flips) if any(diffs) else 1.0, abs=1e-12)


def test_permutation_monte_carlo_agrees_with_mcnemar_roughly() -> None:
    # 20 discordant items, 15 for the candidate: the sign-flip test is then the binomial test again.
    candidate, baseline = discordant(15, 5)
    p = sign_flip_p([float(x) for x in candidate], [float(x) for x in baseline], seed=3, resamples=20_000)
    assert p == pytest.approx(float(binomial_two_sided(15, 20)), abs=0.006)


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


def test_compare_graded_values_use_the_permutation_test() -> None:
    rng = random.Random(5)
    baseline = [rng.random() for _ in range(80)]
    candidate = [min(1.0, x + 0.2 * rng.random()) for x in baseline]
    result = compare_paired(scores(candidate), scores(baseline), seed=2)
    assert result.test == "permutation"
    assert result.candidate_only is None and result.baseline_only is None
    assert result.direction == "better" and result.p_value < 0.001
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
    # (subsets of unequal size) and a clear gain: 10,000 patterns could give no p below 1 / 10,001.
    from shared.online_testing import OnlineState, two_sided_level

    state = OnlineState()
    for _ in range(24):
        state = state.after(False)
    level = two_sided_level(state.next_level())
    candidate = {f"{'a' if k < 40 else 'b'}/{k}": 1.0 if k % 5 else 0.5 for k in range(200)}
    baseline = {f"{'a' if k < 40 else 'b'}/{k}": 0.0 if k % 3 else 1.0 for k in range(200)}
    strata = {key: key.split("/")[0] for key in candidate}
    result = compare_paired(candidate, baseline, level=level, strata=strata)
    assert result.test == "permutation" and result.resamples * (1.0 - level) >= 20
    assert result.p_value < 1.0 - level and result.improves()
