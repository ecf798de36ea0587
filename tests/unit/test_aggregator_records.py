"""The aggregator's record transitions: first verdict wins, reports wait for the test split."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from services.aggregator import service as agg
from services.aggregator.verdicts import build_report, report_ready
from shared.events import (
    BenchmarkScores,
    BenchResult,
    CancelRequested,
    DataSummary,
    DeadLetter,
    Feedback,
    JudgeInfo,
    JudgeResult,
    RequestContext,
    Stage,
    TaskSpec,
    TrainSummary,
    VerdictResult,
)
from shared.records import RequestRecord, RequestStatusView

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
    agg._on_judge(record, judge_result(True))
    agg._on_dead_letter(record, DeadLetter(request_id="r1", original_subject="x", stage=Stage.train, reason="boom"))
    agg._on_cancel(record, CancelRequested(request_id="r1"))
    assert record.verdict is not None and record.verdict.status == "completed"
    assert record.final_decision is True and record.cancel_requested is True


def test_a_dead_letter_becomes_an_error_verdict_naming_the_stage() -> None:
    record = RequestRecord(request_id="r1", stage="train")
    letter = DeadLetter(request_id="r1", original_subject="x", stage=Stage.train, reason="disk full")
    agg._on_dead_letter(record, letter)
    assert record.verdict is not None
    assert record.verdict.status == "error" and record.verdict.failed_stage == "training"
    assert "disk full" in record.verdict.execution and record.verdict.final_decision is False


def test_cancel_names_the_running_stage() -> None:
    record = RequestRecord(request_id="r1", stage="bench")
    agg._on_cancel(record, CancelRequested(request_id="r1", reason="not needed"))
    assert record.verdict is not None and record.verdict.status == "cancelled"
    assert record.verdict.failed_stage == "benchmark" and "not needed" in record.verdict.execution


def test_the_report_waits_for_the_test_split_then_carries_it() -> None:
    record = RequestRecord(request_id="r1")
    agg._on_judge(record, judge_result(expects_test=True))
    assert not report_ready(record)
    test = BenchResult(request_id="r1", ok=True, split="test", context=CONTEXT, data=DataSummary(),
                       train=TrainSummary(), benchmark=BenchmarkScores(accuracy_summary={"s": {"acc": 0.5}}))
    agg._on_test(record, test)
    assert report_ready(record)
    report = build_report(record)
    assert report.benchmark_test is not None and report.benchmark_test.accuracy_summary == {"s": {"acc": 0.5}}
    assert report.final_decision is True


def test_the_public_view_carries_the_status_and_never_the_hidden_test_split() -> None:
    """Workers and agents read the status bucket: it must say where the request is, and nothing of
    what the hidden test split said, the report or the verdict's reasons."""
    record = RequestRecord(request_id="r1")
    agg._on_judge(record, judge_result(expects_test=True))
    test = BenchResult(request_id="r1", ok=True, split="test", context=CONTEXT, data=DataSummary(),
                       train=TrainSummary(), benchmark=BenchmarkScores(accuracy_summary={"secret": {"acc": 0.93}}))
    agg._on_test(record, test)
    record.report = build_report(record)
    view = json.loads(record.public_view_json())
    assert view == json.loads(record.public_view().model_dump_json())
    assert view["status"] == "completed" and view["final_decision"] is True
    assert set(view) == set(RequestStatusView.model_fields)
    assert "secret" not in record.public_view_json().decode() and "0.93" not in record.public_view_json().decode()


def test_no_test_split_expected_after_an_early_failure() -> None:
    record = RequestRecord(request_id="r1")
    agg._on_judge(record, judge_result(decision=False, expects_test=False))
    assert report_ready(record)


def test_progress_after_the_verdict_does_not_reopen_the_request() -> None:
    from shared.events import Progress

    record = RequestRecord(request_id="r1")
    agg._on_judge(record, judge_result())
    agg._on_progress(record, Progress(request_id="r1", stage=Stage.train, state="started"))
    assert record.status == "completed"


