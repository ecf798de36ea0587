"""What a stage worker does around its handler: small policies, each one job (docs/design.md, §5).

A stage worker has all four of :func:`stage_policies`; the aggregator only the metrics (it must see
cancelled requests, keeps no results of its own, and announces nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import msgpack
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from shared import codec, metrics
from shared.bus import Bus
from shared.events import CancelRequested
from shared.handling import Outgoing, StageContext
from shared.logs import get_logger
from shared.records import RequestStatusView
from shared.subjects import msg_id
from shared.tasks import cancel_until_done

if TYPE_CHECKING:
    from shared.runtime import StageWorker

log = get_logger("ftbus.runtime")


def _stage_key(request_id: str, stage: str) -> str:
    return f"{request_id}.{stage}"


class Policy:
    """Hooks around one message's handling; each defaults to doing nothing."""

    #: True: this policy counts the attempts (the consumer's ``max_deliver`` is then unlimited).
    counts_attempts = False

    async def start(self, worker: StageWorker) -> None:
        """The worker starts (before any message)."""

    async def stop(self) -> None:
        """The worker stops."""

    async def skip(self, worker: StageWorker, request_id: str, deliveries: int) -> bool:
        """True: the message needs no handling (it is acked as it is). Every policy is asked, at once."""
        return False

    async def claim(self, worker: StageWorker, msg: Msg, request_id: str, deliveries: int) -> bool:
        """Before the handler: False when the policy settled the message (naked, terminated) instead."""
        return True

    def attempt(self, request_id: str) -> int | None:
        """After :meth:`claim`: which handling of the request at this stage this is, where the
        policy counts them (shared/attempts.py); None: the delivery count stands in."""
        return None

    async def started(self, ctx: StageContext) -> None:
        """The handler starts."""

    async def beat(self, worker: StageWorker, request_id: str) -> None:
        """At every heartbeat while the handler runs."""

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        """The handler returned; its events are being published (beside this)."""

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        """The events are published and the message acked."""

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        """The handler raised, or its results were not published: the message is naked for another attempt."""

    async def abandoned(self, ctx: StageContext) -> None:
        """The handling was cancelled: by request (acked), or this worker stops (naked)."""

    async def cancelled(self, ctx: StageContext) -> None:
        """The request was cancelled while the handler ran: the message is acked, nothing published."""

    def ended(self, ctx: StageContext) -> None:
        """The handling is over, however it ended (also a failed publish, or the worker stopping)."""


class IdempotencyStore(Policy):
    """Stores what the handler published under (request_id, stage); a redelivery after a crash
    between store and ack republishes it instead of running the stage again.

    A stage that runs candidate code looks before every handling: a first delivery may be a replay
    (the durable consumer recreated delivers the stream again, as first deliveries), and nothing
    must be trained twice. The others look on redeliveries only."""

    async def skip(self, worker: StageWorker, request_id: str, deliveries: int) -> bool:
        if deliveries <= 1 and not worker.runs_candidate_code:
            return False
        bus = worker.bus
        kv = await bus.kv(bus.subjects.kv_stage_results(worker.stage))
        try:
            entry = await kv.get(_stage_key(request_id, worker.stage))
        except KeyNotFoundError:
            return False
        if not entry.value:
            return False
        for subject, kind, payload in msgpack.unpackb(entry.value, raw=False):
            await bus.publish_payload(subject, payload, msg_id(request_id, worker.stage, kind))
        log.info("stage already done, republished its stored result")
        return True

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        kv = await ctx.bus.kv(ctx.subjects.kv_stage_results(ctx.stage))
        packed = msgpack.packb([[o.subject, o.kind, o.payload] for o in outgoing], use_bin_type=True)
        await kv.put(_stage_key(ctx.request_id, ctx.stage), packed)


