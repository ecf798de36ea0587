"""The leaderboard page and its CSV: per base model and benchmark, the requests ranked by their
validation score, each with its interval, its paired comparison with the leader and ties marked.

Pure functions, as in views.py, from the request records.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from ftbus.dashboard.views import hidden_test_scores, iso, paired_json, verdict_result
from shared.events import BenchmarkScores, Stage
from shared.paired import compare_scores, paired_p
from shared.power import effective_items
from shared.records import RequestRecord
from shared.retention import rank_key
from shared.statistics import PairedComparison, holm, score_interval

# ---------------------------------------------------------------------- leaderboard

LEADERBOARD_COLUMNS = (
    "base_model", "benchmark", "rank", "request_id", "primary_metric", "validation", "ci_low", "ci_high",
    "standing", "tie_basis", "vs_leader_difference", "vs_leader_ci_low", "vs_leader_ci_high", "vs_leader_p_value",
    "vs_leader_level", "vs_leader_items", "baseline", "difference", "test", "train_s", "final_decision", "status",
    "submitted_at",
)
#: The level of every interval on the leaderboard, and the family-wise level of its standings.
LEADERBOARD_LEVEL = 0.95
#: The rows (best first) whose every pair is tested; each row beyond them is tested against the leader
#: only, its other pairs counted in the family as tested and not rejected (which only makes Holm stricter).
ALL_PAIRS_ROWS = 30
# Paired comparisons with a leader, by (request, leader, level): both verdicts are final, so the result is too.
_PAIRED_CACHE: dict[tuple[str, str, float], tuple[PairedComparison | None, str]] = {}
_PAIRED_CACHE_MAX = 4096


def _own_interval(scores: BenchmarkScores) -> tuple[float, float] | None:
    """The headline's own 95% interval (``overall``: every subset weighing the same, as in
    ``primary_value``): Wilson's score interval on the estimand's effective items, which is never a
    point (16 of 16 right gives [0.81, 1.00], where mean +- 1.96 standard errors gave [1.00, 1.00]).
    None without ``overall`` or with fewer than two items."""
    overall = scores.overall
    if overall is None or overall.items < 2:
        return None
    sizes = [stats.items for stats in scores.run_stats.values()] or [overall.items]
    return score_interval(overall.mean, effective_items(sizes), LEADERBOARD_LEVEL)


def _paired_with_leader(rid: str, scores: BenchmarkScores, leader: str, leader_scores: BenchmarkScores,
                        final: bool, level: float = LEADERBOARD_LEVEL) -> tuple[PairedComparison | None, str]:
    key = (rid, leader, level)
    hit = _PAIRED_CACHE.get(key)  # one lookup: the dashboard computes boards in threads
    if hit is not None:
        return hit
    result = compare_scores(scores, leader_scores, level=level, other_name="the leader")
    if final:
        if len(_PAIRED_CACHE) >= _PAIRED_CACHE_MAX:
            _PAIRED_CACHE.clear()
        _PAIRED_CACHE[key] = result
    return result


def leader_levels(order: list[str], scores: dict[str, BenchmarkScores],
                  alpha: float = 1.0 - LEADERBOARD_LEVEL) -> dict[str, float]:
    """The level at which each row's comparison with the leader (``order[0]``, the best by score) is
    tested, for the rows that pair with it: Holm's step-down over every pair of rows (Holm 1979), so the
    chance that any two truly tied rows are called distinguishable is at most ``alpha``, whichever row
    the noise made the leader. (Holm over the comparisons with the leader alone did not hold it: the
    leader is picked on the very items it is tested on; 0.11 for 10 tied rows, 0.17 for 20,
    bench/leaderboard_rate.py.)

    Every pair among the first ALL_PAIRS_ROWS rows is tested, and each later row against the leader;
    the pairs left out count in the family as not rejected (p = 1)."""
    k = len(order)
    top = order[:ALL_PAIRS_ROWS]
    pairs = [(a, b) for i, a in enumerate(top) for b in top[i + 1:]] + [(order[0], b) for b in order[len(top):]]
    tested = [(pair, p) for pair in pairs if (p := paired_p(scores[pair[1]], scores[pair[0]])) is not None]
    untested = k * (k - 1) // 2 - len(pairs)  # pairs of later rows: never rejected, but in the family
    _, levels = holm([p for _, p in tested] + [1.0] * untested, alpha)
    return {pair[1]: level for (pair, _), level in zip(tested, levels, strict=False) if pair[0] == order[0]}


def _mark_ties(rows: list[dict[str, Any]], scores: dict[str, BenchmarkScores], final: dict[str, bool]) -> None:
    """Each row's standing against the board's leader (its first row), by the paired comparison on their
    shared items: ``tied`` when the two cannot be told apart, ``behind`` (or, rarely, ``ahead``) beyond
    noise, None when they cannot be paired (no per-item outcomes, other items: nothing to tell it by).

    The leader is the best of several noisy scores, so its comparisons are tested in the family of every
    pair of rows (``leader_levels``). Each row's interval is at the level Holm tested it at
    (``vs_leader.level``), so it excludes 0 exactly when the row is called distinguishable."""
    leader = rows[0]
    leader["standing"], leader["tie_basis"], leader["vs_leader"], leader["vs_leader_note"] = "leader", None, None, None
    lid = leader["request_id"]
    order = [row["request_id"] for row in rows]
    tested_at = leader_levels(order, scores)
    comparisons = len(rows) * (len(rows) - 1) // 2
    for row in rows[1:]:
        rid = row["request_id"]
        row["vs_leader"], row["vs_leader_note"] = None, None
        if rid not in tested_at:
            _, words = _paired_with_leader(rid, scores[rid], lid, scores[lid], final[rid] and final[lid])
            row["standing"], row["tie_basis"], row["vs_leader_note"] = None, None, words
            continue
        paired, words = _paired_with_leader(rid, scores[rid], lid, scores[lid], final[rid] and final[lid],
                                            level=1.0 - tested_at[rid])
        assert paired is not None  # the two paired for the p-value, so they pair at any level
        row["vs_leader"] = {**paired_json(paired), "summary": words, "comparisons": comparisons}
        row["standing"] = {"indistinguishable": "tied", "worse": "behind", "better": "ahead"}[paired.direction]
        row["tie_basis"] = "paired"


def leaderboard(records: Iterable[RequestRecord]) -> list[dict[str, Any]]:
    """One board per (base model, benchmark): candidates with a validation score, best first, each with
    its interval and its standing against the leader (``_mark_ties``)."""
    boards: dict[tuple[str, str], list[dict[str, Any]]] = {}
    scores: dict[str, BenchmarkScores] = {}
    final: dict[str, bool] = {}
    better: dict[tuple[str, str], bool] = {}
    metric: dict[tuple[str, str], str | None] = {}
    scorer: dict[tuple[str, str], str | None] = {}
    protocol: dict[tuple[str, str], str] = {}
    for record in records:
        result = verdict_result(record)
        if record.task is None or result is None or result.benchmark is None:
            continue
        value = result.benchmark.primary_value
        if value is None:
            continue
        key = (record.task.base_model, record.task.benchmark)
        comparison = result.baseline
        test = hidden_test_scores(record)
        train = record.stages.get(Stage.train.value)
        better[key] = result.benchmark.higher_is_better
        metric[key] = result.benchmark.primary_metric
        scorer[key] = result.benchmark.scorer
        protocol[key] = result.benchmark.protocol
        scores[record.request_id], final[record.request_id] = result.benchmark, record.terminal
        interval = _own_interval(result.benchmark)
        boards.setdefault(key, []).append({
            "request_id": record.request_id,
            "validation": value,
            "interval": list(interval) if interval else None,
            "baseline": comparison.baseline_value if comparison else None,
            "difference": comparison.difference if comparison else None,
            "test": test.primary_value if test else None,
            "train_s": train.duration_s if train else None,
            "final_decision": record.final_decision,
            "status": record.status,
            "submitted_at": iso(record.submitted_at),
        })
    out = []
    for key in sorted(boards):
        # The retention sweep keeps the outputs of each board's first row by the same rule.
        rows = sorted(boards[key], key=lambda r, up=better[key]: rank_key(r["validation"], up, r["submitted_at"] or "",
                                                                          r["request_id"]))
        for rank, row in enumerate(rows, 1):
            row["rank"] = rank
        _mark_ties(rows, scores, final)
        out.append({
            "base_model": key[0],
            "benchmark": key[1],
            "primary_metric": metric[key],
            "scorer": scorer[key],
            "protocol": protocol[key],
            "higher_is_better": better[key],
            "rows": rows,
        })
    return out


def leaderboard_csv(boards: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=LEADERBOARD_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for board in boards:
        for row in board["rows"]:
            writer.writerow({
                "base_model": board["base_model"],
                "benchmark": board["benchmark"],
                "primary_metric": board["primary_metric"],
                **{k: ("" if v is None else v) for k, v in _flat_row(row).items() if k in LEADERBOARD_COLUMNS},
            })
    return buffer.getvalue()


def _flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A leaderboard row with its intervals as plain columns, for the CSV."""
    interval, paired = row.get("interval"), row.get("vs_leader")
    flat = {**row, "ci_low": interval[0] if interval else None, "ci_high": interval[1] if interval else None}
    for name in ("difference", "ci_low", "ci_high", "p_value", "level", "items"):
        flat[f"vs_leader_{name}"] = paired[name] if paired else None
    return flat