def test_a_stage_that_announced_nothing_gets_its_start_and_attempts_from_its_result() -> None:
    """A quick stage publishes no progress (shared/runtime.py): its result's StageRun fills the
    timeline. A long one announced its start a second late; its result's earlier start wins, and
    a retry's later start never replaces the first attempt's."""
    from datetime import timedelta

    from shared.events import DataResult, Progress, StageRun, utcnow

    t0 = utcnow()
    record = RequestRecord(request_id="r1")
    quick = DataResult(request_id="r1", ok=False, context=CONTEXT, data=DataSummary(),
                       run=StageRun(started_at=t0, attempt=1))
    agg._on_stage_result(record, quick)
    assert record.stages["data"].started_at == t0 and record.stages["data"].attempts == 1
    assert record.stages["data"].duration_s is not None

    judge = judge_result()
    judge.run = StageRun(started_at=t0 + timedelta(seconds=2), attempt=3)
    agg._on_judge(record, judge)
    assert record.stages["judge"].attempts == 3
    assert record.stages["judge"].started_at == t0 + timedelta(seconds=2)

    record = RequestRecord(request_id="r2")
    announced = Progress(request_id="r2", stage=Stage.data, state="started", emitted_at=t0 + timedelta(seconds=1))
    agg._on_progress(record, announced)
    late_retry = DataResult(request_id="r2", ok=True, context=CONTEXT, data=DataSummary(),
                            run=StageRun(started_at=t0 + timedelta(seconds=30), attempt=2))
    agg._on_stage_result(record, late_retry)
    assert record.stages["data"].started_at == t0 + timedelta(seconds=1)
    assert record.stages["data"].attempts == 2
    first = DataResult(request_id="r2", ok=True, context=CONTEXT, data=DataSummary(),
                       run=StageRun(started_at=t0, attempt=1))
    agg._on_stage_result(record, first)
    assert record.stages["data"].started_at == t0 and record.stages["data"].attempts == 2


def test_consumer_names_map_back_to_stages() -> None:
    assert agg._stage_of_consumer("ftbus", "ftbus-train") is Stage.train
    assert agg._stage_of_consumer("ftbus", "ftbus-aggregate-test") is Stage.aggregate
    assert agg._stage_of_consumer("ftbus", "other") is None


async def test_the_progress_memory_forgets_finished_and_idle_requests(monkeypatch: Any) -> None:
    """The aggregator remembers when it last wrote each request's progress: never forever."""

    from shared import codec
    from shared.events import Progress
    from shared.subjects import Subjects

    monkeypatch.setattr(agg, "LINGER_S", 0.0)
    aggregator = agg.Aggregator(SimpleNamespace(subjects=Subjects()))  # type: ignore[arg-type]

    async def update(rid: str, mutate: object, create: bool = True, **_: object) -> RequestRecord:
        return RequestRecord(request_id=rid, status="completed" if rid.startswith("done") else "running")

    aggregator.update = update  # type: ignore[method-assign]
    for i in range(3 * agg.PROGRESS_MEMORY):
        rid = f"done-{i}" if i % 2 else f"run-{i}"
        event = Progress(request_id=rid, stage=Stage.train, state="started")
        await aggregator._on_progress(SimpleNamespace(data=codec.encode(event)))
    await aggregator._owed_later.settled()
    # Finished requests are forgotten at once; running ones are kept while the memory is small.
    assert not any(rid.startswith("done") for rid in aggregator._last_progress_write)
    assert len(aggregator._last_progress_write) == 3 * agg.PROGRESS_MEMORY // 2
    # Past the limit, whatever has been idle for a minute goes.
    aggregator._prune_progress(now=max(aggregator._last_progress_write.values()) + 61)
    assert aggregator._last_progress_write == {}


