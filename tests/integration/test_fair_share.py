"""Fair share across campaigns (shared/lanes.py) on a real nats-server: a campaign that arrives late
is served next, not after everything queued before it; weights and caps hold; a request whose worker
stopped or died keeps its place in its lane; and with the setting off, arrival order."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from runners.choice import make_runner
from shared.attempts import AttemptLimit
from shared.bus import Bus
from shared.events import DataResult, Stage, TrainResult
from shared.lanes import Lane, Lanes
from shared.runtime import StageContext, StageWorker
from shared.settings import Settings
from shared.subjects import msg_id
from tests.fakes.judge_events import context, data_failed
from tests.integration.test_delivery import poll
from tests.integration.test_stage_runtime import result_of


async def send(bus: Bus, rid: str, campaign: str | None) -> None:
    ctx = context()
    ctx = ctx.model_copy(update={"task": ctx.task.model_copy(update={"campaign": campaign})})
    event = data_failed().model_copy(update={"request_id": rid, "context": ctx})
    await bus.publish(bus.subjects.completed("data"), event, msg_id(rid, "data", "completed"))


@dataclass
class Recorder:
    """A train stage's handler that records what it handled, in order, and waits for ``go`` on the
    requests named in ``held`` (a training that runs until the test lets it end)."""

    held: set[str] = field(default_factory=set)
    go: asyncio.Event = field(default_factory=asyncio.Event)
    handled: list[tuple[str, str | None, int]] = field(default_factory=list)
    running: Counter[str] = field(default_factory=Counter)
    most_at_once: Counter[str] = field(default_factory=Counter)
    most_in_all: int = 0

    async def __call__(self, event: DataResult, ctx: StageContext) -> list[TrainResult]:
        campaign = event.context.task.campaign or "-"
        self.handled.append((event.request_id, event.context.task.campaign, ctx.deliveries))
        self.running[campaign] += 1
        self.most_at_once[campaign] = max(self.most_at_once[campaign], self.running[campaign])
        self.most_in_all = max(self.most_in_all, sum(self.running.values()))
        try:
            if event.request_id in self.held:
                await self.go.wait()
        finally:
            self.running[campaign] -= 1
        return [result_of(event.request_id)]

    def order(self) -> list[str]:
        return [rid for rid, _, _ in self.handled]


class Worker:
    """One train worker in this process, on its own connection."""

    def __init__(self, bus: Bus, handler: Recorder, *, fair_share: bool = True, concurrency: int = 1) -> None:
        self.bus = bus
        self.stop = asyncio.Event()
        self.worker = StageWorker(bus, Stage.train, handler, (DataResult,), filters=[bus.subjects.completed("data")],
                                  policies=(AttemptLimit(),), runner=make_runner(bus.settings, "train"),
                                  concurrency=concurrency, fair_share=fair_share)
        self.task = asyncio.create_task(self.worker.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=30)


@contextlib.asynccontextmanager
async def connected(settings: Settings, **changes: object) -> AsyncIterator[Bus]:
    """A connection whose settings differ from the test's by ``changes`` (as another deployment's)."""
    bus = await Bus.connect(settings.model_copy(update=changes), name="fair-share-settings")
    try:
        await bus.ensure_topology()
        yield bus
    finally:
        await bus.close()


async def waiting_in_lanes(bus: Bus, count: int) -> bool:
    return (await Lanes(bus, Stage.train).summary()).waiting >= count


async def gauge_lag(bus: Bus) -> int:
    """The lag an autoscaler reads on the consumer over every lane (KEDA: num_pending + num_ack_pending)."""
    s = bus.subjects
    info = await bus.js.consumer_info(s.stream_lanes(Stage.train), s.lanes_gauge(Stage.train))
    return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


async def test_a_campaign_that_arrives_late_is_served_next_not_after_the_queue(bus: Bus) -> None:
    """Campaign alpha queues six trainings; beta submits one while alpha's first trains. Beta's is the
    next one the worker takes (arrival order would make it the seventh)."""
    recorder = Recorder(held={"alpha-1"})
    worker = Worker(bus, recorder)
    try:
        for i in range(1, 7):
            await send(bus, f"alpha-{i}", "alpha")
        await poll(lambda: _true("alpha-1" in recorder.order()), "alpha's first training started")
        await send(bus, "beta-1", "beta")
        await poll(lambda: waiting_in_lanes(bus, 6), "beta's request in its lane")
        # Six waiting and one in work, as an autoscaler reads them (the stage's own consumer is empty).
        assert await gauge_lag(bus) == 7
        recorder.go.set()
        await poll(lambda: _true(len(recorder.handled) == 7), "all seven trained", timeout_s=60)
        await poll(lambda: _zero(gauge_lag(bus)), "the gauge back to 0: each settled request deleted")
    finally:
        await worker.close()
    assert recorder.order()[:2] == ["alpha-1", "beta-1"], recorder.order()
    assert recorder.order()[2:] == [f"alpha-{i}" for i in range(2, 7)], "a lane's own order is its arrival order"


async def test_with_fair_share_off_requests_are_taken_in_arrival_order(settings: Settings) -> None:
    async with connected(settings, fair_share=False) as off:
        recorder = Recorder(held={"alpha-1"})
        worker = Worker(off, recorder, fair_share=off.settings.fair_share)
        try:
            for i in range(1, 7):
                await send(off, f"alpha-{i}", "alpha")
            await poll(lambda: _true("alpha-1" in recorder.order()), "alpha's first training started")
            await send(off, "beta-1", "beta")
            recorder.go.set()
            await poll(lambda: _true(len(recorder.handled) == 7), "all seven trained", timeout_s=60)
        finally:
            await worker.close()
        assert recorder.order()[-1] == "beta-1", recorder.order()


async def test_weights_share_the_turns_two_to_one(settings: Settings) -> None:
    async with connected(settings, fair_share_weights={"alpha": 2.0}) as weighted:
        recorder = Recorder(held={"alpha-1"})
        worker = Worker(weighted, recorder)
        try:
            await send(weighted, "alpha-1", "alpha")
            await poll(lambda: _true("alpha-1" in recorder.order()), "alpha's first training started")
            for i in range(1, 7):
                await send(weighted, f"beta-{i}", "beta")
            for i in range(2, 8):
                await send(weighted, f"alpha-{i}", "alpha")
            await poll(lambda: waiting_in_lanes(weighted, 12), "twelve requests in their lanes")
            recorder.go.set()
            await poll(lambda: _true(len(recorder.handled) == 13), "all thirteen trained", timeout_s=60)
        finally:
            await worker.close()
        # After alpha-1: alpha has had one turn of weight 2 (half a stride), beta none; from there the
        # strides give alpha two turns for beta's one, whichever came first.
        campaigns = [campaign for _, campaign, _ in recorder.handled[1:10]]
        assert campaigns.count("alpha") == 6 and campaigns.count("beta") == 3, recorder.order()
        assert campaigns[0] == "beta", "beta, which has had no turn, goes first"


async def test_a_cap_holds_a_campaign_to_its_share_of_the_slots(settings: Settings) -> None:
    """Alpha's trainings run until the test lets them end: the slot alpha's cap leaves free goes to
    beta's (each ends at once), and is idle, not alpha's, in between: a third of beta's, sent once
    beta has had two turns to alpha's one (a pick that ignored the cap would give alpha the slot,
    held, and beta's third would never start), is taken there too."""
    alphas = {f"alpha-{i}" for i in range(1, 5)}
    async with connected(settings, fair_share_caps={"alpha": 1}) as capped:
        recorder = Recorder(held=alphas)
        worker = Worker(capped, recorder, concurrency=2)
        try:
            for i in range(1, 5):
                await send(capped, f"alpha-{i}", "alpha")
            for i in range(1, 3):
                await send(capped, f"beta-{i}", "beta")
            await poll(lambda: _true({"beta-1", "beta-2"} <= set(recorder.order())), "beta's two trained")
            await send(capped, "beta-3", "beta")
            await poll(lambda: _true("beta-3" in recorder.order()), "beta's third trained beside alpha's")
            assert recorder.most_at_once["alpha"] == 1, "alpha ran more trainings at once than its cap"
            assert recorder.most_in_all == 2, "beta did not use the slot alpha's cap left free"
            assert sum(rid in alphas for rid in recorder.order()) == 1, recorder.order()
            recorder.go.set()
            await poll(lambda: _true(len(recorder.handled) == 7), "all seven trained", timeout_s=60)
        finally:
            recorder.go.set()
            await worker.close()
        assert recorder.most_at_once["alpha"] == 1, "alpha ran more trainings at once than its cap"
        assert recorder.most_in_all == 2, recorder.order()


