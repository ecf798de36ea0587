"""The dashboard's views: stage cards, loss curve, request page, leaderboard and its exports."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftbus.dashboard import views
from ftbus.dashboard.leaderboard import LEADERBOARD_COLUMNS, leaderboard, leaderboard_csv
from ftbus.dashboard.state import Hub, redact
from ftbus.stages import LABELS, PIPELINE
from shared.events import (
    BaselineComparison,
    BenchmarkScores,
    ErrorSample,
    EvalLossPoint,
    Feedback,
    JudgeInfo,
    JudgeResult,
    LlmCall,
    LlmUsage,
    LossHistory,
    Progress,
    Report,
    RequestContext,
    Stage,
    TaskSpec,
    TrainingMetrics,
    TrainLossPoint,
    Verdict,
    VerdictResult,
)
from shared.records import RequestRecord, StageTiming

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2] / "ftbus" / "dashboard"


def scores(value: float, subsets: dict[str, float] | None = None, higher: bool = True) -> BenchmarkScores:
    subsets = subsets or {"a": value}
    return BenchmarkScores(
        accuracy_summary={k: {"exact_match": v} for k, v in subsets.items()},
        primary_metric="exact_match", higher_is_better=higher, primary_value=value,
        error_samples=[ErrorSample(question="q", gold="1", model_output="2")],
    )


def completed(rid: str, value: float, *, base: float = 0.25, test: float | None = None, minute: int = 0,
              higher: bool = True, model: str = "m", bench: str = "b", train_s: float = 30.0,
              loss: list[float] | None = None) -> RequestRecord:
    result = VerdictResult(
        benchmark=scores(value, higher=higher),
        baseline=BaselineComparison(baseline=scores(base, higher=higher), primary_metric="exact_match",
                                    candidate_value=value, baseline_value=base, difference=value - base),
        training_metrics=TrainingMetrics.from_history(LossHistory(
            train=[TrainLossPoint(step=i + 1, loss=v) for i, v in enumerate(loss or [])],
            eval=[EvalLossPoint(step=len(loss or []), eval_loss=0.5)] if loss else [])),
    )
    verdict = Verdict(request_id=rid, status="completed", execution="exec", return_checking="rc", code="code",
                      raw_execution="raw", final_decision=value > base, result=result)
    submitted = T0 + timedelta(minutes=minute)
    return RequestRecord(
        request_id=rid, status="completed", stage="judge", task=TaskSpec(base_model=model, benchmark=bench),
        submitted_at=submitted, final_decision=value > base, verdict=verdict,
        benchmark_test=scores(test) if test is not None else None,
        stages={"data": StageTiming(started_at=submitted, finished_at=submitted + timedelta(seconds=2), ok=True,
                                    attempts=1),
                "train": StageTiming(started_at=submitted + timedelta(seconds=2),
                                     finished_at=submitted + timedelta(seconds=2 + train_s), ok=True, attempts=2)},
    )


def test_stage_card_reads_consumer_info_and_counts_idle_and_busy_workers() -> None:
    info = SimpleNamespace(num_pending=7, num_ack_pending=2, num_redelivered=1, num_waiting=3)
    stats = views.stage_stats_from_info("train", "ftbus-train", info)
    assert stats.to_json() == {"stage": "train", "label": LABELS["train"], "consumer": "ftbus-train", "pending": 7,
                               "in_flight": 2, "redeliveries": 1, "waiting": 3, "workers": 5, "error": None}


def test_stage_cards_and_timeline_follow_the_pipeline_table() -> None:
    """The cards' order and labels are the table's (ftbus/stages.py): the page keeps no list of its own."""
    assert views.STAGE_ORDER == tuple(spec.stage for spec in PIPELINE)
    cards = [views.StageStats(spec.stage, f"ftbus-{spec.stage}").to_json() for spec in PIPELINE]
    assert [(c["stage"], c["label"]) for c in cards] == [(spec.stage, spec.label) for spec in PIPELINE]


def test_leaderboard_ranks_by_validation_per_base_model_and_benchmark() -> None:
    records = [
        completed("r1", 0.5, test=0.4, minute=1),
        completed("r2", 0.9, test=0.7, minute=2),
        completed("r3", 0.7, minute=3),
        completed("r4", 0.9, minute=4),  # ties with r2: the earlier submission ranks first
        completed("x1", 0.2, bench="other"),
        RequestRecord(request_id="running", status="running", task=TaskSpec(base_model="m", benchmark="b")),
    ]
    boards = leaderboard(records)
    assert [(b["base_model"], b["benchmark"]) for b in boards] == [("m", "b"), ("m", "other")]
    rows = boards[0]["rows"]
    assert [r["request_id"] for r in rows] == ["r2", "r4", "r3", "r1"]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["baseline"] == 0.25 and rows[0]["difference"] == 0.9 - 0.25
    assert rows[0]["test"] == 0.7 and rows[1]["test"] is None
    assert rows[0]["train_s"] == 30.0
    assert boards[0]["protocol"] == "validation", "the board says which protocol produced its numbers"


def test_the_request_page_says_which_protocol_produced_each_split_s_numbers() -> None:
    record = completed("r1", 0.5, test=0.4)
    result = views.verdict_result(record)
    assert views.validation(result)["protocol"] == "validation"  # type: ignore[index]
    test = views.hidden_test_view(views.hidden_test_scores(record), None)
    assert test is not None and test["protocol"] == "validation"


def test_leaderboard_lower_is_better_ranks_ascending() -> None:
    rows = leaderboard([completed("a", 3.0, higher=False), completed("b", 1.0, higher=False)])[0]["rows"]
    assert [r["request_id"] for r in rows] == ["b", "a"]


def test_leaderboard_csv_has_every_row_in_rank_order() -> None:
    boards = leaderboard([completed("r1", 0.5, test=0.4), completed("r2", 0.8)])
    rows = list(csv.DictReader(io.StringIO(leaderboard_csv(boards))))
    assert [r["request_id"] for r in rows] == ["r2", "r1"]
    assert rows[0]["base_model"] == "m" and rows[0]["benchmark"] == "b" and rows[0]["primary_metric"] == "exact_match"
    assert float(rows[1]["test"]) == 0.4 and rows[0]["test"] == ""
    assert list(rows[0]) == list(LEADERBOARD_COLUMNS)


def test_loss_curve_is_live_from_progress_then_complete_from_history() -> None:
    record = RequestRecord(request_id="r", status="running", stage="train")
    buffer = views.LossBuffer()
    for step, loss in [(2, 1.5), (1, 2.0), (2, 1.5), (3, 1.2)]:
        buffer.add(Progress(request_id="r", stage=Stage.train, step=step, total=10, loss=loss))
    assert not buffer.add(Progress(request_id="r", stage=Stage.bench, step=4, loss=1.0))  # not training
    live = views.loss_curve(record, buffer)
    assert live["source"] == "live" and live["total"] == 10
    assert [p["step"] for p in live["train"]] == [1, 2, 3]
    # The record's own last progress fills a step the dashboard missed.
    record.progress = Progress(request_id="r", stage=Stage.train, step=4, total=10, loss=1.0)
    assert [p["step"] for p in views.loss_curve(record, buffer)["train"]] == [1, 2, 3, 4]
    done = completed("r", 0.5, loss=[2.0, 1.6, 1.3, 1.1, 1.0])
    history = views.loss_curve(done, buffer)
    assert history["source"] == "history"
    assert [p["loss"] for p in history["train"]] == [2.0, 1.6, 1.3, 1.1, 1.0]
    assert history["eval"] == [{"step": 5, "loss": 0.5}]
    assert views.loss_curve(RequestRecord(request_id="q"), None)["source"] == "none"


def test_request_detail_has_scores_baseline_test_texts_and_timeline() -> None:
    record = completed("r", 0.75, base=0.25, test=0.6, loss=[1.0, 0.5])
    report = Report(**record.verdict.model_dump(exclude={"emitted_at", "schema_version"}),
                    benchmark_test=scores(0.65, {"a": 0.65}))
    detail = views.request_detail(record, report=report, logs=[{"name": "training.log"}])
    assert detail["validation"]["rows"] == [
        {"subset": "a", "metric": "exact_match", "candidate": 0.75, "baseline": 0.25, "difference": 0.5}]
    assert detail["validation"]["difference"] == 0.5
    assert detail["test"]["primary_value"] == 0.65  # the report's, read as `ftbus get --report` does
    assert detail["feedback"] == {"execution": "exec", "return_checking": "rc", "code": "code",
                                  "raw_execution": "raw"}
    assert [(t["stage"], t["attempts"], t["duration_s"], t["offset_s"]) for t in detail["timeline"]] == [
        ("data", 1, 2.0, 0.0), ("train", 2, 30.0, 2.0)]
    assert detail["error_samples"] == [{"question": "q", "gold": "1", "model_output": "2", "extracted": None}]
    assert detail["loss"]["source"] == "history" and len(detail["loss"]["train"]) == 2
    assert detail["logs"] == [{"name": "training.log"}]
    # The overview never carries test-split data.
    # (As numbers of their own: a timestamp such as 21:43:10.621 holds "0.6" too.)
    test_values = re.compile(r"(?<![\d.])0\.65?(?!\d)")
    assert not test_values.search(str(views.overview([record], [], 0, {}, T0)))
    assert not test_values.search(str(views.request_row(record)))


def test_overview_lists_newest_first_with_counts_and_the_newest_progress() -> None:
    old, new = completed("old", 0.5, minute=1), RequestRecord(
        request_id="new", status="running", stage="train", submitted_at=T0 + timedelta(minutes=5),
        progress=Progress(request_id="new", stage=Stage.train, step=1, total=4, loss=2.0, emitted_at=T0))
    seen = Progress(request_id="new", stage=Stage.train, step=3, total=4, loss=1.0, emitted_at=T0 + timedelta(1))
    out = views.overview([old, new], [views.StageStats("data", "ftbus-data", pending=1)], 2,
                         {"connected": True}, T0, seen={"new": seen})
    assert [r["request_id"] for r in out["requests"]] == ["new", "old"]
    assert out["counts"] == {"running": 1, "completed": 1}
    assert out["dead_letters"] == 2 and out["stages"][0]["pending"] == 1
    assert out["requests"][0]["progress"]["step"] == 3
    assert out["requests"][1]["progress"] is None


def test_redact_hides_passwords_in_nats_urls() -> None:
    assert redact("nats://dashboard:s3cret@nats:4222") == "nats://dashboard:***@nats:4222"
    assert redact("nats://a:4222,nats://u:p@b:4222") == "nats://a:4222,nats://u:***@b:4222"


async def test_hub_fans_notices_out_to_every_listener() -> None:
    hub = Hub()
    async with hub.listen() as one, hub.listen() as two:
        hub.publish({"type": "records"})
        # Queued by the publish itself: there at once, no wait (get_nowait raises QueueEmpty if not).
        assert one.get_nowait() == {"type": "records"}
        assert two.get_nowait() == {"type": "records"}
        assert hub.listeners == 2
    assert hub.listeners == 0


def test_pages_load_scripts_and_styles_only_from_the_dashboard_itself() -> None:
    """Offline: no CDN; plotly.js is served from the installed plotly wheel."""
    from ftbus.dashboard.app import plotly_js

    assert plotly_js().stat().st_size > 1_000_000
    files = [*ROOT.glob("templates/*.html"), *ROOT.glob("static/*")]
    assert len(files) >= 9
    for path in files:
        text = path.read_text()
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", text), path
        assert not re.search(r"https?://", text), path


def test_request_detail_says_what_sandbox_the_code_ran_in_and_what_its_llm_calls_spent() -> None:
    record = completed("r", 0.75)
    usage = LlmUsage(calls=[LlmCall(model="m", prompt_tokens=10, completion_tokens=5)], requests=1,
                     prompt_tokens=10, completion_tokens=5, refused=2, budget_requests=3)
    verdict = record.verdict.model_copy(update={"sandbox": "docker:ftbus-sandbox:latest", "llm_usage": usage})
    detail = views.request_detail(record, verdict=verdict)
    assert detail["sandbox"] == "docker:ftbus-sandbox:latest"
    assert detail["llm_usage"]["requests"] == 1 and detail["llm_usage"]["refused"] == 2
    assert "calls" not in detail["llm_usage"]  # the totals; each call's prompt is not the page's business
    # Before the verdict, the judge's; with neither, nothing.
    record.verdict = None
    record.judge = JudgeResult(
        request_id="r", context=RequestContext(task=TaskSpec(base_model="m", benchmark="b"), workspace=[]),
        feedback=Feedback(execution="e", return_checking="r", code="c", final_decision=True),
        judge=JudgeInfo(kind="rules", rules_decision=True), result=VerdictResult(), sandbox="local")
    assert views.request_detail(record)["sandbox"] == "local"
    record.judge = None
    assert views.request_detail(record)["sandbox"] is None


# ---------------------------------------------------------------------- intervals and ties on the leaderboard


def wilson_by_inversion(share: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson's interval by its definition, not its closed form: every p whose score test accepts the
    observed share, |share - p| <= z sqrt(p (1 - p) / n), found on a fine grid and refined by bisection."""
    def accepts(p: float) -> bool:
        return abs(share - p) <= z * (p * (1 - p) / n) ** 0.5

    grid = [i / 20000 for i in range(20001)]
    inside = [p for p in grid if accepts(p)]

    def edge(outside: float, inside_p: float) -> float:
        for _ in range(60):
            mid = (outside + inside_p) / 2
            outside, inside_p = (outside, mid) if accepts(mid) else (mid, inside_p)
        return inside_p

    low = inside[0] if inside[0] == 0.0 else edge(inside[0] - 1 / 20000, inside[0])
    high = inside[-1] if inside[-1] == 1.0 else edge(inside[-1] + 1 / 20000, inside[-1])
    return low, high


