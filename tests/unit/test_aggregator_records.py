"""The aggregator: its record transitions (pure), and the aggregator itself on the in-memory bus
(tests/memory_bus.py): what a user sees of a request (its record, its public view, one verdict and
one report) whatever order and however often its events arrive. Failover, several aggregators and
the sweeper's bucket scan run against a real server: tests/integration/test_concurrent_stages.py,
tests/integration/test_sweeper.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from ftbus.stages import BY_STAGE, PIPELINE
from services.aggregator import transitions as agg
from services.aggregator.open_records import is_open
from services.aggregator.service import Aggregator
from services.aggregator.store import Contention, RecordStore
from services.aggregator.verdicts import build_report, report_ready
from shared.events import (
    BenchmarkScores,
    BenchResult,
    CancelRequested,
    DataSummary,
    DeadLetter,
    EvalRequested,
    Feedback,
    JudgeInfo,
    JudgeResult,
    Progress,
    RequestContext,
    Stage,
    TaskSpec,
    TrainSummary,
    VerdictResult,
)
from shared.records import RequestRecord, RequestStatusView
from tests.fakes import judge_events as ev
from tests.memory_bus import MemoryBus, memory_settings

CONTEXT = RequestContext(task=TaskSpec(base_model="m", benchmark="b"), workspace=[])


def judge_result(decision: bool = True, expects_test: bool = True) -> JudgeResult:
    return JudgeResult(
        request_id="r1",
        context=CONTEXT,
        feedback=Feedback(execution="SUCCESS", return_checking="ok", code="fine", final_decision=decision),
        judge=JudgeInfo(kind="rules", rules_decision=decision),
        result=VerdictResult(),
        expects_test=expects_test,
    )


def test_the_first_verdict_wins_whatever_comes_later() -> None:
    record = RequestRecord(request_id="r1")
    agg.on_judge(record, judge_result(True), BY_STAGE[Stage.judge])
    agg.on_dead_letter(record, DeadLetter(request_id="r1", original_subject="x", stage=Stage.train, reason="boom"),
                       BY_STAGE[Stage.train])
    agg.on_cancel(record, CancelRequested(request_id="r1"), None)
    assert record.verdict is not None and record.verdict.status == "completed"
    assert record.final_decision is True and record.cancel_requested is True


def test_a_dead_letter_becomes_an_error_verdict_naming_the_stage() -> None:
    record = RequestRecord(request_id="r1", stage="train")
    letter = DeadLetter(request_id="r1", original_subject="x", stage=Stage.train, reason="disk full")
    agg.on_dead_letter(record, letter, BY_STAGE[Stage.train])
    assert record.verdict is not None
    assert record.verdict.status == "error" and record.verdict.failed_stage == "training"
    assert "disk full" in record.verdict.execution and record.verdict.final_decision is False


def test_cancel_names_the_running_stage() -> None:
    record = RequestRecord(request_id="r1", stage="bench")
    agg.on_cancel(record, CancelRequested(request_id="r1", reason="not needed"), BY_STAGE[Stage.bench])
    assert record.verdict is not None and record.verdict.status == "cancelled"
    assert record.verdict.failed_stage == "benchmark" and "not needed" in record.verdict.execution


def test_the_report_waits_for_the_test_split_then_carries_it() -> None:
    record = RequestRecord(request_id="r1")
    agg.on_judge(record, judge_result(expects_test=True), BY_STAGE[Stage.judge])
    assert not report_ready(record)
    test = BenchResult(request_id="r1", ok=True, split="test", context=CONTEXT, data=DataSummary(),
                       train=TrainSummary(), benchmark=BenchmarkScores(accuracy_summary={"s": {"acc": 0.5}}))
    agg.on_test(record, test)
    assert report_ready(record)
    report = build_report(record)
    assert report.benchmark_test is not None and report.benchmark_test.accuracy_summary == {"s": {"acc": 0.5}}
    assert report.final_decision is True


def test_the_public_view_carries_the_status_and_never_the_hidden_test_split() -> None:
    """Workers and agents read the status bucket: it must say where the request is, and nothing of
    what the hidden test split said, the report or the verdict's reasons."""
    record = RequestRecord(request_id="r1")
    agg.on_judge(record, judge_result(expects_test=True), BY_STAGE[Stage.judge])
    test = BenchResult(request_id="r1", ok=True, split="test", context=CONTEXT, data=DataSummary(),
                       train=TrainSummary(), benchmark=BenchmarkScores(accuracy_summary={"secret": {"acc": 0.93}}))
    agg.on_test(record, test)
    record.report = build_report(record)
    view = json.loads(record.public_view_json())
    assert view == json.loads(record.public_view().model_dump_json())
    assert view["status"] == "completed" and view["final_decision"] is True
    assert set(view) == set(RequestStatusView.model_fields)
    assert "secret" not in record.public_view_json().decode() and "0.93" not in record.public_view_json().decode()


