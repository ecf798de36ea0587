"""Entry point of the aggregator service (`ftbus worker aggregate`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.aggregator.service import ACCEPTS, Aggregator
from shared.bus import Bus
from shared.events import Stage
from shared.stagespec import StageSpec


async def run(bus: Bus, stop: asyncio.Event, concurrency: int = 1, pipeline: Sequence[StageSpec] = ()) -> None:
    # An unreadable event bound for a stage is that stage's to dead-letter: the aggregator learns
    # from the pipeline which subjects the stages read (no service imports another).
    stage_reads = {spec.stage: spec.consumes(bus.subjects) for spec in pipeline if spec.stage is not Stage.aggregate}
    await Aggregator(bus, concurrency=concurrency, stage_reads=stage_reads).run(stop)


SPEC = StageSpec(
    stage=Stage.aggregate,
    label="verdict",
    consumes=lambda s: s.event_stream_subjects(),
    accepts=ACCEPTS,
    emits=lambda s: [s.verdict(), s.report(), s.dlq],
    handler=None,
    entry=run,
    # Record updates of one request are serialised in the aggregator (and compare-and-set across
    # aggregators): many requests' events at once.
    concurrency=32,
)