def test_a_rows_own_interval_is_never_a_point() -> None:
    """Every item right: mean +- 1.96 standard errors was [1.0000, 1.0000]; Wilson's interval is not."""
    perfect = itemised("own-perfect", [1.0] * 16, minute=1)
    rows = leaderboard([perfect])[0]["rows"]
    lo, hi = rows[0]["interval"]
    assert hi == 1.0 and lo < 0.85 and (lo, hi) == pytest.approx(wilson_by_inversion(1.0, 16), abs=1e-5)
    # Subsets weighing the same count as their effective items (Kish: 1 / sum w^2): 10 and 6 items -> 15.
    two = itemised("own-two", [1.0] * 10, minute=2)
    bench = two.verdict.result.benchmark
    from shared.events import RunStats

    bench.run_stats = {"a": RunStats(items=10, num_runs=1, mean=1.0, stderr=0.0),
                       "b": RunStats(items=6, num_runs=1, mean=0.5, stderr=0.2)}
    bench.overall = RunStats(items=16, num_runs=1, mean=0.75, stderr=0.1)
    (row,) = leaderboard([two])[0]["rows"]
    assert tuple(row["interval"]) == pytest.approx(wilson_by_inversion(0.75, 15), abs=1e-5)


def itemised(rid: str, outcomes: list[float], *, minute: int = 0, ids: list[str] | None = None) -> RequestRecord:
    """A completed request whose verdict has per-item outcomes (one run each) and their mean and stderr."""
    from shared.events import RunStats
    from shared.statistics import mean_stderr

    record = completed(rid, sum(outcomes) / len(outcomes), minute=minute)
    mean, stderr = mean_stderr(outcomes)
    bench = record.verdict.result.benchmark
    bench.item_scores = {"a": {i: [v] for i, v in zip(ids or [str(n) for n in range(len(outcomes))], outcomes,
                                                       strict=True)}}
    bench.overall = RunStats(items=len(outcomes), num_runs=1, mean=mean, stderr=stderr)
    return record