async def test_marking_a_record_never_gives_up_silently() -> None:
    """A flag that cannot be written (every compare-and-set loses) is an error, so the message is retried."""
    import pytest
    from nats.js.errors import KeyWrongLastSequenceError

    class Entry:
        def __init__(self, value: bytes, revision: int) -> None:
            self.value, self.revision = value, revision

    class AlwaysRaced:
        def __init__(self) -> None:
            self.updates = 0

        async def get(self, key: str) -> Entry:
            return Entry(RequestRecord(request_id="r1").model_dump_json().encode(), 7)

        async def update(self, key: str, value: bytes, last: int, *, open_: bool) -> None:
            self.updates += 1
            raise KeyWrongLastSequenceError()

    class FakeBus:
        from shared.subjects import Subjects

        subjects = Subjects()

    aggregator = agg.Aggregator(FakeBus())  # type: ignore[arg-type]
    kv = AlwaysRaced()
    aggregator._kv = kv  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="could not set verdict_published on the record of r1: 5 concurrent"):
        await aggregator._mark("r1", "verdict_published", attempts=5)
    assert kv.updates == 5


class MemoryKV:
    """KV get/create/update with revisions, counting the reads; ``opened`` keeps what each key's
    last write said of the record (the requests bucket's open header), when a write said it."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self.opened: dict[str, bool] = {}
        self.gets = 0

    async def get(self, key: str) -> Any:
        from nats.js.errors import KeyNotFoundError

        self.gets += 1
        if key not in self.data:
            raise KeyNotFoundError()
        value, revision = self.data[key]
        return SimpleNamespace(value=value, revision=revision)

    async def create(self, key: str, value: bytes, *, open_: bool | None = None) -> int:
        from nats.js.errors import KeyWrongLastSequenceError

        if key in self.data:
            raise KeyWrongLastSequenceError()
        self.data[key] = (value, 1)
        if open_ is not None:
            self.opened[key] = open_
        return 1

    async def update(self, key: str, value: bytes, last: int, *, open_: bool | None = None) -> int:
        from nats.js.errors import KeyWrongLastSequenceError

        revision = self.data[key][1] if key in self.data else 0
        if last != revision:
            raise KeyWrongLastSequenceError()
        self.data[key] = (value, revision + 1)
        if open_ is not None:
            self.opened[key] = open_
        return revision + 1


async def test_a_request_under_way_is_remembered_and_a_finished_one_is_not() -> None:
    """The aggregator updates a request under way without reading it (it remembers its own last
    write), and forgets it once its verdict and report are out: its memory follows the requests
    under way, not the last RECORD_MEMORY ones (bench/soak.py measured 30 MB of those)."""

    class FakeBus:
        from shared.subjects import Subjects

        subjects = Subjects()

    aggregator = agg.Aggregator(FakeBus())  # type: ignore[arg-type]
    kv = MemoryKV()
    aggregator._kv = kv  # type: ignore[assignment]

    def move_to(stage: str) -> Callable[[RequestRecord], None]:
        return lambda record: setattr(record, "stage", stage)

    await aggregator._cas("r1", move_to("data"), create=True, attempts=3)
    assert kv.gets == 1  # the first write looks for an existing record
    await aggregator._cas("r1", move_to("train"), create=True, attempts=3)
    assert kv.gets == 1, "a request under way was read again"

    def published(record: RequestRecord) -> None:
        record.verdict_published = record.report_published = True

    await aggregator._cas("r1", published, create=False, attempts=3)
    assert "r1" not in aggregator._records
    record, changed = await aggregator._cas("r1", move_to("bench"), create=False, attempts=3)
    assert kv.gets == 2 and changed and record is not None and record.verdict_published
    assert RequestRecord.model_validate_json(kv.data["r1"][0]).stage == "bench"


class StatusKV(MemoryKV):
    """The status bucket: every view written, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[str, RequestStatusView]] = []

    async def create(self, key: str, value: bytes, *, open_: bool | None = None) -> int:
        written = await super().create(key, value)
        self.puts.append((key, RequestStatusView.model_validate_json(value)))
        return written

    async def update(self, key: str, value: bytes, last: int, *, open_: bool | None = None) -> int:
        written = await super().update(key, value, last)
        self.puts.append((key, RequestStatusView.model_validate_json(value)))
        return written


