"""A stage worker's lifecycle (shared/runtime.py) on the in-memory bus (tests/memory_bus.py): what it
publishes, stores, acks and naks for each kind of message, without a nats-server. The real-server
versions are tests/integration/test_stage_runtime.py and tests/integration/test_delivery.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from nats.js.api import PubAck

from runners.base import LocalRunner
from shared import codec
from shared.events import CancelRequested, DataResult, DeadLetter, Progress, Stage, TrainResult
from shared.records import RequestStatusView
from shared.runtime import Outgoing, StageContext, StageWorker
from shared.subjects import msg_id
from tests.fakes.judge_events import context, data_summary, train_summary
from tests.memory_bus import MemoryBus, memory_settings, running
from tests.unit.test_memory_bus import HANG_S, use_bus_clock

Handler = Callable[[DataResult, StageContext], Awaitable[list[TrainResult]]]


@pytest.fixture
async def make_bus(tmp_path: Path) -> AsyncIterator[Callable[..., MemoryBus]]:
    buses: list[MemoryBus] = []

    def make(**settings: Any) -> MemoryBus:
        buses.append(MemoryBus(memory_settings(tmp_path, **settings)))
        return buses[-1]

    yield make
    for bus in buses:
        await bus.close()
        assert bus.errors == [], "the bus caught errors around a handler or a callback"


@pytest.fixture
def bus(make_bus: Callable[..., MemoryBus]) -> MemoryBus:
    return make_bus()


def train_worker(bus: MemoryBus, handler: Handler) -> StageWorker:
    """The train stage's worker, with its policies and a runner: a stage that runs candidate code."""
    return StageWorker(bus, Stage.train, handler, (DataResult,), filters=[bus.subjects.completed("data")],  # type: ignore[arg-type]
                       runner=LocalRunner(bus.settings.passthrough_env))


def data_done(rid: str) -> DataResult:
    return DataResult(request_id=rid, ok=True, context=context(), data=data_summary())


def trained(rid: str) -> TrainResult:
    return TrainResult(request_id=rid, ok=True, context=context(), data=data_summary(), train=train_summary())


async def send(bus: MemoryBus, rid: str) -> PubAck:
    return await bus.publish(bus.subjects.completed("data"), data_done(rid), msg_id(rid, "data", "completed"))


def results(bus: MemoryBus) -> list[TrainResult]:
    return bus.events(bus.subjects.completed("train"), TrainResult)


def durable(bus: MemoryBus) -> str:
    return bus.subjects.durable(Stage.train)


class Counting:
    """A train handler that records each run (request id, delivery) and returns a TrainResult."""

    def __init__(self, before: Callable[[DataResult, StageContext], Awaitable[None]] | None = None) -> None:
        self.runs: list[tuple[str, int]] = []
        self._before = before

    async def __call__(self, event: DataResult, ctx: StageContext) -> list[TrainResult]:
        self.runs.append((event.request_id, ctx.deliveries))
        if self._before is not None:
            await self._before(event, ctx)
        return [trained(event.request_id)]


# ---------------------------------------------------------------------------- a handled message


async def test_a_handled_message_is_published_once_stored_and_acked(bus: MemoryBus) -> None:
    handler = Counting()
    async with running(bus, train_worker(bus, handler)):
        first = await send(bus, "ok-1")
        await bus.wait_for(lambda: bus.tracking(first, durable(bus)).acked, what="ok-1 acked")
        second = await send(bus, "ok-2")
        await bus.wait_for(lambda: bus.tracking(second, durable(bus)).acked, what="ok-2 acked")
    assert handler.runs == [("ok-1", 1), ("ok-2", 1)]
    [published, _] = bus.messages(bus.subjects.completed("train"))
    assert published.headers["Nats-Msg-Id"] == "ok-1:train:completed"
    result = published.event(TrainResult)
    assert result.request_id == "ok-1" and result.ok and result.runs["train"].attempt == 1
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    stored = msgpack.unpackb((await kv.get("ok-1.train")).value, raw=False)
    assert stored == [[bus.subjects.completed("train"), "completed", published.data]]  # the bytes published
    track = bus.tracking(first, durable(bus))
    assert (track.delivered, track.naks, track.termed) == (1, 0, False)