async def test_a_request_whose_worker_stopped_keeps_its_place_in_its_lane(bus: Bus) -> None:
    first = Recorder(held={"alpha-1"})
    worker = Worker(bus, first)
    for i in range(1, 4):
        await send(bus, f"alpha-{i}", "alpha")
    await poll(lambda: _true("alpha-1" in first.order()), "alpha's first training started")
    await poll(lambda: waiting_in_lanes(bus, 2), "the other two in their lane")
    await worker.close()  # a stopping worker naks what it was doing: another takes it
    second = Recorder()
    worker = Worker(bus, second)
    try:
        await poll(lambda: _true(len(second.handled) == 3), "all three trained by the second worker", timeout_s=60)
    finally:
        await worker.close()
    assert second.handled[0] == ("alpha-1", "alpha", 2), second.handled
    assert second.order() == ["alpha-1", "alpha-2", "alpha-3"]


async def test_a_request_whose_worker_died_is_taken_again(bus: Bus, settings: Settings) -> None:
    """A worker that dies does not nak: its lane lists the request as in work until the ack wait
    ends. The next worker's pick still finds it there."""
    lost = await Bus.connect(settings, name="lost-worker")
    first = Recorder(held={"alpha-1"})
    worker = Worker(lost, first)
    await send(bus, "alpha-1", "alpha")
    await poll(lambda: _true("alpha-1" in first.order()), "alpha's first training started")
    await lost.nc.close()  # the connection gone with its process: no nak, no ack
    worker.task.cancel()
    await asyncio.gather(worker.task, return_exceptions=True)
    second = Recorder()
    worker = Worker(bus, second)
    try:
        await poll(lambda: _true(len(second.handled) == 1), "the lost request trained again", timeout_s=60)
    finally:
        await worker.close()
    assert second.handled == [("alpha-1", "alpha", 2)]


