"""Which attempts count against a request (shared/attempts.py), on a real nats-server, with train
workers whose links to the server a test cuts (tests/integration/link.py): a worker cut off while
its handler goes on (a partition) uses up no attempt, however often it happens, and a delivery
that meets a live attempt runs nothing; a worker that never comes back does use one up, and after
``max_deliver`` of them the request is dead-lettered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from runners.choice import make_runner
from shared.attempts import AttemptLimit, Attempts, attempts_key
from shared.bus import Bus
from shared.events import DataResult, Stage
from shared.runtime import AnnounceProgress, IdempotencyStore, Outgoing, SkipCancelled, StageContext, StageWorker
from shared.settings import Settings
from tests.integration.link import Link
from tests.integration.test_delivery import caught_up, dead_letters, now, poll
from tests.integration.test_stage_runtime import published, result_of, send

WAIT_S = 90.0


class CutOffWorker:
    """A train worker (its policies as a stage's: shared/stagespec.py) connected through its own link."""

    def __init__(self, link: Link, bus: Bus, worker: StageWorker) -> None:
        self.link, self.bus = link, bus
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(worker.run(self.stop))

    @classmethod
    async def start(cls, settings: Settings, handler: object) -> CutOffWorker:
        link = Link(settings.nats_url or "")
        bus = await Bus.connect(settings, name="cut-off-worker", url=await link.start())
        worker = StageWorker(bus, Stage.train, handler, (DataResult,),  # type: ignore[arg-type]
                             filters=[bus.subjects.completed("data")], runner=make_runner(settings, "train"),
                             policies=(SkipCancelled(), IdempotencyStore(), AnnounceProgress(), AttemptLimit()))
        return cls(link, bus, worker)

    async def close(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self.task, timeout=30)
        await self.bus.close()
        await self.link.close()


@pytest.fixture
async def workers() -> AsyncIterator[list[CutOffWorker]]:
    started: list[CutOffWorker] = []
    yield started
    await asyncio.gather(*(worker.close() for worker in started))


async def attempts_of(bus: Bus, rid: str) -> Attempts | None:
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    try:
        entry = await kv.get(attempts_key(rid, Stage.train))
    except Exception:
        return None
    return Attempts.model_validate_json(entry.value or b"{}")


async def test_a_worker_cut_off_while_its_handler_runs_uses_no_attempt_even_more_than_max_deliver_times(
    bus: Bus, settings: Settings, workers: list[CutOffWorker]
) -> None:
    rid = "partitioned-1"
    release = asyncio.Event()
    runs: list[int] = []

    async def handle(event: DataResult, ctx: StageContext) -> list[Outgoing]:
        runs.append(ctx.deliveries)
        await release.wait()  # a long training: it goes on while its worker is cut off
        return [Outgoing(bus.subjects.completed("train"), result_of(event.request_id), "completed")]

    workers.append(await CutOffWorker.start(settings, handle))
    await send(bus, rid)
    await poll(lambda: now(len(runs) == 1), "the first worker's handler to start", timeout_s=WAIT_S)
    for cut in range(1, settings.max_deliver + 2):
        holder = workers[-1]
        holder.link.cut()  # its heartbeats stop reaching the server: ack_wait expires, a redelivery
        workers.append(await CutOffWorker.start(settings, handle))
        await poll(lambda cut=cut: now(len(runs) == cut + 1), f"takeover {cut} by a worker that was started for it",
                   timeout_s=WAIT_S)
        counted = await attempts_of(bus, rid)
        assert counted is not None and len(counted.lost) == 1, counted
        holder.link.heal()

        async def came_back() -> bool:
            record = await attempts_of(bus, rid)
            return record is not None and record.lost == []

        # Reconnected, the cut-off worker's heartbeat says it was alive: its attempt does not count.
        await poll(came_back, f"the worker cut off ({cut}) to take itself off the lost attempts", timeout_s=WAIT_S)
        # Its heartbeats would keep the message from being redelivered again until its handler
        # ends; stopped (SIGTERM: handling cancelled, message naked), the next cut redelivers it.
        # The naked delivery meets the live holder first and waits: it runs nothing.
        await holder.close()
    release.set()
    await poll(lambda: caught_up(bus, bus.subjects.stream_events, bus.subjects.durable(Stage.train)),
               "the message acknowledged", timeout_s=WAIT_S)
    assert len(runs) == settings.max_deliver + 2  # the takeovers ran: a partition cannot tell a death apart
    assert await published(bus, bus.subjects.completed("train")) == 1
    assert [d for d in await dead_letters(bus) if d.request_id == rid] == []

    async def settled() -> Attempts | None:
        record = await attempts_of(bus, rid)
        return record if record is not None and record.holder is None else None

    record = await poll(settled, "every handling to have finished", timeout_s=WAIT_S)
    assert record.counted == 0 and record.failed == 0


async def test_workers_that_never_come_back_use_up_the_attempts_and_the_request_is_dead_lettered(
    bus: Bus, settings: Settings, workers: list[CutOffWorker]
) -> None:
    rid = "lost-workers-1"
    runs: list[int] = []

    async def handle(event: DataResult, ctx: StageContext) -> list[Outgoing]:
        runs.append(ctx.deliveries)
        await asyncio.Event().wait()  # never returns: its worker is cut off for good (dead, to the server)
        raise AssertionError("unreachable")

    workers.append(await CutOffWorker.start(settings, handle))
    await send(bus, rid)
    for n in range(1, settings.max_deliver + 1):
        await poll(lambda n=n: now(len(runs) == n), f"handling {n} to start", timeout_s=WAIT_S)
        workers[-1].link.cut()
        workers.append(await CutOffWorker.start(settings, handle))

    async def letter() -> object:
        return next((d for d in await dead_letters(bus) if d.request_id == rid), None)

    found = await poll(letter, "the dead letter", timeout_s=WAIT_S)
    assert found.stage == Stage.train and found.deliveries == settings.max_deliver
    assert f"{settings.max_deliver} workers lost" in found.reason and "max_deliver" in found.reason
    assert found.original_subject == bus.subjects.completed("data")
    await poll(lambda: caught_up(bus, bus.subjects.stream_events, bus.subjects.durable(Stage.train)),
               "the message terminated", timeout_s=WAIT_S)
    assert len(runs) == settings.max_deliver  # the last worker ran nothing: the attempts were used up
