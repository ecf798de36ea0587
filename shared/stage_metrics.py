"""The stage worker's metrics policy (shared/runtime.py's hooks; the metrics: shared/metrics.py).

Each handling's duration and outcome, the handlings in flight, redeliveries, and the stage
consumer's queue, read from the server (JetStream's consumer info) every ``metrics_poll_s``: one
request per worker per interval, whether or not anything scrapes it.
"""

from __future__ import annotations

import asyncio

from shared import metrics
from shared.logs import get_logger
from shared.runtime import Outgoing, Policy, StageContext, StageWorker
from shared.tasks import cancel_until_done

log = get_logger("ftbus.metrics")


class MetricsPolicy(Policy):
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
            info = await worker.bus.js.consumer_info(worker.stream, worker.durable, timeout=5)
            metrics.queue_seen(worker.stage, worker.durable, info)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no consumer yet, the server away: the next read may work
            log.debug("consumer info for the metrics not read", consumer=worker.durable, error=str(exc))
        await asyncio.sleep(worker.bus.settings.metrics_poll_s)
