"""A typo in a task is refused before any work: at submit time when the client sees the assets,
else by the data stage's pre-check, never after training (the issue's "hours of GPU lost")."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftbus.client import Client
from shared.events import Stage, TaskSpec
from shared.settings import Settings
from shared.taskcheck import UnknownAsset
from tests.integration.conftest import Pipeline, write_workspace
from tests.integration.test_delivery import run_ftbus


async def test_the_client_refuses_an_unknown_benchmark_with_the_known_names(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start([Stage.aggregate])
    assert pipeline.client is not None and pipeline.bus is not None
    ws = write_workspace(tmp_path / "ws")
    for task, needle, known in (
        (TaskSpec(base_model="tiny-standin", benchmark="tiny-arithh"), "unknown benchmark 'tiny-arithh'", "tiny-arith"),
        (TaskSpec(base_model="tiny-standim", benchmark="tiny-arith"), "unknown base model 'tiny-standim'",
         "tiny-standin"),
        (TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", involving_datasets=["qaa"]), "'qaa'", "qa"),
    ):
        with pytest.raises(UnknownAsset) as caught:
            await pipeline.client.submit(ws, task, request_id="typo-1")
        assert needle in str(caught.value) and known in str(caught.value)
    # Nothing was published: no request, no record.
    info = await pipeline.bus.js.stream_info(pipeline.bus.subjects.stream_events)
    assert info.state.messages == 0
    assert await pipeline.client.status("typo-1") is None

    code, out, err = await run_ftbus(
        settings, "submit", str(ws), "--base-model", "tiny-standin", "--benchmark", "tiny-arithh"
    )
    assert code == 2, out + err
    assert "unknown benchmark 'tiny-arithh'" in err and "available benchmarks: tiny-arith" in err


async def test_a_client_without_assets_is_refused_by_the_data_stage_before_training(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    # The submitter's machine has no assets folder: the client cannot check, the data stage does.
    remote = settings.model_copy(update={"assets_dir": tmp_path / "no-assets-here"})
    client = await Client(settings=remote).connect()
    try:
        rid = await client.submit(write_workspace(tmp_path / "ws"),
                                  TaskSpec(base_model="tiny-standin", benchmark="tiny-arithh"))
        verdict = await client.wait(rid, timeout_s=120)
        view = await client.status(rid)
    finally:
        await client.close()
    assert verdict.status == "completed" and verdict.final_decision is False
    assert verdict.failed_stage == "precheck"
    assert "unknown benchmark 'tiny-arithh'" in verdict.execution + verdict.raw_execution + verdict.return_checking
    assert "tiny-arith" in verdict.execution + verdict.raw_execution + verdict.return_checking
    assert view is not None and "train" not in view.stages, "training ran for a task with an unknown benchmark"