class RecordingBus:
    """What the aggregator's writes need of a bus: the status bucket and publishing."""

    from shared.subjects import Subjects

    subjects = Subjects()

    def __init__(self) -> None:
        self.status = StatusKV()
        self.published: list[str] = []

    async def kv(self, name: str) -> StatusKV:
        assert name == self.subjects.kv_status
        return self.status

    async def publish(self, subject: str, event: object, msg_id: str) -> None:
        self.published.append(subject)


def on_memory() -> tuple[RecordingBus, agg.Aggregator, MemoryKV]:
    """An aggregator whose records, views and publishing are kept in memory."""
    bus = RecordingBus()
    aggregator = agg.Aggregator(bus)  # type: ignore[arg-type]
    kv = MemoryKV()
    aggregator._kv = kv  # type: ignore[assignment]
    return bus, aggregator, kv


class Delivered:
    """What the aggregator's handler sees of a message: its subject, and what its ack waits for."""

    def __init__(self, subject: str, deliveries: int = 1) -> None:
        self.subject = subject
        self.deliveries = deliveries
        self.acked_after: Any = None

    def ack_after(self, written: Any) -> None:
        self.acked_after = written

    @property
    def acked(self) -> bool:
        """The runtime would ack it now: at once, or its update is written."""
        return self.acked_after is None or (self.acked_after.done() and self.acked_after.exception() is None)


async def test_a_quick_stage_is_one_record_write_and_its_view_one_put(monkeypatch: Any) -> None:
    """A request's arrival, a stage's start (progress) and its result coming close together are
    written to the record once, in their order, and the events' messages acked only then; the
    public view lags by STATUS_LINGER_S while the request is under way, newest view only; a
    finished or cancelled request's view is written at once. (A burst of pre-check failures: 6
    record writes and 5 views per request at first, 4 and 1 after the last changes, 2 and 1 now.)"""
    import asyncio

    from shared import codec
    from shared.events import DataResult, EvalRequested, Progress

    monkeypatch.setattr(agg, "LINGER_S", 0.05)
    monkeypatch.setattr(agg, "STATUS_LINGER_S", 0.05)
    bus, aggregator, kv = on_memory()
    writes = lambda: kv.data["r1"][1] if "r1" in kv.data else 0  # noqa: E731 - the record's revision counts its writes

    async def progress(stage: Stage, state: str = "started") -> None:
        event = Progress(request_id="r1", stage=stage, state=state)  # type: ignore[arg-type]
        await aggregator._on_progress(SimpleNamespace(data=codec.encode(event)))

    arrival = Delivered(bus.subjects.eval_requested)
    await aggregator.on_event(EvalRequested(request_id="r1", context=CONTEXT), arrival)  # type: ignore[arg-type]
    assert writes() == 0, "the arrival was written before its request's next event could join it"
    assert not arrival.acked, "the arrival's message is acked before its update is written"
    await progress(Stage.data)
    failed = DataResult(request_id="r1", ok=False, context=CONTEXT, data=DataSummary(), error="no train.yaml")
    refusal = Delivered(bus.subjects.data_failed)
    await aggregator.on_event(failed, refusal)  # type: ignore[arg-type]
    assert writes() == 0 and not refusal.acked
    await asyncio.sleep(0.2)
    assert writes() == 1 and kv.gets == 0, "the arrival, the start and the result: one create, no read first"
    assert arrival.acked and refusal.acked, "written, and their messages not acked"
    assert "r1" not in aggregator._owed_later._waiting
    record = RequestRecord.model_validate_json(kv.data["r1"][0])
    data = record.stages["data"]
    assert record.task == CONTEXT.task and record.submitted_at is not None
    assert data.attempts == 1 and data.started_at is not None and data.finished_at is not None
    assert record.stage == "judge", "the start was applied before the result, not after it"
    assert [view.stage for _, view in bus.status.puts] == ["judge"], "one put, the newest view"
    assert writes() == 1

    await progress(Stage.judge)  # a start with nothing after it: written alone, after its linger
    await asyncio.sleep(0.2)
    assert writes() == 2 and RequestRecord.model_validate_json(kv.data["r1"][0]).stages["judge"].attempts == 1

    await aggregator.update("r1", lambda record: None)  # a change under way: its view lingers
    assert "r1" in aggregator._status_later._waiting
    await aggregator.on_event(CancelRequested(request_id="r1"),
                              Delivered(bus.subjects.cancel))  # type: ignore[arg-type]
    last = bus.status.puts[-1][1]
    assert last.status == "cancelled" and last.cancel_requested, "a cancel's view is written at once"
    assert "r1" not in aggregator._status_later._waiting, "the superseded view's timer is left to wake"
    assert bus.published == [bus.subjects.verdict("r1"), bus.subjects.report("r1")]
    await asyncio.sleep(0.2)
    assert bus.status.puts[-1][1].status == "cancelled", "no older view written after the final one"


