"""What an agent's search gets from the verdict, before and after the confirmation pool: the false
"better" rate, the power by position, the items a candidate costs and the accepted gains' estimates,
by simulation (numpy, seeded).

- **before**: today's campaign procedure (shared/online_testing.py): each candidate against the
  incumbent on the same validation items, one-sided at the campaign's level (McNemar's exact test for
  items right or wrong; the betting test of shared/paired_tests.py for graded scores), the level spent per
  campaign. (Outside a campaign, today's default policy accepts every candidate that ran.)
- **after**: ``shared.decision.decide``, the one decision function: a screen on validation, then the
  betting test on a hidden pool at the owner's level, spent per confirmation over the owner's whole
  history, fresh items after each acceptance.

The world: a GSM8K-sized benchmark (1,319 items: validation ``--items``, test 100, the pool the
rest). The reference is right on half the items; a candidate better than it by g differs on a share
``max(0.2, |g|)`` of them, flipping wrong answers to right more often than right to wrong, by exactly
g on average. Graded scores: the mean of 4 runs, each drawn so. Pool items are fresh draws of the
same kind; the same candidate submitted twice meets the same pool items.

    .venv/bin/python bench/search_power.py [--searches 1000] [--seed 0] [--json]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import simulation_main  # noqa: E402
from shared.decision import OWNER_ALPHA, OwnerState, decide  # noqa: E402
from shared.online_testing import OnlineState  # noqa: E402
from shared.paired_tests import betting_interval, upper_tail  # noqa: E402

BENCHMARK_ITEMS = 1_319
TEST_ITEMS = 100
DISAGREEMENT = 0.2
POSITIONS = (1, 5, 10, 20)
GAINS = (0.05, 0.10)
NOISE = (1, 5, 20, 100)


@dataclass
class World:
    """One simulated search's benchmark: the validation outcomes of the models met so far, and each
    candidate's pool differences against the reference it was first compared with."""

    rng: np.random.Generator
    items: int
    runs: int = 1
    pool_size: int = 0
    pools: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def reference(self) -> np.ndarray:
        return self.rng.random((self.runs, self.items)) < 0.5

    def candidate(self, incumbent: np.ndarray, gain: float) -> np.ndarray:
        up, down = _flips(gain)
        flip = self.rng.random(incumbent.shape)
        return np.where(incumbent, flip >= down, flip < up)

    def pool(self, candidate: int, reference: int, gain: float) -> np.ndarray:
        key = (candidate, reference)
        if key not in self.pools:
            up, down = _flips(gain)
            u = self.rng.random((self.runs, self.pool_size))
            d = np.where(u < 0.5 * up, 1.0, np.where(u > 1.0 - 0.5 * down, -1.0, 0.0))
            self.pools[key] = d.mean(axis=0)
        return self.pools[key]


def _flips(gain: float) -> tuple[float, float]:
    spread = max(DISAGREEMENT, abs(gain))
    return spread + gain, spread - gain


class ArrayPool:
    def __init__(self, diffs: np.ndarray) -> None:
        self.diffs, self.size = diffs, int(diffs.size)

    def differences(self, start: int, stop: int) -> Sequence[float]:
        return self.diffs[start:stop]


def _scores(outcomes: np.ndarray) -> dict[str, float]:
    return {f"i{k:04d}": float(v) for k, v in enumerate(outcomes.mean(axis=0))}


def _before_p(candidate: np.ndarray, incumbent: np.ndarray) -> float:
    """Today's one-sided p-value of the campaign test on validation."""
    if candidate.shape[0] == 1:
        wins = int((candidate & ~incumbent).sum())
        losses = int((incumbent & ~candidate).sum())
        return upper_tail(wins, wins + losses, 0.5) if wins + losses else 1.0
    diffs = candidate.mean(axis=0) - incumbent.mean(axis=0)
    difference, p, _, _ = betting_interval(list(diffs), [1.0] * diffs.size, seed=0)
    return p / 2 if difference > 0 else 1.0


@dataclass
class Outcome:
    """One search: for each candidate, whether it was accepted, and whether that was false."""

    accepted: list[bool] = field(default_factory=list)
    false: list[bool] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    estimates: list[tuple[float, float]] = field(default_factory=list)  # (estimated, true) gain of real ones


