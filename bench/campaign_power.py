"""A campaign's false-SOTA rate and the power it leaves, by simulation (numpy, seeded; seconds).

A campaign tests each candidate against its incumbent on the same validation items, at the online
fallback procedure's level alpha_i (shared/online_testing.py): one-sided, McNemar's exact test, as
the judge does for items scored right or wrong (``compare_scores`` at level 1 - 2 alpha_i and
``improves()``: tests/unit/test_online_testing.py checks that the two agree).

The model: n items, the base model right on each with probability 1/2 (drawn once per campaign:
the validation split is fixed); a candidate differs from its incumbent on a share ``disagreement``
of the items. A pure-noise candidate flips right and wrong items alike; a candidate better by
+delta flips wrong items to right more often, by exactly delta on average.

- **false-SOTA rate**: the share of campaigns of k pure-noise candidates in which any is accepted,
  for k = 1, 5, 10, 20 (target: at most campaign alpha, 0.05), against the same candidates each
  tested at p < 0.05 (``judge_policy=significant`` without a campaign).
- **power**: the chance that a candidate better than the incumbent by +0.05 or +0.10 is accepted at
  position i = 1, 5, 10, 20 of a campaign whose earlier candidates were not accepted (alpha_i =
  alpha * 6 / (pi^2 i^2)), against a single test at p < 0.05.

    .venv/bin/python bench/campaign_power.py [--campaigns 10000] [--items 200] [--disagreement 0.2] [--json]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import emit  # noqa: E402
from shared.online_testing import CAMPAIGN_ALPHA, OnlineState  # noqa: E402

NOISE_CAMPAIGNS = (1, 5, 10, 20)
POSITIONS = (1, 5, 10, 20)
GAINS = (0.05, 0.10)


def upper_tails(n: int) -> np.ndarray:
    """tails[m, b] = P(Binomial(m, 1/2) >= b), exact (integers, one division), for 0 <= b <= m <= n."""
    tails = np.zeros((n + 1, n + 2))
    for m in range(n + 1):
        total = 2**m
        running = 0
        for b in range(m, -1, -1):
            running += math.comb(m, b)
            tails[m, b] = running / total
    return tails


def accepted(better: np.ndarray, worse: np.ndarray, level: float, tails: np.ndarray) -> np.ndarray:
    """McNemar's one-sided exact test at ``level``: the candidate won ``better`` of the discordant items
    and lost ``worse``; two-sided p = 2 P(X >= better) < 2 level, as ``improves()`` at 1 - 2 level."""
    m = better + worse
    return (better > worse) & (tails[m, better] < level)


def candidates(rng: np.random.Generator, base: np.ndarray, gain: float, disagreement: float,
               ) -> tuple[np.ndarray, np.ndarray]:
    """(items won, items lost) against ``base`` (campaigns x items, right or wrong) of one candidate per
    campaign: it flips a wrong item to right with probability disagreement + gain, a right one to wrong
    with disagreement - gain (so with the base right half the time it differs on ``disagreement`` of
    the items and gains ``gain``)."""
    up, down = disagreement + gain, disagreement - gain
    if not (0.0 <= down and up <= 1.0):
        raise ValueError(f"a gain of {gain} needs a disagreement of at least {gain}")
    flip = rng.random(base.shape)
    won = (~base) & (flip < up)
    lost = base & (flip < down)
    return won.sum(axis=1), lost.sum(axis=1)


def levels(count: int, alpha: float = CAMPAIGN_ALPHA) -> list[float]:
    """The procedure's levels for ``count`` tests none of which is accepted."""
    state, out = OnlineState(alpha=alpha), []
    for _ in range(count):
        out.append(state.next_level())
        state = state.after(accepted=False)
    return out


def false_sota(campaigns: int, items: int, disagreement: float, seed: int) -> dict[int, tuple[float, float]]:
    """k -> (the procedure's false-SOTA rate, each candidate at p < 0.05) over campaigns of k noise candidates."""
    rng = np.random.default_rng(seed)
    tails = upper_tails(items)
    longest = max(NOISE_CAMPAIGNS)
    procedure_levels = levels(longest)
    base = rng.random((campaigns, items)) < 0.5
    hit_procedure = np.zeros((campaigns, longest), dtype=bool)
    hit_plain = np.zeros((campaigns, longest), dtype=bool)
    for i in range(longest):
        # Until a false acceptance every candidate is compared with the base model: nothing else was accepted.
        won, lost = candidates(rng, base, 0.0, disagreement)
        hit_procedure[:, i] = accepted(won, lost, procedure_levels[i], tails)
        hit_plain[:, i] = accepted(won, lost, 0.025, tails)  # two-sided p < 0.05, on the better side
    return {k: (float(hit_procedure[:, :k].any(axis=1).mean()), float(hit_plain[:, :k].any(axis=1).mean()))
            for k in NOISE_CAMPAIGNS}


def power(campaigns: int, items: int, disagreement: float, seed: int) -> dict[float, dict[int | str, float]]:
    """gain -> {position: the chance it is accepted there, "single": at p < 0.05 alone}."""
    rng = np.random.default_rng(seed)
    tails = upper_tails(items)
    procedure_levels = levels(max(POSITIONS))
    out: dict[float, dict[int | str, float]] = {}
    for gain in GAINS:
        base = rng.random((campaigns, items)) < 0.5
        won, lost = candidates(rng, base, gain, disagreement)
        row: dict[int | str, float] = {i: float(accepted(won, lost, procedure_levels[i - 1], tails).mean())
                                       for i in POSITIONS}
        row["single"] = float(accepted(won, lost, 0.025, tails).mean())
        out[gain] = row
    return out


def rows(campaigns: int, items: int, disagreement: float, seed: int = 0) -> list[dict[str, Any]]:
    setting = f"n = {items}, {disagreement:.0%} of items differ, {campaigns:,} campaigns"
    out: list[dict[str, Any]] = []
    for k, (rate, plain) in false_sota(campaigns, items, disagreement, seed).items():
        out.append({"measure": f"false-SOTA rate, {k} pure-noise candidate{'s' if k > 1 else ''} ({setting})",
                    "value": f"{rate:.3f} (each at p < 0.05: {plain:.3f})",
                    "target": f"<= {CAMPAIGN_ALPHA:g}", "met": rate <= CAMPAIGN_ALPHA})
    for gain, row in power(campaigns, items, disagreement, seed + 1).items():
        at = ", ".join(f"#{i}: {row[i]:.2f}" for i in POSITIONS)
        out.append({"measure": f"power for a real {gain:+.2f}, by position in the campaign ({setting})",
                    "value": f"{at} (a single test at p < 0.05: {row['single']:.2f})",
                    "target": None, "met": None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaigns", type=int, default=10_000, help="simulated campaigns per measure")
    parser.add_argument("--items", type=int, default=200, help="validation items")
    parser.add_argument("--disagreement", type=float, default=0.2, help="share of items a candidate differs on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()
    emit(rows(args.campaigns, args.items, args.disagreement, args.seed), args.json,
         "a campaign's false-SOTA rate and power")


if __name__ == "__main__":
    main()
