"""The campaign's online procedure: its levels, and by simulation its bound on any false acceptance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.online_testing import CAMPAIGN_ALPHA, OnlineState, gamma, two_sided_level
from shared.statistics import compare_paired


def test_the_spending_sequence_sums_to_one_and_the_first_levels_are_alpha_times_it() -> None:
    assert math.fsum(gamma(i) for i in range(1, 200_000)) == pytest.approx(1.0, abs=1e-5)
    state = OnlineState()
    assert state.next_index() == 1
    assert state.next_level() == pytest.approx(CAMPAIGN_ALPHA * 6 / math.pi**2)
    second = state.after(accepted=False)
    assert (second.tests, second.carried) == (1, 0.0)
    assert second.next_level() == pytest.approx(CAMPAIGN_ALPHA * 6 / (4 * math.pi**2))
    with pytest.raises(ValueError):
        gamma(0)


def test_an_acceptance_passes_its_level_on_to_the_next_test_only() -> None:
    first = OnlineState()
    level_1 = first.next_level()
    after_accept = first.after(accepted=True)
    assert after_accept.carried == pytest.approx(level_1)
    assert after_accept.next_level() == pytest.approx(level_1 + CAMPAIGN_ALPHA * gamma(2))
    # Refused next: nothing carries any more.
    assert after_accept.after(accepted=False).next_level() == pytest.approx(CAMPAIGN_ALPHA * gamma(3))


def test_no_level_ever_exceeds_alpha_whatever_is_accepted() -> None:
    """Along any path the levels of consecutive acceptances add up to at most alpha * sum(gamma) <= alpha,
    so the two-sided comparison's level stays at or above 0.9."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        state = OnlineState()
        for _ in range(40):
            assert state.next_level() <= CAMPAIGN_ALPHA + 1e-15
            assert two_sided_level(state.next_level()) >= 0.9 - 1e-15
            state = state.after(accepted=bool(rng.random() < 0.7))


def _upper_tail(m: int, b: int) -> float:
    return sum(math.comb(m, i) for i in range(b, m + 1)) / 2**m


def test_the_simulations_rule_is_the_judges_comparison() -> None:
    """The simulation below accepts when McNemar's one-sided tail P(X >= wins) < alpha_i with more wins than
    losses; the judge accepts when compare_paired at two_sided_level(alpha_i) says improves(). Same thing."""
    rng = np.random.default_rng(11)
    for level in (OnlineState().next_level(), CAMPAIGN_ALPHA * gamma(5), CAMPAIGN_ALPHA * gamma(20)):
        for _ in range(30):
            n = 200
            base = rng.random(n) < 0.5
            flips = rng.random(n) < rng.uniform(0.05, 0.3)
            cand = np.where(flips & (rng.random(n) < rng.uniform(0.3, 0.9)), ~base, base)
            won, lost = int((cand & ~base).sum()), int((~cand & base).sum())
            rule = won > lost and _upper_tail(won + lost, won) < level
            paired = compare_paired({str(i): float(x) for i, x in enumerate(cand)},
                                    {str(i): float(x) for i, x in enumerate(base)}, level=two_sided_level(level))
            assert paired.improves() == rule, (won, lost, level)


def _campaigns(campaigns: int, candidates: int, items: int, seed: int, shared_share: float) -> np.ndarray:
    """(campaigns,) whether any of ``candidates`` pure-noise candidates was accepted. Each candidate flips
    items of the base model's (right half the time) at random, right and wrong alike; ``shared_share`` of
    its flips are the campaign's shared ones (candidates of one agent resemble each other), so the tests
    are dependent, as on a real campaign's one validation split."""
    rng = np.random.default_rng(seed)
    tails = np.zeros((items + 1, items + 2))
    for m in range(items + 1):
        running = 0
        for b in range(m, -1, -1):
            running += math.comb(m, b)
            tails[m, b] = running / 2**m
    base = rng.random((campaigns, items)) < 0.5
    shared = rng.random((campaigns, items)) < 0.2 * shared_share
    any_accepted = np.zeros(campaigns, dtype=bool)
    states = [OnlineState() for _ in range(campaigns)]
    for _ in range(candidates):
        own = rng.random((campaigns, items)) < 0.2 * (1 - shared_share)
        cand = np.where(shared | own, ~base, base)
        won, lost = (cand & ~base).sum(axis=1), (~cand & base).sum(axis=1)
        for c in range(campaigns):
            # Until a false acceptance the incumbent is the base model; after one the campaign has failed.
            if any_accepted[c]:
                continue
            level = states[c].next_level()
            hit = bool(won[c] > lost[c] and tails[won[c] + lost[c], won[c]] < level)
            states[c] = states[c].after(accepted=hit)
            any_accepted[c] = hit
    return any_accepted


@pytest.mark.parametrize("shared_share", [0.0, 0.5])
def test_twenty_noise_candidates_are_falsely_accepted_in_at_most_five_percent_of_campaigns(
        shared_share: float) -> None:
    """2,000 seeded campaigns of 20 pure-noise candidates at n = 200: the share with any acceptance is at
    most alpha (0.05) beyond sampling error (3 standard errors of a share of 0.05 in 2,000: 0.015); the
    uncorrected rate the issue measured was 0.21."""
    campaigns = 2000
    rates = {k: float(_campaigns(campaigns, k, 200, seed=7 + k, shared_share=shared_share).mean())
             for k in (1, 5, 10, 20)}
    slack = 3 * math.sqrt(CAMPAIGN_ALPHA * (1 - CAMPAIGN_ALPHA) / campaigns)
    for k, rate in rates.items():
        assert rate <= CAMPAIGN_ALPHA + slack, (k, rates)
    # The bound is not vacuous: a procedure that never accepts would pass too. The first test alone uses
    # 61% of alpha (one-sided 0.030, McNemar's exact test being conservative), so some noise gets through.
    assert rates[20] > 0.005, rates