async def test_results_are_routed_by_the_row_failures_named_by_its_record_name(bus: MemoryBus) -> None:
    """The handler returns plain results: the worker publishes each on the stage's completed or failed
    subject by its ``ok``, names the row's record name as ``failed_stage`` where the handler named
    none, files its run under that name beside the earlier stages' runs, and publishes an explicit
    Outgoing where it says."""
    from ftbus.stages import BY_STAGE
    from shared.events import StageRun, utcnow

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult | Outgoing]:
        failed = trained(event.request_id).model_copy(update={"ok": False, "error": "exit 1"})
        return [failed, Outgoing(bus.subjects.bench_test, trained(event.request_id), "note")]

    worker = StageWorker(bus, Stage.train, handle, (DataResult,), filters=[bus.subjects.completed("data")],  # type: ignore[arg-type]
                         runner=LocalRunner(bus.settings.passthrough_env), row=BY_STAGE[Stage.train])
    earlier = {"data_processing": StageRun(started_at=utcnow(), attempt=2)}
    async with running(bus, worker):
        ack = await bus.publish(bus.subjects.completed("data"), data_done("r-1").model_copy(update={"runs": earlier}),
                                msg_id("r-1", "data", "completed"))
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="r-1 acked")
    assert results(bus) == []
    [failed] = bus.events(bus.subjects.failed("train"), TrainResult)
    assert failed.failed_stage == "training" and failed.error == "exit 1"
    assert list(failed.runs) == ["data_processing", "training"] and failed.runs["training"].attempt == 1
    assert failed.runs["data_processing"] == earlier["data_processing"]
    [note] = bus.messages(bus.subjects.bench_test)
    assert note.headers["Nats-Msg-Id"] == "r-1:train:note" and list(note.event(TrainResult).runs) == [
        "data_processing", "training"]


# ---------------------------------------------------------------------------- a handler that raises


async def test_a_handler_that_fails_once_is_naked_redelivered_and_publishes_one_result(bus: MemoryBus) -> None:
    async def fails_first(event: DataResult, ctx: StageContext) -> None:
        if ctx.deliveries == 1:
            raise ConnectionError("the artifact store is away")

    handler = Counting(fails_first)
    async with running(bus, train_worker(bus, handler)):
        ack = await send(bus, "flaky-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the retry acked")
    assert handler.runs == [("flaky-1", 1), ("flaky-1", 2)]
    track = bus.tracking(ack, durable(bus))
    assert (track.delivered, track.naks) == (2, 1)
    [result] = results(bus)
    assert result.runs["train"].attempt == 2
    states = [p.state for p in bus.heard(bus.subjects.progress("flaky-1"), Progress)]
    assert states == ["started", "retrying", "started", "finished"]


