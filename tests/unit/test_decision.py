"""The decision function (shared/decision.py) and its sequential test (shared/confirmation.py): seeded,
fast versions of bench/search_power.py's scenarios, and the properties a verdict relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.search_power import (
    ArrayPool,
    Scenario,
    false_rate,
    mixed,
    power,
    prescreened,
    split_campaigns,
)
from shared.confirmation import (
    BUDGET,
    POWER_DIFFERING,
    POWER_GAIN,
    confirm,
    largest_possible_wealth,
    log_wealth,
    pool_power,
)
from shared.decision import OWNER_ALPHA, SCREEN_LEVEL, OwnerState, decide


def _noise(rng: np.random.Generator, size: int, gain: float = 0.0) -> np.ndarray:
    u = rng.random(size)
    return np.where(u < 0.1 + gain / 2, 1.0, np.where(u > 0.9 + gain / 2, -1.0, 0.0))


def test_the_betting_test_keeps_its_level_under_the_null_however_long_it_looks() -> None:
    rng = np.random.default_rng(0)
    level = 0.05
    # Differences of mean 0 and of mean -0.04 (the null's edge and inside it), tested up to the budget.
    for gain in (0.0, -0.04):
        confirmed = sum(confirm(_noise(rng, BUDGET, gain), level, futility_after=BUDGET + 1).confirmed
                        for _ in range(2_000))
        assert confirmed / 2_000 <= level


def test_the_betting_test_confirms_a_real_gain_and_stops_early_for_it() -> None:
    rng = np.random.default_rng(1)
    results = [confirm(_noise(rng, BUDGET, 0.10), 0.003) for _ in range(300)]
    assert np.mean([r.confirmed for r in results]) >= 0.9
    assert np.mean([r.items for r in results if r.confirmed]) < BUDGET / 2
    # Each stop lies on a batch end and the wealth at a confirmation reached 1 / level.
    assert all(r.wealth >= 1 / 0.003 for r in results if r.confirmed)


def test_a_bet_uses_only_the_items_before_it() -> None:
    rng = np.random.default_rng(2)
    d = _noise(rng, 300, 0.1)
    changed = d.copy()
    changed[200:] = -1.0
    # The wealth up to item 200 does not depend on what comes after it.
    assert np.array_equal(log_wealth(d)[:200], log_wealth(changed)[:200])


def _pair(rng: np.random.Generator, n: int, gain: float) -> tuple[dict[str, float], dict[str, float]]:
    ref = rng.random(n) < 0.5
    flip = rng.random(n)
    cand = np.where(ref, flip >= 0.2 - gain, flip < 0.2 + gain)
    return ({f"i{k}": float(v) for k, v in enumerate(cand)}, {f"i{k}": float(v) for k, v in enumerate(ref)})


def test_a_confirmed_candidate_moves_the_owners_pool_cursor_and_reports_a_fresh_estimate() -> None:
    rng = np.random.default_rng(3)
    owner = OwnerState(owner="alice")
    for _ in range(20):
        cand, ref = _pair(rng, 100, 0.15)
        decision = decide(cand, ref, owner, benchmark="gsm8k", pool=ArrayPool(_noise(rng, 1_100, 0.15)))
        if decision.better:
            break
    assert decision.better, decision.summary
    after = decision.owner_after
    assert after.confirmations == owner.confirmations + 1 and after.accepted == 1
    # Every pool item it used (its confirmation and its estimate) is behind the cursor now.
    assert after.cursors["gsm8k"] == decision.pool_items
    assert decision.estimate is not None and decision.estimate_low < decision.estimate < decision.estimate_high
    assert after.carried == pytest.approx(owner.next_level())


def test_a_refused_confirmation_tells_the_owner_nothing_of_the_pool_and_spends_its_level() -> None:
    rng = np.random.default_rng(4)
    owner = OwnerState(owner="alice")
    for _ in range(50):
        cand, ref = _pair(rng, 100, 0.0)
        decision = decide(cand, ref, owner, benchmark="gsm8k", pool=ArrayPool(_noise(rng, 1_100)))
        if decision.screened and decision.confirmation is not None and not decision.better:
            break
    assert decision.answer == "indistinguishable"
    # The level is spent, the cursor stays, and the words name no pool estimate.
    assert decision.owner_after.confirmations == 1 and decision.owner_after.cursors == {}
    assert "pool items" not in decision.summary and decision.estimate is None


def test_a_candidate_that_does_not_pass_the_screen_spends_nothing() -> None:
    rng = np.random.default_rng(5)
    owner = OwnerState(owner="alice")
    cand, ref = _pair(rng, 100, -0.02)
    decision = decide(cand, ref, owner, benchmark="gsm8k", pool=ArrayPool(_noise(rng, 1_100)))
    if decision.screened:
        pytest.fail(f"seeded: this candidate screens out (p = {decision.screen_p})")
    assert decision.screen_p >= SCREEN_LEVEL and decision.owner_after == owner and decision.pool_items == 0


def test_a_clearly_worse_candidate_is_called_worse() -> None:
    rng = np.random.default_rng(6)
    cand, ref = _pair(rng, 200, -0.15)
    decision = decide(cand, ref, OwnerState(owner="a"), benchmark="b", pool=ArrayPool(_noise(rng, 1_000)))
    assert decision.answer == "worse" and "worse than the base model" in decision.summary


def test_without_a_pool_or_with_too_small_a_one_nothing_is_called_better_and_the_verdict_says_why() -> None:
    rng = np.random.default_rng(7)
    cand, ref = _pair(rng, 82, 0.3)  # HumanEval's size: every item in validation or test
    owner = OwnerState(owner="a")
    none = decide(cand, ref, owner, benchmark="humaneval", pool=None)
    assert none.answer == "indistinguishable" and "no confirmation pool" in (none.pool_note or "")
    small = decide(cand, ref, owner, benchmark="aime", pool=ArrayPool(np.ones(5)))
    assert small.answer == "indistinguishable" and "too few" in (small.pool_note or "")
    assert largest_possible_wealth(5) < math.log(1 / owner.next_level())


def test_a_small_pool_states_its_power_and_the_stated_chance_is_the_tests_own() -> None:
    """A pool with fewer unused items than one confirmation may use says what it can confirm: the chance
    it states for a real +0.10 candidate is what the test does with such candidates (fresh seeds)."""
    rng = np.random.default_rng(8)
    owner = OwnerState(owner="a")
    level = owner.next_level()
    stated = pool_power(200, level)
    up, down = (POWER_DIFFERING + POWER_GAIN) / 2, (POWER_DIFFERING - POWER_GAIN) / 2
    u = rng.random((400, 200))
    seen = np.mean([confirm(np.where(x < up, 1.0, np.where(x < up + down, -1.0, 0.0)), level, pool_left=False).confirmed
                    for x in u])
    assert abs(stated - seen) < 0.1 and 0.4 < stated < 0.95
    assert pool_power(120, level) < stated < pool_power(600, level)
    while True:
        cand, ref = _pair(rng, 100, 0.3)
        small = decide(cand, ref, owner, benchmark="b", pool=ArrayPool(_noise(rng, 200, 0.1)))
        if small.screened:
            break
    assert "the confirmation pool has 200 unused items for this owner" in small.summary
    assert f"a chance of about {stated:.2f}" in small.summary and small.pool_note is not None
    large = decide(cand, ref, owner, benchmark="b", pool=ArrayPool(_noise(rng, BUDGET + 200, 0.1)))
    assert large.screened and large.pool_note is None and "chance" not in large.summary


def test_the_owners_levels_never_sum_past_its_alpha() -> None:
    owner = OwnerState(owner="a")
    for _ in range(10_000):
        owner = owner.model_copy(update={"confirmations": owner.confirmations + 1})
    assert owner.spent() < OWNER_ALPHA


# ---------------------------------------------------------------- the search scenarios, seeded and small


def test_pure_noise_is_called_better_at_most_at_the_owners_alpha() -> None:
    rates, items = false_rate(Scenario("n=100"), 150, seed=11, procedure="after", ks=(1, 5, 20))
    assert max(rates.values()) <= OWNER_ALPHA
    assert items <= 3 * 100  # the pool costs at most twice the validation split again


def test_graded_noise_is_called_better_at_most_at_the_owners_alpha() -> None:
    rates, _ = false_rate(Scenario("graded", runs=4), 60, seed=12, procedure="after", ks=(1, 20))
    assert max(rates.values()) <= OWNER_ALPHA


def test_a_real_improvement_is_found_late_in_a_search() -> None:
    found, estimates, _ = power(Scenario("n=100"), 60, seed=13, procedure="after", gain=0.10, positions=(1, 10))
    before, _, _ = power(Scenario("n=100"), 60, seed=13, procedure="before", gain=0.10, positions=(10,))
    assert min(found.values()) >= 0.8 and before[10] < 0.5
    # The estimate comes from fresh pool items: no winner's curse beyond noise.
    assert abs(np.mean([e for e, _ in estimates]) - 0.10) < 0.02


def test_prescreening_and_splitting_a_search_buy_no_false_acceptances() -> None:
    assert prescreened(300, seed=14, procedure="before") > 0.1  # today's procedure is fooled
    assert prescreened(300, seed=14, procedure="after") <= OWNER_ALPHA
    assert split_campaigns(60, seed=15, procedure="after") <= OWNER_ALPHA


def test_a_mixed_search_finds_real_candidates_without_false_ones() -> None:
    false, found, items = mixed(60, seed=16, procedure="after")
    assert false <= OWNER_ALPHA and found >= 1.0 and items <= 300