def search(world: World, gains: Sequence[float], campaigns: Sequence[int], procedure: str) -> Outcome:
    """Submit candidates of these true gains over the base model in order, the i-th into campaign
    ``campaigns[i]``, under ``procedure`` ("before" or "after"); each campaign's incumbent starts as the base."""
    base = world.reference()
    incumbents: dict[int, tuple[int, np.ndarray, float]] = {}  # campaign -> (model id, validation, true gain)
    states: dict[int, OnlineState] = {}
    owner = OwnerState(owner="agent")
    out = Outcome()
    for i, (gain, campaign) in enumerate(zip(gains, campaigns, strict=True)):
        ref_id, ref_val, ref_gain = incumbents.get(campaign, (-1, base, 0.0))
        relative = gain - ref_gain
        val = world.candidate(ref_val, relative)
        if procedure == "before":
            state = states.get(campaign, OnlineState())
            level = state.next_level()
            ok = _before_p(val, ref_val) < level
            states[campaign] = state.after(ok)
            out.items.append(world.items)
            estimate = float(val.mean() - ref_val.mean())
        else:
            decision = decide(_scores(val), _scores(ref_val), owner, benchmark="sim",
                              pool=ArrayPool(world.pool(i, ref_id, relative)))
            owner, ok = decision.owner_after, decision.better
            out.items.append(decision.items_used)
            estimate = decision.estimate if decision.estimate is not None else 0.0
        out.accepted.append(ok)
        out.false.append(ok and relative <= 0.0)
        if ok:
            incumbents[campaign] = (i, val, gain)
            if relative > 0:
                out.estimates.append((estimate, relative))
    return out


def best_of_prescreened(world: World, count: int, procedure: str) -> Outcome:
    """An agent scores ``count`` noise candidates outside any campaign (``ftbus score``: numbers, no
    verdict), then submits the one best on validation as the first candidate of a new campaign."""
    base = world.reference()
    vals = [world.candidate(base, 0.0) for _ in range(count)]
    best = max(range(count), key=lambda k: float(vals[k].mean()))
    out = Outcome()
    if procedure == "before":
        ok = _before_p(vals[best], base) < OnlineState().next_level()
        out.items.append(world.items)
    else:
        decision = decide(_scores(vals[best]), _scores(base), OwnerState(owner="agent"), benchmark="sim",
                          pool=ArrayPool(world.pool(best, -1, 0.0)))
        ok = decision.better
        out.items.append(decision.items_used)
    out.accepted.append(ok)
    out.false.append(ok)
    return out


@dataclass
class Scenario:
    name: str
    items: int = 100
    runs: int = 1


def _world(rng: np.random.Generator, scenario: Scenario) -> World:
    return World(rng, scenario.items, scenario.runs, BENCHMARK_ITEMS - scenario.items - TEST_ITEMS)


def false_rate(scenario: Scenario, searches: int, seed: int, procedure: str, *, ks: Sequence[int] = NOISE,
               ) -> tuple[dict[int, float], float]:
    """k -> the chance that any of k pure-noise candidates in one campaign is called better; and the
    items per candidate."""
    rng = np.random.default_rng(seed)
    hits = np.zeros((searches, max(ks)), dtype=bool)
    items: list[int] = []
    for s in range(searches):
        outcome = search(_world(rng, scenario), [0.0] * max(ks), [0] * max(ks), procedure)
        hits[s] = outcome.false
        items.extend(outcome.items)
    return {k: float(hits[:, :k].any(axis=1).mean()) for k in ks}, float(np.mean(items))


def power(scenario: Scenario, searches: int, seed: int, procedure: str, gain: float,
          positions: Sequence[int] = POSITIONS) -> tuple[dict[int, float], list[tuple[float, float]], float]:
    """position -> the chance a real ``gain`` is called better there after position - 1 noise candidates;
    the accepted real ones' (estimated, true) gains; items per candidate."""
    rng = np.random.default_rng(seed)
    out: dict[int, float] = {}
    estimates: list[tuple[float, float]] = []
    items: list[int] = []
    for position in positions:
        found = 0
        for _ in range(searches):
            gains = [0.0] * (position - 1) + [gain]
            outcome = search(_world(rng, scenario), gains, [0] * position, procedure)
            found += outcome.accepted[-1] and not any(outcome.accepted[:-1])
            estimates.extend(outcome.estimates)
            items.extend(outcome.items)
        out[position] = found / searches
    return out, estimates, float(np.mean(items))


def split_campaigns(searches: int, seed: int, procedure: str, count: int = 20) -> float:
    """One owner's ``count`` one-candidate campaigns of noise: the chance that any is called better."""
    rng = np.random.default_rng(seed)
    scenario = Scenario("split")
    hits = [any(search(_world(rng, scenario), [0.0] * count, list(range(count)), procedure).false)
            for _ in range(searches)]
    return float(np.mean(hits))


def prescreened(searches: int, seed: int, procedure: str, count: int = 20) -> float:
    rng = np.random.default_rng(seed)
    scenario = Scenario("prescreened")
    return float(np.mean([best_of_prescreened(_world(rng, scenario), count, procedure).false[0]
                          for _ in range(searches)]))


#: The mixed search: real, tied and worse candidates (true gains over the base model), shuffled per search.
MIXED = (0.10, 0.10, 0.05, 0.05, 0.15) + (0.0,) * 10 + (-0.05,) * 5