class SkipCancelled(Policy):
    """A cancelled request is skipped, and its running work killed: on the cancel event (core
    NATS), and, since a worker cut off from the server misses that, on the request's status: a
    stage that runs candidate code reads it before it starts, and every stage at each heartbeat."""

    #: Cancels heard on the core subject that this worker remembers (the status record says it too).
    MEMORY = 1024

    def __init__(self) -> None:
        self._worker: StageWorker | None = None
        self._sub: Any = None
        self._seen: dict[str, None] = {}

    async def start(self, worker: StageWorker) -> None:
        self._worker = worker
        self._sub = await worker.bus.nc.subscribe(worker.bus.subjects.cancel, cb=self._on_cancel)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def skip(self, worker: StageWorker, request_id: str, deliveries: int) -> bool:
        if request_id in self._seen or (worker.runs_candidate_code and await is_cancelled(worker.bus, request_id)):
            log.info("request was cancelled, skipping")
            return True
        return False

    async def beat(self, worker: StageWorker, request_id: str) -> None:
        if await is_cancelled(worker.bus, request_id):
            worker.cancel_running(request_id, "cancelled (seen in the status record)")

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            event = codec.decode(msg.data, CancelRequested)
        except codec.CodecError:
            return  # the aggregator dead-letters bad control messages
        self._seen[event.request_id] = None
        while len(self._seen) > self.MEMORY:
            self._seen.pop(next(iter(self._seen)))
        if self._worker is not None:
            self._worker.cancel_running(event.request_id, event.reason)


class AnnounceProgress(Policy):
    """Started / finished / failed / retrying progress events for clients and dashboards."""

    async def started(self, ctx: StageContext) -> None:
        await ctx.progress("started", message=f"attempt {ctx.attempt}")

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        ok = all(not out.kind.endswith("failed") for out in outgoing)
        await ctx.progress("finished" if ok else "failed", message=", ".join(o.kind for o in outgoing))

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        await ctx.progress("retrying", message=f"{type(exc).__name__}: {exc}"[:500])


def stage_policies() -> tuple[Policy, ...]:
    """What every stage worker does around its handler."""
    return (SkipCancelled(), IdempotencyStore(), AnnounceProgress(), MetricsPolicy())


async def is_cancelled(bus: Bus, request_id: str) -> bool:
    kv = await bus.kv(bus.subjects.kv_status)
    try:
        entry = await kv.get(request_id)
    except KeyNotFoundError:
        return False
    if not entry.value:
        return False
    view = RequestStatusView.model_validate_json(entry.value)
    return view.cancel_requested or view.status == "cancelled"


class MetricsPolicy(Policy):
    """Each handling's duration and outcome, the handlings in flight, redeliveries, and the stage
    consumer's queue, read from the server (JetStream's consumer info) every ``metrics_poll_s``: one
    request per worker per interval, whether or not anything scrapes it (shared/metrics.py)."""

    def __init__(self) -> None:
        self._poll: asyncio.Task[None] | None = None

    async def start(self, worker: StageWorker) -> None:
        if worker.bus.settings.metrics_enabled:
            self._poll = asyncio.create_task(_follow_queue(worker), name=f"metrics-{worker.durable}")

    async def stop(self) -> None:
        if self._poll is not None:
            await cancel_until_done([self._poll])

    async def started(self, ctx: StageContext) -> None:
        metrics.IN_FLIGHT.labels(metrics.stage_label(ctx.stage)).inc()
        if ctx.deliveries > 1:
            metrics.REDELIVERIES.labels(metrics.stage_label(ctx.stage)).inc()

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        metrics.stage_done(ctx.stage, metrics.outcome_of(outgoing), metrics.since(ctx.started_at))

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        metrics.stage_done(ctx.stage, "infrastructure_failure", metrics.since(ctx.started_at))

    async def cancelled(self, ctx: StageContext) -> None:
        metrics.stage_done(ctx.stage, "cancelled", metrics.since(ctx.started_at))

    def ended(self, ctx: StageContext) -> None:
        metrics.IN_FLIGHT.labels(metrics.stage_label(ctx.stage)).dec()


async def _follow_queue(worker: StageWorker) -> None:
    """The worker's consumer, as the server says, every ``metrics_poll_s`` until cancelled."""
    while True:
        try:
            if worker.lanes is not None:  # the queue is the lanes (shared/lanes.py)
                lanes = await worker.lanes.summary()
                metrics.lanes_seen(worker.stage, lanes.waiting, lanes.working)
            else:
                info = await worker.bus.js.consumer_info(worker.stream, worker.durable, timeout=5)
                metrics.queue_seen(worker.stage, worker.durable, info)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no consumer yet, the server away: the next read may work
            log.debug("consumer info for the metrics not read", consumer=worker.durable, error=str(exc))
        await asyncio.sleep(worker.bus.settings.metrics_poll_s)
