"""Each stage's branches on a fake context (tests/fakes/stage_context.py): no server, no toolchain.

The integration tests run the same handlers on a real nats-server; these pin every branch of
what a handler publishes for what its runner did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from services.benchmark import service as bench
from services.data import service as data
from services.trainer import service as trainer
from shared.events import DataResult, DataSummary, EvalRequested, Stage, TrainResult, TrainSummary
from shared.settings import Settings
from tests.fakes.stage_context import (
    FakeBus,
    RecordingRunner,
    fake_context,
    handled,
    request_context,
    upload_workspace,
)
from tests.integration.conftest import write_workspace
from tests.standin.assets import build_standin_assets

RECORDS = [{"instruction": f"add {i} and {i}", "input": "", "output": str(2 * i)} for i in range(60)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("assets")
    build_standin_assets(root)
    return root


@pytest.fixture
def settings(tmp_path: Path, assets: Path) -> Settings:
    return Settings(home=tmp_path / "home", assets_dir=assets, quota_poll_s=0.05)


def writes_data(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
    (cwd / "data.json").write_text(json.dumps(RECORDS))
    return 0, "wrote 60 records\n"


async def _eval(settings: Settings, bus: FakeBus, tmp_path: Path, **workspace: object) -> EvalRequested:
    ws = write_workspace(tmp_path / "ws", **workspace)  # type: ignore[arg-type]
    files = await upload_workspace(bus.stores["artifacts"], ws)
    return EvalRequested(request_id="r1", context=request_context(files, involving_datasets=["qa"]))


# ---------------------------------------------------------------------------- data


async def test_data_precheck_failure_runs_nothing(settings: Settings, tmp_path: Path) -> None:
    runner = RecordingRunner(writes_data)
    ctx = fake_context(Stage.data, settings, runner)
    event = await _eval(settings, ctx.bus, tmp_path, drop=("train.yaml",))  # type: ignore[arg-type]
    [out] = await handled(data.handle, event, ctx)
    assert out.subject == ctx.subjects.failed("data") and out.event.failed_stage == "precheck"
    assert "train.yaml" in (out.event.error or "") and runner.calls == []


async def test_data_success_is_sandboxed_described_and_cached(settings: Settings, tmp_path: Path) -> None:
    runner = RecordingRunner(writes_data)
    ctx = fake_context(Stage.data, settings, runner)
    bus = ctx.bus
    event = await _eval(settings, bus, tmp_path)  # type: ignore[arg-type]
    [out] = await handled(data.handle, event, ctx)
    assert out.subject == ctx.subjects.completed("data"), out.event.error
    summary = out.event.data
    assert summary.data_stats.total_samples == 60 and summary.cached is False
    run = out.event.runs["data_processing"]  # the run, under the data row's record name
    assert out.event.outcome.sandbox == run.outcome.sandbox == "docker:fake"
    [call] = runner.calls
    assert call.argv == ["python", "process_data.py"]
    mounted = {m.path for m in call.sandbox.mounts}
    assert mounted == {settings.assets / "models" / "tiny-standin", settings.assets / "datasets" / "qa"}
    assert not call.sandbox.gpus and call.sandbox.llm_socket is None
    assert "OPENAI_API_KEY" not in call.env  # no LLM configured: no key, no network
    # The same workspace again: served from the cache, nothing runs.
    again = fake_context(Stage.data, settings, runner, request_id="r2", bus=bus)  # type: ignore[arg-type]
    [cached] = await handled(data.handle, event.model_copy(update={"request_id": "r2"}), again)
    assert cached.event.data.cached is True and len(runner.calls) == 1
    assert "r2/data/data.json" in bus.stores["artifacts"].objects


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (lambda argv, cwd, env: (3, "boom\n"), "process_data.py exited with code 3"),
        (lambda argv, cwd, env: ((cwd / "data.json").symlink_to("/etc/passwd"), (0, ""))[1], "data.json refused"),
        (lambda argv, cwd, env: ((cwd / "data.json").write_text("{}"), (0, ""))[1], "data.json"),
        (lambda argv, cwd, env: (0, "forgot to write it\n"), "wrote no data.json"),
    ],
    ids=["exit", "symlink", "not-a-list", "missing"],
)
async def test_data_failures_name_the_cause(settings: Settings, tmp_path: Path, script: object, expected: str) -> None:
    ctx = fake_context(Stage.data, settings, RecordingRunner(script))  # type: ignore[arg-type]
    [out] = await handled(data.handle, await _eval(settings, ctx.bus, tmp_path), ctx)  # type: ignore[arg-type]
    assert out.subject == ctx.subjects.failed("data")
    assert out.event.failed_stage == "data_processing" and expected in (out.event.error or "")


async def test_data_timeout_says_124(settings: Settings, tmp_path: Path) -> None:
    ctx = fake_context(Stage.data, settings, RecordingRunner(writes_data, timed_out=True))
    [out] = await handled(data.handle, await _eval(settings, ctx.bus, tmp_path), ctx)  # type: ignore[arg-type]
    assert "timed out" in (out.event.error or "") and "124" in (out.event.error or "")


# ---------------------------------------------------------------------------- train


async def _data_result(settings: Settings, bus: FakeBus, tmp_path: Path, **workspace: object) -> DataResult:
    event = await _eval(settings, bus, tmp_path, **workspace)
    ref = await bus.stores["artifacts"].put_bytes("r1/data/data.json", json.dumps(RECORDS).encode())
    return DataResult(request_id="r1", ok=True, context=event.context, data=DataSummary(data=ref))


def trains(kind: str = "lora") -> object:
    def script(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
        out = cwd / "output"
        out.mkdir()
        names = ["adapter_model.safetensors", "adapter_config.json"] if kind == "lora" else ["model.safetensors"]
        for name in names:
            (out / name).write_bytes(b"{}")
        history = [{"step": s, "loss": 3.0 / s} for s in range(1, 6)]
        (out / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        return 0, "training done\n"

    return script


async def test_training_success_keeps_outputs_and_loss(settings: Settings, tmp_path: Path) -> None:
    runner = RecordingRunner(trains())  # type: ignore[arg-type]
    ctx = fake_context(Stage.train, settings, runner)
    [out] = await handled(trainer.handle, await _data_result(settings, ctx.bus, tmp_path), ctx)  # type: ignore[arg-type]
    assert out.subject == ctx.subjects.completed("train"), out.event.error
    summary = out.event.train
    assert summary.model_kind == "lora" and len(summary.training_metrics.loss_history.train) == 5
    assert {f.path for f in summary.outputs} >= {"output/adapter_model.safetensors", "output/adapter_config.json"}
    [call] = runner.calls
    assert call.argv == ["llamafactory-cli", "train", "train.yaml"] and call.sandbox.gpus
    assert settings.assets / "models" / "tiny-standin" in {m.path for m in call.sandbox.mounts}
    assert call.env["HF_HUB_OFFLINE"] == "1"


async def test_a_checkpoint_that_does_not_load_restarts_training_from_zero(settings: Settings, tmp_path: Path) -> None:
    """An earlier attempt's checkpoint is resumed from; when the run fails before its first step
    (the checkpoint did not load), training runs again from step 0 and the summary says why."""
    from services.trainer.checkpoints import CheckpointUploader, read_manifest

    saved = tmp_path / "earlier" / "checkpoint-10"
    saved.mkdir(parents=True)
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (saved / name).write_bytes(b"x")
    (saved / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": []}))
    runner = RecordingRunner(trains())  # type: ignore[arg-type]
    ctx = fake_context(Stage.train, settings, runner)
    store = ctx.bus.stores["checkpoints"]  # type: ignore[attr-defined]
    assert await CheckpointUploader(store, "r1", 1, saved.parent).upload_latest() is not None
    train_ok = runner.script

    def refuses_the_checkpoint(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
        if "resume_from_checkpoint: output/checkpoint-10" in (cwd / "train.yaml").read_text():
            assert (cwd / "output" / "checkpoint-10" / "optimizer.pt").is_file()  # downloaded
            return 1, "RuntimeError: Error(s) in loading state_dict\n"
        return train_ok(argv, cwd, env)  # type: ignore[operator]

    runner.script = refuses_the_checkpoint
    [out] = await handled(trainer.handle, await _data_result(settings, ctx.bus, tmp_path), ctx)  # type: ignore[arg-type]
    assert out.subject == ctx.subjects.completed("train"), out.event.error
    summary = out.event.train
    assert summary.resumed_from_step is None
    assert "checkpoint of step 10 did not load" in (summary.resume_note or "")
    assert "restarted from step 0" in (summary.resume_note or "")
    assert len(runner.calls) == 2 and "resume_from_checkpoint" not in summary.train_yaml
    assert await read_manifest(store, "r1") is None  # training ended: its checkpoints are gone


@pytest.mark.parametrize(
    ("script", "workspace", "expected", "ran"),
    [
        (lambda a, c, e: (0, ""), {}, "wrote no model files", True),
        (lambda a, c, e: (1, "Traceback\n"), {}, "training exited with code 1", True),
        (trains(), {"train": {"dataset_dir": "/etc"}}, "train.yaml rejected", False),
        (trains(), {"train": {"deepspeed": "/root/ds.json"}}, "must be a path inside the workspace", False),
    ],
    ids=["no-model", "exit", "dataset-dir-outside", "deepspeed-outside"],
)
async def test_training_failures_name_the_cause(
    settings: Settings, tmp_path: Path, script: object, workspace: dict, expected: str, ran: bool
) -> None:
    runner = RecordingRunner(script)  # type: ignore[arg-type]
    ctx = fake_context(Stage.train, settings, runner)
    [out] = await handled(trainer.handle, await _data_result(settings, ctx.bus, tmp_path, **workspace), ctx)  # type: ignore[arg-type]
    assert out.subject == ctx.subjects.failed("train") and expected in (out.event.error or "")
    assert bool(runner.calls) is ran


# ---------------------------------------------------------------------------- bench


async def _train_result(settings: Settings, bus: FakeBus, tmp_path: Path, outputs: dict[str, bytes],
                        benchmark: str = "tiny-arith") -> TrainResult:
    event = await _eval(settings, bus, tmp_path)
    files = []
    store = bus.stores["models"]
    for name, content in outputs.items():
        from shared.events import WorkspaceFile

        files.append(WorkspaceFile(path=f"output/{name}", ref=await store.put_bytes(f"r1/output/{name}", content)))
    context = event.context.model_copy(update={"task": event.context.task.model_copy(update={"benchmark": benchmark})})
    return TrainResult(request_id="r1", ok=True, context=context, data=DataSummary(),
                       train=TrainSummary(outputs=files, model_kind="lora",
                                          base_model_path=str(settings.assets / "models" / "tiny-standin")))


async def test_an_unknown_benchmark_fails_both_splits_with_the_known_names(settings: Settings, tmp_path: Path) -> None:
    runner = RecordingRunner(lambda a, c, e: (0, ""))
    ctx = fake_context(Stage.bench, settings, runner)
    event = await _train_result(settings, ctx.bus, tmp_path, {"adapter_model.safetensors": b"x"}, "tiny-arithm")  # type: ignore[arg-type]
    outs = await handled(bench.handle, event, ctx)
    assert [o.kind for o in outs] == ["failed", "test"] and runner.calls == []
    assert all("tiny-arith" in (o.event.error or "") for o in outs)


async def test_pickled_weights_are_refused_unloaded(settings: Settings, tmp_path: Path) -> None:
    runner = RecordingRunner(lambda a, c, e: (0, ""))
    ctx = fake_context(Stage.bench, settings, runner)
    outputs = {"adapter_config.json": b"{}", "adapter_model.bin": b"\x80\x04pickle"}
    outs = await handled(bench.handle, await _train_result(settings, ctx.bus, tmp_path, outputs), ctx)  # type: ignore[arg-type]
    assert runner.calls == [] and all("pickle format" in (o.event.error or "") for o in outs)


async def test_each_split_runs_sandboxed_and_a_failing_harness_is_named(settings: Settings, tmp_path: Path) -> None:
    runner = RecordingRunner(lambda a, c, e: (2, "lm_eval: error\n"))
    ctx = fake_context(Stage.bench, settings, runner)
    event = await _train_result(settings, ctx.bus, tmp_path, {"adapter_model.safetensors": b"x",
                                                               "adapter_config.json": b"{}"})  # type: ignore[arg-type]
    outs = await handled(bench.handle, event, ctx)
    assert [o.subject for o in outs] == [ctx.subjects.failed("bench"), ctx.subjects.bench_test]
    assert all("exited with code 2" in (o.event.error or "") for o in outs)
    assert len(runner.calls) == 2  # validation and test; no baseline for a failed candidate run
    for call in runner.calls:
        mounts = {m.path for m in call.sandbox.mounts}
        assert call.sandbox.gpus and os.path.basename(call.cwd).startswith("bench-")
        assert mounts == {settings.assets / "models" / "tiny-standin", ctx.workdir / "output"}
    # The test split's log goes to the private store, never to the artifacts agents may read.
    assert any("benchmark-test.log" in name for name in ctx.bus.stores["private"].objects)  # type: ignore[attr-defined]
    assert not any("benchmark-test.log" in name for name in ctx.bus.stores["artifacts"].objects)  # type: ignore[attr-defined]
