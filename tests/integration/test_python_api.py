"""`from ftbus import Client`: the async calls, the blocking evaluate (from a script and from inside a
running event loop, as in a notebook), batches, listing, logs and pickling. Real nats-server,
real services, stand-in toolchain executables."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

from ftbus import Client, EvalTask, Progress, RequestStatusView, Verdict
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace

TASK = {"base_model": "tiny-standin", "benchmark": "tiny-arith", "description": "double numbers"}


async def test_blocking_evaluate_returns_a_typed_verdict_from_a_script_and_from_a_notebook(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    ws = write_workspace(tmp_path / "ws")
    client = Client(settings=settings)
    seen: list[Progress] = []

    # A script: no event loop in the calling thread (the services run on this test's loop, so the
    # blocking call runs in a thread of its own).
    verdict = await asyncio.to_thread(client.evaluate, ws, **TASK, timeout_s=120, on_progress=seen.append)
    assert isinstance(verdict, Verdict)
    assert verdict.status == "completed" and verdict.final_decision is True, verdict.execution
    assert verdict.result.baseline is not None and verdict.result.baseline.difference is not None
    assert verdict.result.baseline.difference > 0
    assert any(p.stage == "train" and p.step for p in seen)

    # A notebook cell: the calling thread already runs a loop, where asyncio.run() would refuse.
    async def cell() -> Verdict:
        return client.evaluate(ws, **TASK, timeout_s=120)

    again = await asyncio.to_thread(lambda: asyncio.run(cell()))
    assert again.final_decision is True and again.request_id != verdict.request_id


async def test_async_client_batches_lists_and_reads_logs(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    good = write_workspace(tmp_path / "good")
    bad = write_workspace(tmp_path / "bad", script="raise SystemExit('no data today')\n")
    async with Client(settings=settings) as client:
        verdicts = await client.aevaluate_many(
            [EvalTask(workspace=good, **TASK), EvalTask(workspace=bad, **TASK)], timeout_s=120
        )
        assert [v.final_decision for v in verdicts] == [True, False]  # in the order given
        ok, failed = verdicts
        assert failed.failed_stage is not None and failed.failed_stage == "data_processing"

        listed = await client.requests()
        assert {v.request_id for v in listed} == {ok.request_id, failed.request_id}
        assert all(isinstance(v, RequestStatusView) for v in listed)
        # A failing candidate is a completed request with final_decision false (error = infrastructure).
        assert {v.request_id for v in await client.requests("completed")} == {ok.request_id, failed.request_id}
        assert await client.requests("running") == []

        # A training that never ends by itself (its gate never opens): only the cancel ends it.
        slow = await client.submit(write_workspace(tmp_path / "slow", train={
            "standin_gate_file": str(tmp_path / "never-opened")}), **TASK)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60  # hang guard
        while [v.request_id for v in await client.requests("running")] != [slow] and loop.time() < deadline:
            await asyncio.sleep(0.1)
        assert [v.request_id for v in await client.requests("running")] == [slow]
        await client.cancel(slow)
        assert (await client.wait(slow, timeout_s=60)).status == "cancelled"  # hang guard: a cancel is at once
        assert [v.request_id for v in await client.requests("cancelled")] == [slow]
        assert [v.request_id for v in await client.requests(["running", "cancelled"])] == [slow]
        assert [v.request_id for v in await client.requests()][-1] == slow  # oldest first

        train_log = await client.log(ok.request_id, "train")
        assert train_log is not None and "Training completed." in train_log
        data_log = await client.log(failed.request_id, "data")
        assert data_log is not None and "no data today" in data_log
        assert await client.log(failed.request_id, "train") is None  # training never ran
        with pytest.raises(ValueError, match="unknown log"):
            await client.log(ok.request_id, "test")  # the hidden split's logs are not for agents

        # Following a finished request prints its log at once and ends.
        items = [item async for item in client.follow_log(ok.request_id, "bench")]
        assert len(items) == 1 and isinstance(items[0], str) and items[0]


async def test_follow_log_streams_progress_until_the_stage_uploads_its_log(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    ws = write_workspace(tmp_path / "ws", train={"standin_step_s": 0.3, "max_steps": 8})
    async with Client(settings=settings) as client:
        rid = await client.submit(ws, **TASK)
        items = [item async for item in client.follow_log(rid, "train", poll_s=0.2)]
        progress = [i for i in items if isinstance(i, Progress)]
        assert progress and all(p.stage == "train" for p in progress)
        assert any(p.step for p in progress)  # live training steps arrived before the log
        assert isinstance(items[-1], str) and "Training completed." in items[-1]
        verdict = await client.wait(rid, timeout_s=120)
        assert verdict.final_decision is True
        assert (await client.status(rid)).status == "completed"  # type: ignore[union-attr]


async def test_a_client_pickles_without_its_connection(settings: Settings) -> None:
    client = Client(settings=settings, client_name="agent-7")
    assert client.settings.client_name == "agent-7" and client.settings.nats_url == settings.nats_url
    async with client:
        copy = pickle.loads(pickle.dumps(client))  # connected: the connection stays behind
        assert copy.settings == client.settings
        with pytest.raises(RuntimeError, match="not connected"):
            _ = copy.bus
        async with copy:
            assert await copy.requests() == []
    with pytest.raises(TypeError, match="unknown ftbus settings: no_such_thing"):
        Client(settings=settings, no_such_thing=1)