async def test_a_handler_that_always_fails_is_given_up_after_max_deliver_with_the_advisory(bus: MemoryBus) -> None:
    async def always(event: DataResult, ctx: StageContext) -> None:
        raise ConnectionError("the artifact store is away")

    handler = Counting(always)
    s = bus.subjects
    async with running(bus, train_worker(bus, handler)):
        ack = await send(bus, "doomed-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).given_up, what="the message given up")
    assert handler.runs == [("doomed-1", n) for n in range(1, bus.settings.max_deliver + 1)]
    assert not bus.tracking(ack, durable(bus)).acked
    assert results(bus) == []
    [advisory] = bus.messages(s.max_deliveries_advisory(s.stream_events, durable(bus)))
    assert advisory.stream == s.stream_advisories
    fields = json.loads(advisory.data)
    assert (fields["stream"], fields["consumer"], fields["stream_seq"], fields["deliveries"]) == (
        s.stream_events, durable(bus), ack.seq, bus.settings.max_deliver)


# ---------------------------------------------------------------------------- unreadable messages


async def test_undecodable_messages_are_dead_lettered_termed_and_never_redelivered(bus: MemoryBus) -> None:
    s = bus.subjects
    handler = Counting()
    bad = {
        "garbage": b"\xc1\xff not msgpack at all",
        "json": b'{"request_id": "json-1", "ok": true}',  # JSON is not the wire format
        "wrong type": codec.encode(CancelRequested(request_id="wrong-1")),  # valid, but not a DataResult
    }
    async with running(bus, train_worker(bus, handler)):
        acks = {name: await bus.js.publish(s.completed("data"), payload) for name, payload in bad.items()}
        await bus.wait_for(lambda: bus.consumer(durable(bus)).caught_up, what="the bad messages settled")
    assert handler.runs == []
    letters = {m.headers["Nats-Msg-Id"]: m.event(DeadLetter) for m in bus.messages(s.dlq)}
    assert len(letters) == 3
    for name, ack in acks.items():
        letter = letters[f"dlq:{s.stream_events}:{ack.seq}:{durable(bus)}"]
        assert (letter.stage, letter.original_subject, letter.payload) == (Stage.train, s.completed("data"), bad[name])
        track = bus.tracking(ack, durable(bus))
        assert track.termed and track.delivered == 1, name
    by_name = {name: letters[f"dlq:{s.stream_events}:{ack.seq}:{durable(bus)}"] for name, ack in acks.items()}
    assert by_name["garbage"].request_id is None and "not msgpack" in by_name["garbage"].reason
    assert by_name["json"].request_id is None and "not msgpack" in by_name["json"].reason
    assert by_name["wrong type"].request_id == "wrong-1"
    assert "got CancelRequested, expected DataResult" in by_name["wrong type"].reason


# ---------------------------------------------------------------------------- idempotent redelivery


async def test_a_redelivery_after_a_lost_ack_republishes_the_stored_result_without_running_again(
    make_bus: Callable[..., MemoryBus],
) -> None:
    """The worker dies between its store and its ack: the message comes back after ack_wait."""
    bus = make_bus(ack_wait_s=0.3, heartbeat_s=0.1)
    handler = Counting()
    bus.lose_acks(1)
    async with running(bus, train_worker(bus, handler)):
        ack = await send(bus, "crash-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the redelivery acked")
    assert handler.runs == [("crash-1", 1)], "the stage ran again although its result was stored"
    assert bus.tracking(ack, durable(bus)).delivered == 2
    assert len(results(bus)) == 1
    assert bus.duplicates == ["crash-1:train:completed"]  # republished: de-duplication kept one copy


async def test_a_replayed_message_whose_result_is_stored_is_not_run_again(bus: MemoryBus) -> None:
    """A first delivery of a stage that runs candidate code may be a replay (the durable recreated):
    its stored result is republished instead of training again."""
    s = bus.subjects
    stored_result = codec.encode(trained("replay-1"))
    kv = await bus.kv(s.kv_stage_results(Stage.train))
    await kv.put("replay-1.train", msgpack.packb([[s.completed("train"), "completed", stored_result]]))
    handler = Counting()
    async with running(bus, train_worker(bus, handler)):
        ack = await send(bus, "replay-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the replay acked")
    assert handler.runs == []
    [published] = bus.messages(s.completed("train"))
    assert published.data == stored_result and published.headers["Nats-Msg-Id"] == "replay-1:train:completed"


# ---------------------------------------------------------------------------- cancel


async def test_a_cancel_heard_while_the_handler_runs_cancels_it_publishes_nothing_and_acks(bus: MemoryBus) -> None:
    started = asyncio.Event()
    outcome: list[str] = []

    async def until_cancelled(event: DataResult, ctx: StageContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    handler = Counting(until_cancelled)
    async with running(bus, train_worker(bus, handler)):
        ack = await send(bus, "cancel-1")
        await asyncio.wait_for(started.wait(), HANG_S)  # hang guard
        await bus.publish_core(bus.subjects.cancel, CancelRequested(request_id="cancel-1"))
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the cancelled message acked")
    assert outcome == ["cancelled"]
    assert results(bus) == []
    assert bus.tracking(ack, durable(bus)).delivered == 1
    [*_, last] = bus.heard(bus.subjects.progress("cancel-1"), Progress)
    assert (last.state, last.message) == ("failed", "cancelled")


async def test_a_message_of_a_request_cancelled_before_is_skipped_and_acked(bus: MemoryBus) -> None:
    handler = Counting()
    async with running(bus, train_worker(bus, handler)):
        await bus.publish_core(bus.subjects.cancel, CancelRequested(request_id="gone-1"))
        await bus.flush()  # the worker has heard it
        ack = await send(bus, "gone-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the skipped message acked")
    assert handler.runs == [] and results(bus) == []


async def test_a_cancel_only_the_status_record_knows_skips_or_stops_the_stage(
    make_bus: Callable[..., MemoryBus], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker cut off from the cancel event: the status record says it, before the stage runs
    candidate code and at each heartbeat."""
    bus = make_bus(ack_wait_s=0.3, heartbeat_s=0.05)
    use_bus_clock(monkeypatch, bus)  # the ack wait never runs out: no redelivery of later-1, however slow the beats
    status = await bus.kv(bus.subjects.kv_status)
    cancelled = RequestStatusView(request_id="known-1", status="running", cancel_requested=True)
    await status.put("known-1", cancelled.model_dump_json().encode())
    started = asyncio.Event()

    async def waits(event: DataResult, ctx: StageContext) -> None:
        started.set()
        await asyncio.Event().wait()

    handler = Counting(waits)
    async with asyncio.timeout(HANG_S), running(bus, train_worker(bus, handler)):  # hang guard
        skipped = await send(bus, "known-1")
        await bus.wait_for(lambda: bus.tracking(skipped, durable(bus)).acked, what="known-1 skipped")
        assert handler.runs == []
        stopped = await send(bus, "later-1")
        await asyncio.wait_for(started.wait(), HANG_S)  # hang guard
        await status.put("later-1", cancelled.model_copy(update={"request_id": "later-1"}).model_dump_json().encode())
        await bus.wait_for(lambda: bus.tracking(stopped, durable(bus)).acked, what="later-1 stopped at a beat")
    assert handler.runs == [("later-1", 1)] and results(bus) == []


# ---------------------------------------------------------------------------- heartbeat and progress


async def test_a_handler_running_longer_than_ack_wait_is_not_redelivered_meanwhile(
    make_bus: Callable[..., MemoryBus], monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = make_bus(ack_wait_s=0.5, heartbeat_s=0.05)
    clock = use_bus_clock(monkeypatch, bus)  # the bus's ack wait goes by the test, the heartbeat by real time
    ack = await send(bus, "long-1")  # before the worker starts: it delivers from the stream's start

    async def works_a_while(event: DataResult, ctx: StageContext) -> None:
        for _ in range(5):  # 2.5 ack waits of work, on the bus's clock, in half ack waits
            beats = bus.tracking(ack, durable(bus)).in_progress
            await bus.wait_for(lambda beats=beats: bus.tracking(ack, durable(bus)).in_progress > beats,
                               what="a heartbeat")  # since the clock last moved
            await clock.advance(bus.settings.ack_wait_s / 2)

    handler = Counting(works_a_while)
    # Two handlers: one would be free to take a redelivery, were the message let go.
    worker = StageWorker(bus, Stage.train, handler, (DataResult,), filters=[bus.subjects.completed("data")],  # type: ignore[arg-type]
                         runner=LocalRunner(bus.settings.passthrough_env), concurrency=2)
    async with asyncio.timeout(HANG_S), running(bus, worker):  # hang guard: the bus's clock stands still
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the long run acked")
    assert handler.runs == [("long-1", 1)]
    track = bus.tracking(ack, durable(bus))
    assert track.delivered == 1 and track.in_progress >= 5  # one beat at least between moves of the clock
    assert len(results(bus)) == 1


async def test_a_handled_message_announces_its_start_and_its_end(bus: MemoryBus) -> None:
    """Progress (core NATS) for clients: ``started`` before the handler runs, what the handler
    reports, and ``finished`` once its result is out."""
    s = bus.subjects

    async def reports(event: DataResult, ctx: StageContext) -> None:
        if event.request_id == "told-1":
            await ctx.progress(step=1, total=2)

    def said(rid: str) -> list[str]:
        wire = [m for m in bus.wire if m.subject in (s.progress(rid), s.completed("train"))]
        return [codec.decode(m.data).state if m.subject != s.completed("train") else "result" for m in wire
                if codec.decode(m.data).request_id == rid]

    async with running(bus, train_worker(bus, Counting(reports))):
        await send(bus, "quick-1")
        await send(bus, "told-1")
        await bus.wait_for(lambda: said("quick-1")[-1:] == said("told-1")[-1:] == ["finished"], what="both finished")
    assert said("quick-1") == ["started", "result", "finished"]
    assert said("told-1") == ["started", "running", "result", "finished"]
    started = bus.heard(s.progress("told-1"), Progress)[0]
    assert (started.stage, started.message) == (Stage.train, "attempt 1")