async def test_a_pre_check_failure_is_one_record_write(monkeypatch: Any) -> None:
    """The request, the data stage's refusal and the judge's verdict arriving together: the verdict
    takes the two lingering events along, and one create (no read) claims it and marks it published
    (the three messages come back if what follows fails); the two earlier messages are acked once
    that write is done. A lingering write that fails leaves its events' messages to be retried."""
    from shared.events import DataResult, EvalRequested, JudgeResult

    bus, aggregator, kv = on_memory()
    s = bus.subjects
    events = [
        (EvalRequested(request_id="r1", context=CONTEXT), Delivered(s.eval_requested)),
        (DataResult(request_id="r1", ok=False, context=CONTEXT, data=DataSummary(), error="no train.yaml"),
         Delivered(s.data_failed)),
        (judge_result(decision=False, expects_test=False).model_copy(update={"request_id": "r1"}),
         Delivered(s.judge_completed)),
    ]
    for event, delivered in events:
        await aggregator.on_event(event, delivered)  # type: ignore[arg-type]
    assert isinstance(events[2][0], JudgeResult) and events[2][1].acked_after is None
    assert all(delivered.acked for _, delivered in events)
    assert kv.gets == 0 and kv.data["r1"][1] == 1, "more than one write"
    record = RequestRecord.model_validate_json(kv.data["r1"][0])
    assert record.task == CONTEXT.task and record.stages["data"].ok is False
    assert record.verdict_published and record.report_published and kv.opened["r1"] is False
    assert bus.published == [s.verdict("r1"), s.report("r1")]

    class Broken(MemoryKV):
        async def create(self, key: str, value: bytes, *, open_: bool | None = None) -> int:
            raise RuntimeError("the server is gone")

    monkeypatch.setattr(agg, "LINGER_S", 0.0)
    aggregator._kv = Broken()  # type: ignore[assignment]
    arrival = Delivered(s.eval_requested)
    await aggregator.on_event(EvalRequested(request_id="r2", context=CONTEXT), arrival)  # type: ignore[arg-type]

    await aggregator._owed_later.settled()
    assert arrival.acked_after.done() and isinstance(arrival.acked_after.exception(), RuntimeError), (
        "a lingering write that failed let its message be acked")