def test_no_test_split_expected_after_an_early_failure() -> None:
    record = RequestRecord(request_id="r1")
    agg.on_judge(record, judge_result(decision=False, expects_test=False), BY_STAGE[Stage.judge])
    assert report_ready(record)


def test_progress_after_the_verdict_does_not_reopen_the_request() -> None:
    from shared.events import Progress

    record = RequestRecord(request_id="r1")
    agg.on_judge(record, judge_result(), BY_STAGE[Stage.judge])
    agg.on_progress(record, Progress(request_id="r1", stage=Stage.train, state="started"))
    assert record.status == "completed"


def test_a_stage_s_result_tells_its_start_and_attempts() -> None:
    """A stage's result carries its start and attempt (StageRun): the timeline holds them when its
    progress (at most once) was lost. An announced start that came later than the result's loses
    to it, and a retry's later start never replaces the first attempt's."""
    from datetime import timedelta

    from shared.events import DataResult, Progress, StageRun, utcnow

    t0 = utcnow()
    record = RequestRecord(request_id="r1")
    quick = DataResult(request_id="r1", ok=False, context=CONTEXT, data=DataSummary(),
                       runs={"data_processing": StageRun(started_at=t0, attempt=1)})
    agg.on_stage_result(record, quick, BY_STAGE[Stage.data], Stage.judge)
    assert record.stages["data"].started_at == t0 and record.stages["data"].attempts == 1
    assert record.stages["data"].duration_s is not None

    judge = judge_result()
    judge.runs = {"judge": StageRun(started_at=t0 + timedelta(seconds=2), attempt=3)}
    agg.on_judge(record, judge, BY_STAGE[Stage.judge])
    assert record.stages["judge"].attempts == 3
    assert record.stages["judge"].started_at == t0 + timedelta(seconds=2)

    record = RequestRecord(request_id="r2")
    announced = Progress(request_id="r2", stage=Stage.data, state="started", emitted_at=t0 + timedelta(seconds=1))
    agg.on_progress(record, announced)
    late_retry = DataResult(request_id="r2", ok=True, context=CONTEXT, data=DataSummary(),
                            runs={"data_processing": StageRun(started_at=t0 + timedelta(seconds=30), attempt=2)})
    agg.on_stage_result(record, late_retry, BY_STAGE[Stage.data], Stage.judge)
    assert record.stages["data"].started_at == t0 + timedelta(seconds=1)
    assert record.stages["data"].attempts == 2
    first = DataResult(request_id="r2", ok=True, context=CONTEXT, data=DataSummary(),
                       runs={"data_processing": StageRun(started_at=t0, attempt=1)})
    agg.on_stage_result(record, first, BY_STAGE[Stage.data], Stage.judge)
    assert record.stages["data"].started_at == t0 and record.stages["data"].attempts == 2


@pytest.mark.parametrize("stage", ["x" * 1000, "Train", "train; rm -rf /", ""])
def test_a_forged_stage_name_is_refused_before_it_reaches_a_record(stage: str) -> None:
    """Events name stages in plain strings (a pipeline may add stages): a progress message or a
    stage result naming anything but a short lowercase name does not decode."""
    from shared import codec

    forged = {"schema_version": 1, "request_id": "r1", "stage": stage, "state": "running"}
    with pytest.raises(codec.CodecError):
        codec.decode(codec.encode(Progress.model_construct(**forged)), Progress)
    with pytest.raises(ValueError):
        RequestRecord(request_id="r1", failed_stage=stage)


def test_consumer_names_map_back_to_stages() -> None:
    assert agg.stage_of_consumer("ftbus", "ftbus-train") == Stage.train
    assert agg.stage_of_consumer("ftbus", "ftbus-aggregate-test") == Stage.aggregate
    assert agg.stage_of_consumer("ftbus", "other") is None
    assert agg.stage_of_consumer("ftbus", "ftbus-EVIL") is None


# ---------------------------------------------------------------- the aggregator on the in-memory bus


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[MemoryBus]:
    # No sweep during a test: the sweeper's bucket scan needs a real server (test_sweeper.py).
    # An ack wait no loaded machine reaches: a redelivery happens only where a test makes one (bus.expire).
    bus = MemoryBus(memory_settings(tmp_path, sweep_interval_s=3600, ack_wait_s=60.0))
    yield bus
    await bus.close()


@contextlib.asynccontextmanager
async def aggregating(bus: MemoryBus) -> AsyncIterator[Aggregator]:
    aggregator = Aggregator(bus, PIPELINE, concurrency=4)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(aggregator.run(stop))
    s = bus.subjects
    await bus.wait_for(lambda: (s.stream_events, s.durable(Stage.aggregate)) in bus.consumers, what="the aggregator")
    try:
        yield aggregator
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)  # a hang guard: the aggregator stops at once