def test_a_candidate_inside_the_noise_of_the_leader_is_tied_by_the_paired_comparison() -> None:
    leader = itemised("lb-lead", [1.0] * 30 + [0.0] * 10, minute=1)
    close = itemised("lb-close", [1.0] * 29 + [0.0] * 11, minute=2)  # one item fewer right: noise
    far = itemised("lb-far", [1.0] * 10 + [0.0] * 30, minute=3)  # 20 items fewer, none more
    rows = leaderboard([far, close, leader])[0]["rows"]
    assert [r["request_id"] for r in rows] == ["lb-lead", "lb-close", "lb-far"]
    assert [r["standing"] for r in rows] == ["leader", "tied", "behind"]
    assert [r["tie_basis"] for r in rows] == [None, "paired", "paired"]
    assert rows[0]["vs_leader"] is None
    tied, behind = rows[1]["vs_leader"], rows[2]["vs_leader"]
    assert tied["difference"] == -0.025 and tied["ci_low"] <= 0 <= tied["ci_high"] and tied["p_value"] == 1.0
    assert tied["items"] == 40 and tied["summary"].startswith("not distinguishable from the leader")
    assert behind["difference"] == -0.5 and behind["ci_high"] < 0 and behind["p_value"] < 0.001
    assert behind["summary"].startswith("worse than the leader by -0.50")
    # Each row's own interval: the mean over items +- 1.96 standard errors.
    lo, hi = rows[0]["interval"]
    assert (lo, hi) == pytest.approx(wilson_by_inversion(0.75, 40), abs=1e-5)
    # The exports carry the same: the CSV as plain columns.
    csv_rows = list(csv.DictReader(io.StringIO(leaderboard_csv(leaderboard([far, close, leader])))))
    assert [r["standing"] for r in csv_rows] == ["leader", "tied", "behind"]
    assert float(csv_rows[1]["vs_leader_difference"]) == -0.025 and csv_rows[0]["vs_leader_difference"] == ""
    assert float(csv_rows[2]["vs_leader_ci_high"]) == behind["ci_high"] and csv_rows[2]["vs_leader_items"] == "40"
    assert float(csv_rows[0]["ci_low"]) == lo and float(csv_rows[0]["ci_high"]) == hi


