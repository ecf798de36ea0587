"""Entry point of the aggregator service (`ftbus worker aggregate`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.aggregator.service import Aggregator
from shared.bus import Bus
from shared.events import CancelRequested, EvalRequested, FailedStage, Stage
from shared.stagespec import StageSpec


async def run(bus: Bus, stop: asyncio.Event, concurrency: int = 1, pipeline: Sequence[StageSpec] = ()) -> None:
    # What it knows of the stages (their results, subjects, timeouts, names) comes from the
    # pipeline table, handed over here: no service imports another.
    await Aggregator(bus, pipeline, concurrency=concurrency).run(stop)


SPEC = StageSpec(
    stage=Stage.aggregate,
    label="verdict",
    consumes=lambda s, pipeline: s.event_stream_subjects([spec.stage for spec in pipeline]),
    # And every stage's result, as the pipeline it is given says (Aggregator.accepts).
    accepts=(EvalRequested, CancelRequested),
    emits=lambda s: [s.verdict(), s.report(), s.dlq],
    handler=None,
    entry=run,
    # Record updates of one request are serialised in the aggregator (and compare-and-set across
    # aggregators): many requests' events at once.
    concurrency=32,
    record_name=FailedStage.aggregate,
    words="aggregator",
)