async def record_of(bus: MemoryBus, rid: str) -> RequestRecord:
    entry = await (await bus.kv(bus.subjects.kv_requests)).get(rid)
    return RequestRecord.model_validate_json(entry.value)


async def view_of(bus: MemoryBus, rid: str) -> RequestStatusView:
    entry = await (await bus.kv(bus.subjects.kv_status)).get(rid)
    return RequestStatusView.model_validate_json(entry.value)


def published(bus: MemoryBus, subject: str) -> list[Any]:
    return bus.events(subject)


def request(rid: str = "req-1") -> EvalRequested:
    return EvalRequested(request_id=rid, context=ev.context())


async def test_a_pre_check_failure_ends_in_one_verdict_its_record_and_view_final(bus: MemoryBus) -> None:
    """The request, the data stage's refusal and the judge's verdict: what a user reads."""
    s = bus.subjects
    judged = judge_result(decision=False, expects_test=False).model_copy(update={"request_id": "req-1"})
    async with aggregating(bus):
        await bus.publish(s.eval_requested, request(), "req-1:request")
        await bus.publish(s.failed("data"), ev.precheck_failed("train.yaml is missing"), "req-1:data:failed")
        await bus.publish(s.completed("judge"), judged, "req-1:judge:completed")
        await bus.wait_for(lambda: published(bus, s.report("req-1")), what="the report")
    [verdict] = published(bus, s.verdict("req-1"))
    assert verdict.status == "completed" and verdict.final_decision is False
    record = await record_of(bus, "req-1")
    assert record.verdict_published and record.report_published and record.status == "completed"
    assert record.task is not None and record.stages["data"].ok is False and record.stages["judge"].ok is True
    view = await view_of(bus, "req-1")
    assert view.status == "completed" and view.final_decision is False and view.terminal
    entry = await (await bus.kv(s.kv_requests)).get("req-1")
    assert not is_open(entry.value), "a request whose verdict and report are out is closed"


async def test_the_report_waits_for_the_hidden_test_split_and_the_verdict_does_not(bus: MemoryBus) -> None:
    s = bus.subjects
    judged = judge_result(expects_test=True).model_copy(update={"request_id": "req-1"})
    async with aggregating(bus):
        await bus.publish(s.eval_requested, request(), "req-1:request")
        await bus.publish(s.completed("judge"), judged, "req-1:judge:completed")
        await bus.wait_for(lambda: published(bus, s.verdict("req-1")), what="the verdict")
        assert published(bus, s.report("req-1")) == []
        assert (await view_of(bus, "req-1")).status == "completed"
        test = ev.bench_result(split="test")
        await bus.publish(s.bench_test, test, "req-1:bench:test")
        await bus.wait_for(lambda: published(bus, s.report("req-1")), what="the report")
    [report] = published(bus, s.report("req-1"))
    assert report.benchmark_test is not None and report.final_decision is True
    assert "benchmark_test" not in json.loads((await view_of(bus, "req-1")).model_dump_json())


async def test_a_redelivered_event_publishes_nothing_twice(bus: MemoryBus) -> None:
    """The aggregator's ack is lost after the verdict went out: the redelivery changes nothing and
    publishes no second verdict."""
    s = bus.subjects
    judged = judge_result(decision=False, expects_test=False).model_copy(update={"request_id": "req-1"})
    async with aggregating(bus):
        bus.lose_acks(1)
        ack = await bus.publish(s.completed("judge"), judged, "req-1:judge:completed")
        durable = s.durable(Stage.aggregate)
        await bus.wait_for(lambda: bus.acks_to_lose == 0, what="the first handling's ack lost")
        assert published(bus, s.verdict("req-1")) and not bus.tracking(ack, durable).acked
        bus.expire(ack, durable)  # its ack wait runs out: the server delivers it again
        await bus.wait_for(lambda: bus.tracking(ack, durable).acked, what="the redelivery acked")
        assert bus.tracking(ack, durable).delivered == 2
    assert len(published(bus, s.verdict("req-1"))) == 1 and len(published(bus, s.report("req-1"))) == 1
    assert (await record_of(bus, "req-1")).verdict_published


async def test_a_verdict_claimed_by_a_write_that_died_before_publishing_is_published_by_the_redelivery(
    bus: MemoryBus,
) -> None:
    """The record holds the verdict, unpublished (the aggregator died between its write and the
    publishing): the event's redelivery publishes it and marks it."""
    s = bus.subjects
    judged = judge_result(decision=True, expects_test=False).model_copy(update={"request_id": "req-1"})
    claimed = RequestRecord(request_id="req-1")
    agg.on_judge(claimed, judged, BY_STAGE[Stage.judge])
    agg.complete_report(claimed)
    await (await bus.kv(s.kv_requests)).create("req-1", claimed.stored_json())
    async with aggregating(bus):
        await bus.publish(s.completed("judge"), judged, "req-1:judge:completed")
        await bus.wait_for(lambda: published(bus, s.report("req-1")), what="the report")
    assert len(published(bus, s.verdict("req-1"))) == 1
    record = await record_of(bus, "req-1")
    assert record.verdict_published and record.report_published