def test_without_shared_items_a_row_has_no_standing() -> None:
    leader = itemised("lb2-lead", [1.0] * 16 + [0.0] * 4, minute=1)
    # Other items (another version of the benchmark, say): no pairing, and overlapping intervals are no test.
    overlapping = itemised("lb2-near", [1.0] * 14 + [0.0] * 6, minute=2, ids=[f"x{i}" for i in range(20)])
    apart = itemised("lb2-apart", [1.0] * 1 + [0.0] * 19, minute=3, ids=[f"y{i}" for i in range(20)])
    unknown = completed("lb2-plain", 0.1, minute=4)  # no per-item outcomes and no standard error
    rows = leaderboard([leader, overlapping, apart, unknown])[0]["rows"]
    by_id = {r["request_id"]: r for r in rows}
    for rid in ("lb2-near", "lb2-apart"):
        assert by_id[rid]["standing"] is None and by_id[rid]["tie_basis"] is None and by_id[rid]["vs_leader"] is None
        assert "0 shared" in by_id[rid]["vs_leader_note"] and by_id[rid]["interval"] is not None
    assert by_id["lb2-plain"]["standing"] is None and by_id["lb2-plain"]["interval"] is None
    assert "has no per-item outcomes" in by_id["lb2-plain"]["vs_leader_note"]


