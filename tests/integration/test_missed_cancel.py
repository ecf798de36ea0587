"""A cancel the worker never heard (core NATS: sent while it was cut off) still stops its run:
the heartbeat finds ``cancel_requested`` in the status record (found by the chaos suite)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shared.events import Stage, TaskSpec
from shared.records import RequestStatusView
from shared.settings import Settings
from tests.integration.conftest import Pipeline, wait_for_file, write_workspace
from tests.integration.test_delivery import alive, caught_up, kill_leftovers, read_pids


async def test_a_missed_cancel_is_found_in_the_status_record(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    # No aggregator: nothing publishes a cancel or rewrites the status record but this test.
    await pipeline.start([Stage.data, Stage.train])
    bus, client = pipeline.bus, pipeline.client
    assert bus is not None and client is not None
    pid_file = tmp_path / "trainer.pid"
    ws = write_workspace(tmp_path / "ws", train={"standin_step_s": 0.5, "max_steps": 600,
                                                 "standin_pid_file": str(pid_file)})
    rid = await client.submit(ws, TaskSpec(base_model="tiny-standin", benchmark="tiny-arith"))
    await wait_for_file(pid_file, 120)
    pids = read_pids(pid_file)
    assert pids is not None
    try:
        # What the aggregator records on a cancel, without the cancel message itself.
        status = await bus.kv(bus.subjects.kv_status)
        await status.put(rid, RequestStatusView(request_id=rid, status="running",
                                                cancel_requested=True).model_dump_json().encode())
        loop = asyncio.get_running_loop()
        # Hang guard: the heartbeat (1 s) finds the cancel; the training would run 300 s by itself.
        deadline = loop.time() + 60
        while any(alive(pid) for pid in pids) and loop.time() < deadline:
            await asyncio.sleep(0.2)
        assert not any(alive(pid) for pid in pids), "the training went on after its cancel was recorded"
        # The message was acked (not redelivered), and no training result was published.
        deadline = loop.time() + 60  # hang guard
        while not await caught_up(bus, bus.subjects.stream_events, bus.subjects.durable(Stage.train)):
            assert loop.time() < deadline, "the cancelled message was not acknowledged"
            await asyncio.sleep(0.2)
        info = await bus.js.stream_info(bus.subjects.stream_events, subjects_filter=bus.subjects.completed("train"))
        assert not info.state.subjects
    finally:
        kill_leftovers(pids)