async def test_a_cancel_and_a_dead_letter_at_once_make_one_verdict_and_the_first_claim_stands(
    bus: MemoryBus,
) -> None:
    s = bus.subjects
    async with aggregating(bus):
        await bus.publish(s.eval_requested, request(), "req-1:request")
        await asyncio.gather(
            bus.publish(s.cancel, CancelRequested(request_id="req-1", reason="not needed"), "req-1:cancel"),
            bus.publish(s.dlq, DeadLetter(request_id="req-1", original_subject=s.completed("data"), stage=Stage.train,
                                          reason="the train stage failed 3 times"), "dlq:1"),
        )
        await bus.wait_for(lambda: published(bus, s.report("req-1")), what="the report")
    [verdict] = published(bus, s.verdict("req-1"))
    record = await record_of(bus, "req-1")
    assert record.verdict is not None and record.verdict.status == verdict.status
    assert verdict.status in ("cancelled", "error") and record.cancel_requested
    assert (await view_of(bus, "req-1")).status == verdict.status


async def test_a_stage_s_start_shows_in_the_view_and_an_event_on_a_foreign_subject_is_not_believed(
    bus: MemoryBus,
) -> None:
    """A stage's progress moves the public view; a JudgeResult published on data.completed (a
    forged verdict) is not a verdict."""
    s = bus.subjects
    forged = judge_result(decision=True).model_copy(update={"request_id": "req-1"})
    async with aggregating(bus):
        await bus.publish(s.eval_requested, request(), "req-1:request")
        await bus.wait_for(lambda: bus.consumers and published(bus, s.eval_requested), what="the request")

        async def written() -> bool:
            with contextlib.suppress(Exception):
                return (await view_of(bus, "req-1")).task is not None
            return False

        await bus.wait_for(written, what="the request's record")
        began = Progress(request_id="req-1", stage=Stage.train, state="running", attempt=1,
                         message="running llamafactory-cli")
        await bus.publish_core(s.progress("req-1"), began)

        async def training() -> bool:
            return (await view_of(bus, "req-1")).stage == "train"

        await bus.wait_for(training, what="the start of training in the view")
        ack = await bus.publish(s.completed("data"), forged, "req-1:forged")
        await bus.wait_for(lambda: bus.tracking(ack, s.durable(Stage.aggregate)).acked, what="the forgery handled")
    assert published(bus, s.verdict("req-1")) == []
    view = await view_of(bus, "req-1")
    assert view.status == "running" and view.stages["train"].attempts == 1


async def test_a_public_view_never_replaces_a_newer_one(bus: MemoryBus) -> None:
    """Aggregators may write one request's views out of order: the view of the newest record
    revision stays."""
    store = RecordStore(bus)  # type: ignore[arg-type]
    newer = RequestRecord(request_id="req-1", status="error", revision=5)
    older = RequestRecord(request_id="req-1", status="running", revision=3)
    await store.put_view(newer)
    await store.put_view(older)
    view = await view_of(bus, "req-1")
    assert (view.status, view.revision) == ("error", 5)
    await store.put_view(RequestRecord(request_id="req-1", status="completed", revision=7))
    assert (await view_of(bus, "req-1")).revision == 7


async def test_a_record_update_that_always_loses_says_so(bus: MemoryBus) -> None:
    """Never give up silently: the caller's message is naked and the update retried later."""
    store = RecordStore(bus)  # type: ignore[arg-type]
    await store.update("req-1", lambda r: None)
    bucket = await store.bucket()

    async def always_stale(key: str, value: bytes, last: int) -> int:
        raise KeyWrongLastSequenceError(description="wrong last sequence")

    bucket.update = always_stale  # type: ignore[method-assign]
    with pytest.raises(Contention, match="concurrent updates won"):
        await store.update("req-1", lambda r: None, attempts=3)


def test_a_judge_result_recorded_before_runs_still_reads() -> None:
    """Records live 14 days: a judge's result written with its former ``run`` reads as its run in ``runs``."""
    from shared.events import JudgeResult

    recorded = judge_result().model_dump(mode="json", exclude={"runs"})
    recorded["run"] = {"started_at": "2025-11-30T10:00:00Z", "attempt": 2}
    assert JudgeResult.model_validate(recorded).runs["judge"].attempt == 2
    recorded["run"] = None
    assert JudgeResult.model_validate(recorded).runs == {}
