"""What the stage runtime (shared/runtime.py) does around a handler, on a real nats-server: the
stored result on a redelivery (and none for a result worked out again), a cancel that only the
status record knows, the first look only once a handler has run a while, a heartbeat that
ends even when a beat takes its cancel for a result, and an ack that waits for a handler's later
work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import msgpack
import nats.js.errors
from structlog.testing import capture_logs

from runners.choice import make_runner
from shared import codec
from shared.bus import Bus
from shared.events import DataResult, Stage, TrainResult
from shared.records import RequestStatusView
from shared.runtime import (
    AnnounceProgress,
    IdempotencyStore,
    Outgoing,
    Policy,
    SkipCancelled,
    StageContext,
    StageWorker,
)
from shared.subjects import msg_id
from tests.fakes.judge_events import context, data_failed, data_summary, train_summary
from tests.integration.test_delivery import caught_up, poll

Handler = Callable[[DataResult, StageContext], Awaitable[list[TrainResult]]]


class TrainStage:
    """One train-stage worker in this process with ``handler`` and ``policies``."""

    def __init__(self, bus: Bus, handler: Handler, policies: tuple[Policy, ...]) -> None:
        self.bus = bus
        self.stop = asyncio.Event()
        worker = StageWorker(bus, Stage.train, handler, (DataResult,), filters=[bus.subjects.completed("data")],
                             policies=policies, runner=make_runner(bus.settings, "train"))
        self.task = asyncio.create_task(worker.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=30)


async def send(bus: Bus, rid: str) -> None:
    event = data_failed().model_copy(update={"request_id": rid})
    await bus.publish(bus.subjects.completed("data"), event, msg_id(rid, "data", "completed"))


def result_of(rid: str) -> TrainResult:
    """A training's result that says it succeeded: the worker publishes it on train.completed."""
    return TrainResult(request_id=rid, ok=True, context=context(), data=data_summary(), train=train_summary())


