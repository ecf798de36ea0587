"""The leaderboard's stated rate, measured: how often a board of truly tied rows calls any of them
distinguishable from its leader, before (Holm over the comparisons with the leader alone) and after
(Holm over every pair of rows, ``ftbus.dashboard.leaderboard.leader_levels``), and how often a row
truly 0.15 behind is called behind.

The world: 200 validation items, each with its own difficulty (right with probability uniform in 0.2
to 0.9); every tied row is right on an item with that probability, independently; the rows are ranked
by their scores, as the board ranks them, so the leader is the luckiest. McNemar's exact test on each
pair, as on the board.

    .venv/bin/python bench/leaderboard_rate.py [--boards 1000] [--seed 0] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import simulation_main  # noqa: E402
from ftbus.dashboard.leaderboard import leader_levels  # noqa: E402
from shared.events import BenchmarkScores  # noqa: E402
from shared.paired import paired_p  # noqa: E402
from shared.statistics import holm  # noqa: E402

ITEMS = 200
ALPHA = 0.05
ROWS = (5, 10, 20)
BEHIND = 0.15


def _scores(outcomes: np.ndarray) -> BenchmarkScores:
    items = {"a": {f"i{k}": [float(v)] for k, v in enumerate(outcomes)}}
    mean = float(outcomes.mean())
    return BenchmarkScores(accuracy_summary={"a": {"acc": mean}}, primary_metric="acc", primary_value=mean,
                           item_scores=items)


def board(rng: np.random.Generator, rows: int, behind: int = 0) -> tuple[list[str], dict[str, BenchmarkScores]]:
    """One board: ``rows`` rows, the last ``behind`` of them truly BEHIND worse; ranked best first."""
    difficulty = rng.uniform(0.2, 0.9, ITEMS)
    outcomes = {}
    for r in range(rows):
        chance = np.clip(difficulty - (BEHIND if r >= rows - behind else 0.0), 0.0, 1.0)
        outcomes[f"row{r}"] = (rng.random(ITEMS) < chance).astype(float)
    order = sorted(outcomes, key=lambda rid: (-outcomes[rid].mean(), rid))
    return order, {rid: _scores(values) for rid, values in outcomes.items()}


def called(order: list[str], scores: dict[str, BenchmarkScores], how: str) -> set[str]:
    """The rows called distinguishable from the leader: ``before`` or ``after``."""
    leader = order[0]
    p = {rid: paired_p(scores[rid], scores[leader]) for rid in order[1:]}
    if how == "before":
        rejected, _ = holm([p[rid] for rid in order[1:]], ALPHA)  # type: ignore[misc]
        return {rid for rid, r in zip(order[1:], rejected, strict=True) if r}
    levels = leader_levels(order, scores, alpha=ALPHA)
    return {rid for rid in order[1:] if p[rid] is not None and p[rid] < levels[rid]}  # type: ignore[operator]


def rates(boards: int, rows: int, seed: int) -> dict[str, float]:
    """The share of tied boards with any row called distinguishable (before, after), and the share of
    boards whose one truly behind row is called behind (before, after)."""
    rng = np.random.default_rng(seed + rows)
    false = {"before": 0, "after": 0}
    found = {"before": 0, "after": 0}
    for _ in range(boards):
        order, scores = board(rng, rows)
        for how in false:
            false[how] += bool(called(order, scores, how))
        order, scores = board(rng, rows, behind=1)
        for how in found:
            found[how] += f"row{rows - 1}" in called(order, scores, how)
    return {f"false_{how}": false[how] / boards for how in false} | {f"power_{how}": found[how] / boards
                                                                       for how in found}


def rows_of(boards: int, seed: int) -> list[dict[str, Any]]:
    out = []
    for rows in ROWS:
        measured = rates(boards, rows, seed)
        out.append({"measure": f"{rows} tied rows: any called distinguishable from the leader, before -> after",
                    "value": f"{measured['false_before']:.3f} -> {measured['false_after']:.3f}",
                    "target": f"<= {ALPHA}", "met": measured["false_after"] <= ALPHA + 2 * (0.05 / boards) ** 0.5})
        out.append({"measure": f"{rows} rows, one truly {BEHIND:.2f} behind: called behind, before -> after",
                    "value": f"{measured['power_before']:.3f} -> {measured['power_after']:.3f}",
                    "target": None, "met": None})
    return out


def main() -> None:
    simulation_main(__doc__, "boards", 1_000, rows_of, "the leaderboard's family-wise rate, measured")


if __name__ == "__main__":
    main()