async def test_lingering_writes_are_bounded_and_the_oldest_goes_first(monkeypatch: Any) -> None:
    """At most OWED_REQUESTS_MAX requests wait with their messages unacked: one more writes the
    request that waited longest at once (its message is acked), not when its timer would have,
    so the consumer never holds its max_ack_pending of messages that only timers can release."""
    import asyncio

    from shared.events import EvalRequested

    monkeypatch.setattr(agg, "LINGER_S", 30.0)
    monkeypatch.setattr(agg, "OWED_REQUESTS_MAX", 2)
    bus, aggregator, kv = on_memory()
    arrivals = {rid: Delivered(bus.subjects.eval_requested) for rid in ("r1", "r2", "r3")}
    for rid, delivered in arrivals.items():
        await aggregator.on_event(EvalRequested(request_id=rid, context=CONTEXT), delivered)  # type: ignore[arg-type]
    await asyncio.sleep(0.1)  # the write of the oldest, under way
    assert list(kv.data) == ["r1"] and arrivals["r1"].acked, "the oldest was not written at once"
    assert not arrivals["r2"].acked and not arrivals["r3"].acked, "the younger ones did not wait"
    assert list(aggregator._owed_later._waiting) == ["r2", "r3"]
    await aggregator._owed_later.flush(list(aggregator._owed))
    assert set(kv.data) == {"r1", "r2", "r3"}


async def test_a_first_event_finds_a_record_already_there_and_keeps_it() -> None:
    """Another aggregator wrote the record first: the create fails, the record is read and the
    event applied to it, nothing lost."""
    from shared.events import EvalRequested

    bus, aggregator, kv = on_memory()
    kv.data["r1"] = (RequestRecord(request_id="r1", stage="train", status="running").model_dump_json().encode(), 4)
    arrival = Delivered(bus.subjects.eval_requested)
    await aggregator.on_event(EvalRequested(request_id="r1", context=CONTEXT), arrival)  # type: ignore[arg-type]
    await aggregator._write_owed("r1")  # its linger over
    assert arrival.acked
    record = RequestRecord.model_validate_json(kv.data["r1"][0])
    assert kv.gets == 1 and kv.data["r1"][1] == 5
    assert record.stage == "train" and record.task == CONTEXT.task


async def test_a_public_view_never_replaces_a_newer_one() -> None:
    """Two aggregators each handle some of one request's events (the consumer balances them), and
    a view may linger: views land out of order, and the newest record revision's view stays."""
    bus = RecordingBus()
    first, second = agg.Aggregator(bus), agg.Aggregator(bus)  # type: ignore[arg-type]

    def view(status: str, revision: int) -> bytes:
        return RequestStatusView(request_id="r1", status=status, revision=revision).model_dump_json().encode()  # type: ignore[arg-type]

    await first._put_status("r1", view("running", 3), 3)
    await second._put_status("r1", view("error", 5), 5)  # the final one, from the other aggregator
    await first._put_status("r1", view("running", 4), 4)  # a lingering view, older: dropped
    stored = RequestStatusView.model_validate_json(bus.status.data["r1"][0])
    assert (stored.status, stored.revision) == ("error", 5)
    await first._put_status("r1", view("error", 7), 7)  # a later one replaces it
    assert RequestStatusView.model_validate_json(bus.status.data["r1"][0]).revision == 7
    assert [v.revision for _, v in bus.status.puts] == [3, 5, 7]


async def test_a_record_says_it_is_open_until_its_verdict_and_report_are_out() -> None:
    """The header the sweeper follows (services/aggregator/records_bucket.py), and the record's
    revision: the entry's own, never stored in it, and carried by its public view."""
    bus, aggregator, kv = on_memory()
    from shared.events import EvalRequested

    await aggregator.on_event(EvalRequested(request_id="r1", context=CONTEXT),
                              Delivered(bus.subjects.eval_requested))  # type: ignore[arg-type]
    await aggregator._write_owed("r1")  # its linger over
    assert kv.opened["r1"] is True
    await aggregator.on_event(CancelRequested(request_id="r1"),
                              Delivered(bus.subjects.cancel))  # type: ignore[arg-type]
    assert bus.published == [bus.subjects.verdict("r1"), bus.subjects.report("r1")]
    stored, revision = kv.data["r1"]
    assert revision == 2 and kv.opened["r1"] is False, "created, then claimed and marked done"
    assert "revision" not in json.loads(stored)
    assert [v.revision for _, v in bus.status.puts] == [2], "one view: the final one, of the claiming write"
    aggregator._records.clear()
    record, _ = await aggregator.get("r1")
    assert record is not None and record.revision == 2