async def published(bus: Bus, subject: str) -> int:
    info = await bus.js.stream_info(bus.subjects.stream_events, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def acked(bus: Bus, messages: int = 1) -> bool:
    """The train consumer has acknowledged ``messages`` deliveries and has nothing pending (nothing
    pending alone is also true before a just-published message reaches the consumer)."""
    if not await caught_up(bus, bus.subjects.stream_events, bus.subjects.durable(Stage.train)):
        return False
    info = await bus.js.consumer_info(bus.subjects.stream_events, bus.subjects.durable(Stage.train))
    return info.ack_floor.consumer_seq >= messages


def stage_policies() -> tuple[Policy, ...]:
    return (SkipCancelled(), IdempotencyStore(), AnnounceProgress())


class CrashOnceAfterTheStore(Policy):
    """The worker 'dies' once, after its result was stored (if it is) and published but before its ack."""

    crashed = False

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        if not self.crashed:
            self.crashed = True
            # The store runs beside this policy (gathered): the crash comes once it has landed.
            kv = await ctx.bus.kv(ctx.subjects.kv_stage_results(ctx.stage))
            await poll(lambda: _stored(kv, f"{ctx.request_id}.{ctx.stage}"), "the result stored", timeout_s=60)
            raise RuntimeError("lost between the store and the ack")


async def test_a_redelivery_after_a_crash_between_store_and_ack_republishes_without_running_again(bus: Bus) -> None:
    runs: list[str] = []

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        runs.append(event.request_id)
        return [result_of(event.request_id)]

    stage = TrainStage(bus, handle, (*stage_policies(), CrashOnceAfterTheStore()))
    try:
        await send(bus, "redelivered-1")
        await poll(lambda: acked(bus), "the redelivered message acknowledged", timeout_s=60)
    finally:
        await stage.close()
    assert runs == ["redelivered-1"], "the stage ran again although its result was stored"
    assert await published(bus, bus.subjects.completed("train")) == 1
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    assert (await kv.get("redelivered-1.train")).value


async def test_a_replayed_first_delivery_finds_its_stored_result(bus: Bus) -> None:
    """A durable consumer recreated (an operator, a lost consumer) delivers the whole stream again,
    every message as a first delivery: a stage that runs candidate code looks for its stored result
    before every handling, so that nothing is trained twice."""
    runs: list[str] = []

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        runs.append(event.request_id)
        return [result_of(event.request_id)]

    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    stored = msgpack.packb([[bus.subjects.completed("train"), "completed", codec.encode(result_of("replayed-1"))]],
                           use_bin_type=True)
    await kv.put("replayed-1.train", stored)  # what the first consumer's handling stored
    await send(bus, "replayed-1")
    stage = TrainStage(bus, handle, stage_policies())
    try:
        await poll(lambda: acked(bus), "the replayed message acknowledged", timeout_s=60)
    finally:
        await stage.close()
    assert runs == [], "a replayed message ran its stage again"
    assert await published(bus, bus.subjects.completed("train")) == 1  # the stored result, republished


async def test_a_cancel_only_the_status_record_knows_stops_the_stage_as_it_starts(bus: Bus) -> None:
    started = asyncio.Event()
    outcome: list[str] = []

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        started.set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("ran to the end")
        return [result_of(event.request_id)]

    status = await bus.kv(bus.subjects.kv_status)
    await status.put("cancelled-1", RequestStatusView(request_id="cancelled-1", status="running",
                                                      cancel_requested=True).model_dump_json().encode())
    stage = TrainStage(bus, handle, stage_policies())
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        await send(bus, "cancelled-1")
        await poll(lambda: acked(bus), "the cancelled message acknowledged", timeout_s=60)
        # Stopped by the first look at the record, not by a heartbeat (heartbeat_s is 1 s here)
        # nor by the end of the sleep.
        assert loop.time() - began < 30
    finally:
        await stage.close()
    assert outcome == ["cancelled"] or not started.is_set()
    assert await published(bus, bus.subjects.completed("train")) == 0


async def test_the_heartbeat_ends_when_a_beat_takes_its_cancel_for_a_result(bus: Bus) -> None:
    """Python 3.11's wait_for can return a reply instead of raising the cancel that came with it
    (tests/unit/test_tasks.py); a beat that does so must not keep the message held for ever."""
    beating = asyncio.Event()

    class TakesItsCancelForAResult(Policy):
        async def beat(self, worker: StageWorker, request_id: str) -> None:
            beating.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                return  # as wait_for does when the reply lands with the cancel

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        await asyncio.wait_for(beating.wait(), timeout=30)  # the first beat is under way
        return [result_of(event.request_id)]

    stage = TrainStage(bus, handle, (IdempotencyStore(), TakesItsCancelForAResult()))
    try:
        await send(bus, "beating-1")
        await poll(lambda: acked(bus), "the message acknowledged", timeout_s=30)
    finally:
        await stage.close()
    assert await published(bus, bus.subjects.completed("train")) == 1




async def test_every_stage_announces_its_start_and_end_and_its_result_tells_its_start_and_stores_the_bytes_it_published(
    bus: Bus,
) -> None:
    """Every handling announces its start before its result and its end after, quick or slow; its
    result says when it started and which attempt it was (StageRun), and the stored copy is the
    very bytes that were published. What a handler tells (ctx.tell) is said on its one `stage
    finished` line, beside the runtime's own facts, which it cannot overwrite."""
    seen: dict[str, list[str]] = {}
    result_data: dict[str, bytes] = {}

    async def on_progress(msg: object) -> None:
        event = codec.decode(msg.data)  # type: ignore[attr-defined]
        seen.setdefault(event.request_id, []).append(f"progress {event.state}")

    async def on_result(msg: object) -> None:
        rid = codec.decode(msg.data).request_id  # type: ignore[attr-defined]
        seen.setdefault(rid, []).append("result")
        result_data[rid] = msg.data  # type: ignore[attr-defined]

    sent: dict[str, datetime] = {}
    began: dict[str, datetime] = {}

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        began[event.request_id] = datetime.now(UTC)
        if event.request_id == "slow-1":
            await asyncio.sleep(0.8)
        if event.request_id == "talks-1":
            await ctx.progress(step=1, total=2)
        ctx.tell(found=event.request_id, delivery="the handler's")
        return [result_of(event.request_id)]

    # One connection for both subjects: the server keeps one sender's order for one receiver.
    subs = [await bus.nc.subscribe(bus.subjects.progress(), cb=on_progress),
            await bus.nc.subscribe(bus.subjects.completed("train"), cb=on_result)]
    await bus.nc.flush()
    stage = TrainStage(bus, handle, stage_policies())
    try:
        with capture_logs() as lines:
            for count, rid in enumerate(("quick-1", "slow-1", "talks-1"), start=1):
                sent[rid] = datetime.now(UTC)
                await send(bus, rid)
                await poll(lambda count=count: acked(bus, count), f"{rid} acknowledged", timeout_s=60)
            await poll(lambda: _true(all(seen.get(rid, [""])[-1] == "progress finished"
                                         for rid in ("quick-1", "slow-1", "talks-1"))),
                       "the progress and the results heard", timeout_s=30)
    finally:
        await stage.close()
        for sub in subs:
            await sub.unsubscribe()
    finished = [line for line in lines if line["event"] == "stage finished"]
    assert sorted(line["found"] for line in finished) == ["quick-1", "slow-1", "talks-1"]
    assert all(line["delivery"] == 1 and line["subject"] == bus.subjects.completed("data") for line in finished)
    assert seen["quick-1"] == ["progress started", "result", "progress finished"]
    assert seen["slow-1"] == ["progress started", "result", "progress finished"]
    assert seen["talks-1"] == ["progress started", "progress running", "result", "progress finished"]
    for rid, data in result_data.items():
        run = codec.decode(data).runs.get(Stage.train)
        assert run is not None and run.attempt == 1, rid
        # The handling's start, not the request's sending nor the result's publishing: it lies between
        # the send and the handler's first line (slow-1's handler sleeps before its result), by order
        # of events, not by a distance between two clocks' readings.
        assert sent[rid] <= run.started_at <= began[rid], rid
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    stored = msgpack.unpackb((await kv.get("quick-1.train")).value, raw=False)
    assert stored == [[bus.subjects.completed("train"), "completed", result_data["quick-1"]]]


async def _true(value: bool) -> bool:
    return value


async def _stored(kv: object, key: str) -> bool:
    try:
        return bool((await kv.get(key)).value)  # type: ignore[attr-defined]
    except nats.js.errors.KeyNotFoundError:
        return False
