"""One pipeline table: a pipeline with one stage more, built here from ftbus's own rows and one new
row, flows end to end on a real nats-server with the real services, and its NATS users are
generated, the new stage's included. Nothing outside this file knows the new stage.

The new stage, ``screen``, sits between data and training, with a result type of its own
(``ScreenResult``): it passes the data on when it has at least MIN_SAMPLES samples, and fails the
request otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from ftbus.client import Client
from ftbus.permissions import render, users
from ftbus.stages import BY_STAGE, PIPELINE
from shared.bus import Bus
from shared.events import DataResult, Stage, StageResult, TaskSpec
from shared.runtime import StageContext
from shared.settings import Settings
from shared.stagespec import StageSpec
from shared.subjects import Subjects
from tests.integration.conftest import write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")
MIN_SAMPLES = 20


class ScreenResult(StageResult):
    samples: int


async def screen(event: DataResult, ctx: StageContext) -> list[ScreenResult]:
    stats = event.data.data_stats
    samples = stats.total_samples if stats is not None else 0
    error = f"only {samples} samples: the screen wants {MIN_SAMPLES}" if samples < MIN_SAMPLES else None
    return [ScreenResult(request_id=event.request_id, ok=error is None, context=event.context, data=event.data,
                         error=error, samples=samples)]


SCREEN = StageSpec(
    stage="screen",
    label="screen",
    handler=screen,
    concurrency=4,
    result=ScreenResult,
    record_name="screening",
    words="data screening",
    timeout=lambda settings: 60.0,
    next=Stage.train,
)
#: ftbus's pipeline with the screen between data and training: the data row now leads to it.
EXTENDED = (replace(BY_STAGE[Stage.data], next="screen"), SCREEN,
            *(spec for spec in PIPELINE if spec.stage != Stage.data))


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Client]:
    bus = await Bus.connect(settings, name="extended-pipeline")
    await bus.ensure_topology([spec.stage for spec in EXTENDED])
    stop = asyncio.Event()
    tasks = [asyncio.create_task(spec.run(bus, stop, None, EXTENDED)) for spec in EXTENDED]
    try:
        yield Client.on_bus(bus)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
        await bus.close()


def test_the_table_wires_the_new_stage_in() -> None:
    subjects = Subjects()
    rows = {spec.stage: spec for spec in EXTENDED}
    assert rows[Stage.train].reads(subjects, EXTENDED) == [subjects.completed("screen")]
    assert rows["screen"].reads(subjects, EXTENDED) == [subjects.completed("data")]
    assert subjects.failed("screen") in rows[Stage.judge].reads(subjects, EXTENDED)
    assert subjects.completed("screen") in subjects.event_stream_subjects([spec.stage for spec in EXTENDED])


async def test_a_pipeline_with_one_more_stage_flows_end_to_end(settings: Settings, tmp_path: Path) -> None:
    few = ("import json\n"
           "json.dump([{'instruction': f'add {i}', 'input': '', 'output': str(i)} for i in range(5)],"
           " open('data.json', 'w'))\n")
    async with running(settings) as client:
        good = await client.submit(write_workspace(tmp_path / "good"), TASK)
        small = await client.submit(write_workspace(tmp_path / "small", script=few), TASK)
        passed = await client.wait(good, timeout_s=120)
        refused = await client.wait(small, timeout_s=120)
        good_view, small_view = await client.status(good), await client.status(small)

    assert passed.status == "completed" and passed.final_decision is True, passed.execution
    assert good_view is not None and list(good_view.stages)[:3] == ["data", "screen", "train"]
    assert good_view.stages["screen"].ok is True and good_view.stages["screen"].started_at is not None
    # The screen's refusal reaches the judge (it reads every stage's failures) and the verdict.
    assert refused.status == "completed" and refused.final_decision is False
    assert refused.failed_stage == "screening", refused
    assert "only 5 samples" in refused.execution + refused.raw_execution, refused
    assert small_view is not None and small_view.stages["screen"].ok is False and "train" not in small_view.stages


def test_the_new_stage_gets_a_nats_user_of_its_own() -> None:
    s = Subjects()
    generated = {user.name: user for user in users(s, EXTENDED)}
    assert "screen" in generated and "screen" not in {user.name for user in users(s)}
    user = generated["screen"]
    assert user.publish is not None
    allowed = [subject for _, subjects in user.publish.allow for subject in subjects]
    assert s.completed("screen") in allowed and s.failed("screen") in allowed
    assert f"$JS.API.CONSUMER.MSG.NEXT.{s.stream_events}.{s.durable('screen')}" in allowed
    assert s.bench_test not in allowed and s.verdict() not in allowed
    denied = [subject for _, subjects in user.publish.deny for subject in subjects]
    assert s.bench_test in denied
    # The agent may not forge the new stage's results either.
    agent_denied = [subject for _, subjects in generated["agent"].publish.deny for subject in subjects]  # type: ignore[union-attr]
    assert f"{s.prefix}.screen.>" in agent_denied
    assert "user: screen" in render(s, EXTENDED) and "user: screen" not in render(s)