async def test_a_verdict_marked_published_by_a_write_that_died_is_published_by_the_redelivery() -> None:
    """A message's write marks the verdict and report published before they are; the handling dies
    before publishing them (here: the publish fails), its message comes back, and the redelivery
    publishes what the record says is published. The sweeper's claims, which no message brings
    back, are marked only once they are out."""

    class FailingOnce(RecordingBus):
        failed = False

        async def publish(self, subject: str, event: object, msg_id: str) -> None:
            if not self.failed:
                self.failed = True
                raise ConnectionError("the server went away")
            await super().publish(subject, event, msg_id)

    bus = FailingOnce()
    aggregator = agg.Aggregator(bus)  # type: ignore[arg-type]
    kv = MemoryKV()
    aggregator._kv = kv  # type: ignore[assignment]
    s = bus.subjects
    verdict = judge_result(decision=False, expects_test=False).model_copy(update={"request_id": "r1"})
    with pytest.raises(ConnectionError):
        await aggregator.on_event(verdict, Delivered(s.judge_completed))  # type: ignore[arg-type]
    stored = RequestRecord.model_validate_json(kv.data["r1"][0])
    assert stored.verdict_published and stored.report_published and s.verdict("r1") not in bus.published
    await aggregator.on_event(verdict, Delivered(s.judge_completed, deliveries=2))  # type: ignore[arg-type]
    # (The report, published beside the failed verdict the first time, goes again: its stream keeps one.)
    assert bus.published.count(s.verdict("r1")) == 1 and set(bus.published) == {s.verdict("r1"), s.report("r1")}, (
        "the redelivery did not publish the verdict")

    # The sweeper (a stuck request): claimed, published, then marked.
    await aggregator.update("r2", lambda record: None)
    written = kv.data["r2"][1]
    await aggregator.update("r2", lambda record: agg._claim(record, agg.error_verdict(record, "data", "stuck")))
    assert kv.data["r2"][1] == written + 2 and kv.opened["r2"] is False
    assert bus.published[-2:] == [s.verdict("r2"), s.report("r2")]


def test_an_event_is_believed_only_on_its_own_subjects() -> None:
    """A forged event on another stage's subject is not believed: a JudgeResult on data.completed
    is no verdict, and a test split's result counts only on the test subject (and vice versa)."""
    from shared.subjects import Subjects

    s = Subjects()
    aggregator = agg.Aggregator(SimpleNamespace(subjects=s))  # type: ignore[arg-type]

    def bench(split: str) -> BenchResult:
        return BenchResult(request_id="r1", ok=True, split=split, context=CONTEXT, data=DataSummary(),  # type: ignore[arg-type]
                           train=TrainSummary())

    assert aggregator._belongs(judge_result(), s.judge_completed)
    assert not aggregator._belongs(judge_result(), s.data_completed)
    assert aggregator._belongs(bench("test"), s.bench_test)
    assert not aggregator._belongs(bench("test"), s.bench_completed)
    assert aggregator._belongs(bench("validation"), s.bench_completed)
    assert aggregator._belongs(bench("validation"), s.bench_failed)
    assert not aggregator._belongs(bench("validation"), s.bench_test)
    assert aggregator._belongs(CancelRequested(request_id="r1", reason="x"), s.cancel)
    assert not aggregator._belongs(CancelRequested(request_id="r1", reason="x"), s.eval_requested)
    assert not aggregator._belongs(RequestRecord(request_id="r1"), s.judge_completed)  # not an event it reads