async def _true(value: bool) -> bool:
    return value


async def _zero(count: Awaitable[int]) -> bool:
    return await count == 0


async def test_a_lane_is_created_once_and_takes_a_changed_ack_wait(bus: Bus, settings: Settings) -> None:
    """The intake makes sure of its lane's consumer on every request, by its info: it creates it the
    first time, leaves it as it is while the settings agree, and updates it when ``ack_wait_s``
    changed (a redeployment with another ack wait)."""
    s = bus.subjects
    lanes = Lanes(bus, Stage.train)
    await lanes.ensure_lane("gamma")
    durable = s.lane_durable(Stage.train, "gamma")
    first = await bus.js.consumer_info(s.stream_lanes(Stage.train), durable)
    assert first.config.ack_wait == settings.ack_wait_s
    await lanes.ensure_lane("gamma")
    again = await bus.js.consumer_info(s.stream_lanes(Stage.train), durable)
    assert again.created == first.created and again.config.ack_wait == settings.ack_wait_s
    async with connected(settings, ack_wait_s=settings.ack_wait_s + 7) as redeployed:
        await Lanes(redeployed, Stage.train).ensure_lane("gamma")
    updated = await bus.js.consumer_info(s.stream_lanes(Stage.train), durable)
    assert updated.config.ack_wait == settings.ack_wait_s + 7


class ListedBeforeTheCopy(Lanes):
    """The pick's listing as the server may answer it a moment after it acknowledged a copy: the
    lane's pending count not yet raised (``lanes`` as listed before the copy)."""

    def __init__(self, bus: Bus, lanes: list[Lane]) -> None:
        super().__init__(bus, Stage.train)
        self.stale = lanes

    async def listing(self) -> list[Lane]:
        return [Lane(lane.name, lane.waiting, lane.working) for lane in self.stale]


async def test_a_request_just_copied_is_picked_even_where_the_listing_does_not_count_it_yet(bus: Bus) -> None:
    """The server raises a lane's pending count a moment after it acknowledges the copy, so the pick
    that the intake wakes may list the lane idle. The pick tries the lane its intake copied into all
    the same, and takes the request then, not a fetch wait (2 s) later."""
    s = bus.subjects
    before = Lanes(bus, Stage.train)
    await before.ensure_lane("gamma")
    stale = [lane for lane in await before.listing() if lane.name == "gamma"]
    assert stale == [Lane("gamma", 0, 0)]
    await send(bus, "gamma-1", "gamma")
    # The request as the intake gets it: from the stage's own consumer on the events stream.
    await bus.ensure_consumer(s.stream_events, "copy-race", [s.completed("data")])
    psub = await bus.js.pull_subscribe_bind("copy-race", s.stream_events)
    (arrived,) = await psub.fetch(1, timeout=60)  # a hang guard: the request is in the stream already
    lanes = ListedBeforeTheCopy(bus, stale)
    await lanes.intake(arrived, None)
    taken = await lanes.take(1)
    assert [msg.data for msg in taken] == [arrived.data]
    await taken[0].ack()
    await psub.unsubscribe()