def test_the_request_page_has_the_paired_comparison_with_the_base_model_in_words() -> None:
    from shared.paired import compare_scores

    record = itemised("lb3-req", [1.0] * 12 + [0.0] * 8)
    comparison = record.verdict.result.baseline
    base = itemised("lb3-base", [1.0] * 2 + [0.0] * 18).verdict.result.benchmark
    comparison.baseline = base
    comparison.paired, comparison.summary = compare_scores(record.verdict.result.benchmark, base)
    shown = views.request_detail(record)["validation"]
    assert shown["summary"] == comparison.summary and shown["summary"].startswith("better than the base model by +0.50")
    assert shown["paired"]["difference"] == 0.5 and shown["paired"]["items"] == 20
    assert shown["paired"]["direction"] == "better" and shown["paired"]["test"] == "mcnemar"
    assert views.request_detail(completed("lb3-none", 0.5))["validation"]["paired"] is None


def _closed_testing(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's rejections by their definition, independently: the closure of Bonferroni tests. H_i is
    rejected iff every intersection hypothesis that contains it is, i.e. for every subset S holding i,
    min over S of p_j < alpha / |S| (every subset enumerated)."""
    from itertools import combinations

    k = len(p_values)
    rejected = []
    for i in range(k):
        others = [j for j in range(k) if j != i]
        rejected.append(all(min(p_values[j] for j in (i, *subset)) < alpha / (1 + len(subset))
                            for size in range(k) for subset in combinations(others, size)))
    return rejected


def test_holm_rejects_what_closed_testing_rejects_and_its_levels_say_so() -> None:
    import random

    from shared.statistics import holm

    rng = random.Random(36)
    for _ in range(400):
        k = rng.randint(1, 6)
        p = [rng.choice((rng.random() * 0.06, rng.random())) for _ in range(k)]
        rejected, levels = holm(p, 0.05)
        assert rejected == _closed_testing(p, 0.05), p
        # Each p is tested at its level: rejected exactly when below it (the board's intervals rely on it).
        assert [pi < level for pi, level in zip(p, levels, strict=True)] == rejected, (p, levels)
        assert all(0.05 / k <= level <= 0.05 for level in levels)


def test_the_leaderboard_corrects_its_comparisons_with_the_leader_for_multiplicity() -> None:
    """One row loses 6 discordant items to the leader and wins none: McNemar's p = 2/64 = 0.031. Alone
    against the leader it is behind at 95%; on a board of five rows Holm tests every one of the 10 pairs,
    the row's four comparisons (with the leader and its three copies) all at p = 0.031, so it is tested
    at 0.05 / 10 and tied, its interval (at that level) holding 0."""
    leader = [1.0] * 40 + [0.0] * 20
    worse = [0.0] * 6 + [1.0] * 34 + [0.0] * 20  # 6 of the leader's right items wrong
    alone = leaderboard([itemised("h-lead", leader, minute=1), itemised("h-worse", worse, minute=2)])
    (row,) = alone[0]["rows"][1:]
    assert row["standing"] == "behind" and row["vs_leader"]["p_value"] == pytest.approx(2 / 64)
    assert row["vs_leader"]["level"] == pytest.approx(0.95) and row["vs_leader"]["comparisons"] == 1
    # Three more candidates, identical to the leader (p = 1 with it): now 10 pairs in the family.
    copies = [itemised(f"h-copy{i}", leader, minute=3 + i) for i in range(3)]
    crowded = leaderboard([itemised("h-lead", leader, minute=1), itemised("h-worse", worse, minute=2), *copies])
    by_id = {r["request_id"]: r for r in crowded[0]["rows"]}
    shown = by_id["h-worse"]["vs_leader"]
    assert by_id["h-worse"]["standing"] == "tied" and shown["comparisons"] == 10
    assert shown["level"] == pytest.approx(1 - 0.05 / 10)  # the smallest p of ten: Bonferroni's level
    assert shown["ci_low"] <= 0.0 <= shown["ci_high"] and shown["p_value"] == pytest.approx(2 / 64)
    assert all(by_id[f"h-copy{i}"]["standing"] == "tied" for i in range(3))
    # Far behind stays behind whatever the family: p = 2 / 2^30 against the leader and each copy, below
    # every level Holm's first five steps of 15 pairs give.
    far = [0.0] * 30 + [1.0] * 10 + [0.0] * 20
    five = leaderboard([itemised("h-lead", leader, minute=1), itemised("h-worse", worse, minute=2), *copies,
                              itemised("h-far", far, minute=9)])
    rows = {r["request_id"]: r for r in five[0]["rows"]}
    assert rows["h-far"]["standing"] == "behind" and rows["h-far"]["vs_leader"]["ci_high"] < 0
    assert 1 - 0.05 / 11 - 1e-12 <= rows["h-far"]["vs_leader"]["level"] <= 1 - 0.05 / 15 + 1e-12
