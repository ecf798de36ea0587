"""Device slots (shared/consumer.py): a GPU stage's worker takes its next message as soon as the
last one's device work is over, never while the device is busy, and never runs two device phases
at once. Real nats-server; the handlers wait on each other, not on the clock, so that a loaded
machine changes nothing but the run time."""

from __future__ import annotations

import asyncio

from ftbus.stages import PIPELINE
from runners.choice import make_runner
from services.trainer.service import SPEC as TRAIN_SPEC
from shared.bus import Bus
from shared.events import DataResult, Stage, TrainResult
from shared.runtime import StageContext, StageWorker
from shared.settings import Settings
from tests.integration.test_delivery import poll
from tests.integration.test_stage_runtime import acked, result_of, send, stage_policies

#: A hang guard: each of these waits ends as soon as the other handler gets going.
WAIT_S = 60.0


class Device:
    """Counts the handlers inside their device phase; remembers the most at once, and every wait
    that timed out (the runtime would retry the handler and hide it)."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.timeouts: list[str] = []

    async def wait(self, event: asyncio.Event, what: str) -> None:
        try:
            await asyncio.wait_for(event.wait(), WAIT_S)
        except TimeoutError:
            self.timeouts.append(what)
            raise

    async def use(self, hold: asyncio.Event | None = None) -> None:
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            if hold is not None:
                await self.wait(hold, "the device held until the next message started")
            else:
                await asyncio.sleep(0.05)
        finally:
            self.inside -= 1


async def run_workers(bus: Bus, handlers: list, rids: list[str]) -> None:
    stop = asyncio.Event()
    workers = [
        StageWorker(bus, Stage.train, handler, (DataResult,), concurrency=2, device_slots=1,
                    filters=[bus.subjects.completed("data")], policies=stage_policies(),
                    runner=make_runner(bus.settings, "train"))
        for handler in handlers
    ]
    tasks = [asyncio.create_task(worker.run(stop)) for worker in workers]
    try:
        for rid in rids:
            await send(bus, rid)
        await poll(lambda: acked(bus), "every message acknowledged", timeout_s=90)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)


async def test_the_next_message_starts_when_the_device_is_free_not_after_the_uploads(bus: Bus) -> None:
    device = Device()
    started = {rid: asyncio.Event() for rid in ("slot-a", "slot-b", "slot-c")}
    overlapped: list[str] = []

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        rid = event.request_id
        started[rid].set()
        await device.use()
        ctx.device_done()
        if rid == "slot-a":
            # "Uploading" until the next message has started: without device slots it never
            # would (one message at a time), and this wait fails the test.
            await device.wait(started["slot-b"], "the next message started during the uploads")
            overlapped.append(rid)
        return [result_of(rid)]

    await run_workers(bus, [handle], list(started))
    assert device.timeouts == []
    assert overlapped == ["slot-a"]
    assert device.most == 1, "two device phases ran at once"
    assert all(event.is_set() for event in started.values())


async def test_a_worker_whose_device_is_busy_leaves_the_next_message_to_an_idle_worker(bus: Bus) -> None:
    device = Device()
    second_started = asyncio.Event()
    handled_by: dict[str, str] = {}

    def handler(name: str):
        async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
            rid = event.request_id
            handled_by[rid] = name
            if rid == "busy-1":
                # The device stays busy until the second message has started somewhere: had this
                # worker fetched it, it would wait for this slot, and this wait would fail.
                await device.use(hold=second_started)
            else:
                second_started.set()
                await device.use()
            ctx.device_done()
            return [result_of(rid)]

        return handle

    await run_workers(bus, [handler("first worker"), handler("second worker")], ["busy-1", "busy-2"])
    assert device.timeouts == []
    assert set(handled_by) == {"busy-1", "busy-2"}
    assert handled_by["busy-1"] != handled_by["busy-2"]


async def test_without_device_done_the_slot_returns_only_when_the_message_is_done(bus: Bus) -> None:
    handled: list[str] = []
    inside, most = 0, 0

    async def handle(event: DataResult, ctx: StageContext) -> list[TrainResult]:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            await asyncio.sleep(0.2)  # room for a second message to start beside it, were the slot free
        finally:
            inside -= 1
        handled.append(event.request_id)
        return [result_of(event.request_id)]

    await run_workers(bus, [handle], ["whole-1", "whole-2", "whole-3"])
    assert set(handled) == {"whole-1", "whole-2", "whole-3"}
    assert most == 1, "a message started while the last one still held the slot"


def test_the_train_stage_runs_two_messages_per_gpu_slot(settings: Settings) -> None:
    class FakeBus:  # StageSpec.worker reads only the settings and the subjects
        def __init__(self) -> None:
            self.settings = settings
            from shared.subjects import Subjects

            self.subjects = Subjects(settings.subject_prefix)

    runner = make_runner(settings, "train")
    one = TRAIN_SPEC.worker(FakeBus(), PIPELINE, concurrency=1, runner=runner)  # type: ignore[arg-type]
    assert (one.device_slots, one.concurrency) == (1, 2)
    two = TRAIN_SPEC.worker(FakeBus(), PIPELINE, concurrency=2, runner=runner)  # type: ignore[arg-type]
    assert (two.device_slots, two.concurrency) == (2, 4)