def mixed(searches: int, seed: int, procedure: str) -> tuple[float, float, float]:
    """The false-"better" rate, the share of the real candidates accepted, and the items per candidate."""
    rng = np.random.default_rng(seed)
    hits, found, items = [], [], []
    for _ in range(searches):
        gains = list(rng.permutation(MIXED))
        outcome = search(_world(rng, Scenario("mixed")), gains, [0] * len(gains), procedure)
        hits.append(any(outcome.false))
        found.append(sum(outcome.accepted) - sum(outcome.false))
        items.extend(outcome.items)
    return float(np.mean(hits)), float(np.mean(found)), float(np.mean(items))


def _estimates(pairs: list[tuple[float, float]]) -> str:
    if not pairs:
        return "none accepted"
    est, true = np.mean([p[0] for p in pairs]), np.mean([p[1] for p in pairs])
    return f"estimated {est:+.3f} for a true {true:+.3f}"


def rows(searches: int, seed: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    graded = max(20, searches // 10)  # the sign-flip test of 10,000 patterns is slow: fewer searches

    def row(measure: str, before: str, after: str, target: str | None = None, met: bool | None = None) -> None:
        out.append({"measure": measure, "value": f"before: {before} | after: {after}", "target": target,
                    "met": met})

    for scenario, n in ((Scenario("n=100"), searches), (Scenario("n=200", items=200), searches),
                        (Scenario("graded, 4 runs", runs=4), graded)):
        ks = NOISE if scenario.runs == 1 else (1, 5, 20)
        rate_b, items_b = false_rate(scenario, n, seed, "before", ks=ks)
        rate_a, items_a = false_rate(scenario, n, seed, "after", ks=ks)
        for k in ks:
            row(f"false 'better', {k} pure-noise candidate(s), {scenario.name} ({n} searches)",
                f"{rate_b[k]:.3f}", f"{rate_a[k]:.3f}", f"<= {OWNER_ALPHA:g}", rate_a[k] <= OWNER_ALPHA)
        row(f"items per candidate, pure noise, {scenario.name}", f"{items_b:.0f}", f"{items_a:.0f}",
            f"<= {3 * items_b:.0f}", items_a <= 3 * items_b)
        for gain in GAINS if scenario.runs == 1 else (0.10,):
            by_b, est_b, _ = power(scenario, n, seed + 1, "before", gain)
            by_a, est_a, items_pa = power(scenario, n, seed + 1, "after", gain)
            at_b = ", ".join(f"#{i}: {by_b[i]:.2f}" for i in POSITIONS)
            at_a = ", ".join(f"#{i}: {by_a[i]:.2f}" for i in POSITIONS)
            goal = gain == 0.10 and scenario.items == 100
            row(f"power for a real {gain:+.2f} by position, {scenario.name} ({n} searches)", at_b, at_a,
                ">= 0.8 at every position" if goal else None, min(by_a.values()) >= 0.8 if goal else None)
            row(f"accepted gain's estimate, real {gain:+.2f}, {scenario.name}", _estimates(est_b),
                _estimates(est_a))
            row(f"items per candidate, real {gain:+.2f} after noise, {scenario.name}", f"{scenario.items}",
                f"{items_pa:.0f}")
    pre_b, pre_a = prescreened(searches, seed + 2, "before"), prescreened(searches, seed + 2, "after")
    row(f"false 'better', best of 20 noise scored outside, then submitted ({searches} searches)",
        f"{pre_b:.3f}", f"{pre_a:.3f}", f"<= {OWNER_ALPHA:g}", pre_a <= OWNER_ALPHA)
    split_b, split_a = split_campaigns(searches, seed + 3, "before"), split_campaigns(searches, seed + 3, "after")
    row(f"false 'better', 20 one-candidate campaigns of one owner ({searches} searches)", f"{split_b:.3f}",
        f"{split_a:.3f}", f"<= {OWNER_ALPHA:g}", split_a <= OWNER_ALPHA)
    mix_b, mix_a = mixed(searches, seed + 4, "before"), mixed(searches, seed + 4, "after")
    row(f"mixed search of 20 (5 real, 10 tied, 5 worse): false 'better' ({searches} searches)",
        f"{mix_b[0]:.3f}", f"{mix_a[0]:.3f}", f"<= {OWNER_ALPHA:g}", mix_a[0] <= OWNER_ALPHA)
    row("mixed search: real candidates accepted per search, items per candidate",
        f"{mix_b[1]:.2f}, {mix_b[2]:.0f}", f"{mix_a[1]:.2f}, {mix_a[2]:.0f}")
    return out


def main() -> None:
    simulation_main(__doc__, "searches", 1_000, rows, "an agent's search: before and after the confirmation pool")


if __name__ == "__main__":
    main()
