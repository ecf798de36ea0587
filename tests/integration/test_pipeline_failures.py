"""Requests that fail in a stage end with one verdict that names the stage (no benchmark needed)."""

from __future__ import annotations

from pathlib import Path

from shared.events import Stage, TaskSpec
from tests.integration.conftest import Pipeline, write_workspace

NO_BENCH = [Stage.data, Stage.train, Stage.judge, Stage.aggregate]
TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")


async def test_failing_process_data_names_data_processing(pipeline: Pipeline, tmp_path: Path) -> None:
    await pipeline.start(NO_BENCH)
    ws = write_workspace(tmp_path / "ws", script="import sys\nprint('boom here')\nraise SystemExit(3)\n")
    rid = await pipeline.client.submit(ws, TASK)
    verdict = await pipeline.client.wait(rid, timeout_s=60)
    assert verdict.status == "completed"
    assert verdict.final_decision is False
    assert verdict.failed_stage == "data_processing"
    assert "boom here" in verdict.raw_execution
    assert verdict.judge is not None and verdict.judge.kind == "rules"


async def test_missing_train_yaml_gets_its_verdict_at_once(pipeline: Pipeline, tmp_path: Path) -> None:
    await pipeline.start(NO_BENCH)
    ws = write_workspace(tmp_path / "ws", drop=("train.yaml",))
    rid = await pipeline.client.submit(ws, TASK)
    verdict = await pipeline.client.wait(rid, timeout_s=60)
    assert verdict.final_decision is False
    assert verdict.failed_stage == "precheck"
    assert "train.yaml" in verdict.execution + verdict.return_checking
    record = await pipeline.client.status(rid)
    assert record is not None and "train" not in record.stages


async def test_failing_training_names_training(pipeline: Pipeline, tmp_path: Path) -> None:
    await pipeline.start(NO_BENCH)
    ws = write_workspace(tmp_path / "ws", train={"standin_fail": "CUDA error: device-side assert triggered"})
    rid = await pipeline.client.submit(ws, TASK)
    verdict = await pipeline.client.wait(rid, timeout_s=60)
    assert verdict.final_decision is False
    assert verdict.failed_stage == "training"
    assert "device-side assert" in verdict.raw_execution
    # The run died after its first logged step: that point is kept (from trainer_log.jsonl).
    assert [p.step for p in verdict.result.training_metrics.loss_history.train] == [1]
