"""The trainer stage: check ``train.yaml``, run LlamaFactory, keep its outputs and loss history.

Consumes ``data.completed``; returns a ``TrainResult``, which its worker publishes on ``train.completed``
or ``train.failed``. Training progress
(step, total, loss, ETA) is read from ``output/trainer_log.jsonl`` while it runs and published
on ``ftbus.progress.<request_id>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from pathlib import Path

from runners.base import EXIT_TIMEOUT
from runners.sandbox import Sandbox
from services.trainer.config import TrainConfigError, prepare_train_yaml
from services.trainer.outputs import extract_loss_history, find_model_files, output_files_to_keep
from services.trainer.progress import TrainerLogFollower
from shared.artifacts import materialise
from shared.events import (
    FailedStage,
    Stage,
    StageOutcome,
    StageResult,
    TrainingMetrics,
    TrainResult,
    TrainSummary,
    WorkspaceFile,
)
from shared.logs import get_logger
from shared.offline import OFFLINE_ENV
from shared.runtime import StageContext
from shared.stagespec import Grant, Grants, StageSpec

log = get_logger("ftbus.trainer")

# LlamaFactory on top of the offline environment: no version check against PyPI, output as it comes.
TRAIN_ENV = {**OFFLINE_ENV, "DISABLE_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}


def _result(event: StageResult, train: TrainSummary, error: str | None,
            outcome: StageOutcome | None = None) -> list[TrainResult]:
    if error is not None:
        log.info("training failed", error=error)
    return [TrainResult(request_id=event.request_id, ok=error is None, context=event.context, data=event.data,
                        train=train, error=error, outcome=outcome)]


async def handle(event: StageResult, ctx: StageContext) -> list[TrainResult]:
    settings = ctx.settings
    rid = event.request_id
    workspace = ctx.workdir / "workspace"
    await materialise(ctx.artifacts, event.context.workspace, workspace)
    if event.data.data is None:  # a malformed upstream event: retrying cannot fix it
        return _result(event, TrainSummary(), "internal error: the data stage's result carried no data.json")
    await ctx.artifacts.get_to_file(event.data.data, workspace / "data.json")

    original_yaml = (workspace / "train.yaml").read_text(errors="replace")
    try:
        prepared = prepare_train_yaml(original_yaml, assets_dir=settings.assets, workspace_dir=workspace)
    except TrainConfigError as exc:
        return _result(event, TrainSummary(train_yaml=original_yaml), f"train.yaml rejected: {exc}")
    (workspace / "train.yaml").write_text(prepared.yaml_text)

    timeout = ctx.timeout(event.context)
    output_dir = workspace / "output"
    log_path = ctx.workdir / "training.log"
    env = {**TRAIN_ENV, "FTBUS_ASSETS_DIR": str(settings.assets)}
    stop_following = asyncio.Event()
    await ctx.progress(message=f"running {settings.train_command.split()[0]} (loading the model)")
    follower = asyncio.create_task(_publish_progress(ctx, output_dir / "trainer_log.jsonl", stop_following))
    try:
        run = await ctx.runner.run(
            shlex.split(settings.train_command),
            cwd=workspace,
            env=env,
            timeout_s=timeout,
            log_path=log_path,
            tail_chars=settings.log_tail_chars,
            # The base model and the raw datasets, read-only; the workspace is the working folder.
            sandbox=Sandbox.reading(
                prepared.model_path,
                prepared.dataset_dir,
                *(settings.assets / "datasets" / name for name in event.context.task.involving_datasets),
                gpus=True,
            ),
        )
    finally:
        stop_following.set()
        with contextlib.suppress(Exception):
            await follower
    # The trainer has exited and the GPU is free: the next candidate may start training while
    # this one's outputs upload.
    ctx.device_done()

    log_ref = await ctx.artifacts.put_file(f"{rid}/logs/training.log", log_path)
    kind, model_files = find_model_files(output_dir)
    history = extract_loss_history(output_dir)
    outputs = await _upload_outputs(ctx, rid, workspace, output_dir)
    summary = TrainSummary(
        model_kind=kind,
        model_files=model_files,
        outputs=outputs,
        base_model_path=str(prepared.model_path),
        training_metrics=TrainingMetrics.from_history(history),
        train_yaml=prepared.yaml_text,
    )
    if run.timed_out:
        error: str | None = f"training timed out after {timeout:.0f} s (exit code {EXIT_TIMEOUT})"
    elif run.exit_code != 0:
        error = f"training exited with code {run.exit_code}"
    elif not model_files:
        error = "training exited 0 but wrote no model files (output/*.safetensors, *.bin, adapter_*)"
    else:
        error = None
    log.info("training done", exit_code=run.exit_code, model_kind=kind, steps=len(history.train))
    return _result(event, summary, error, run.outcome(log_ref))


async def _publish_progress(ctx: StageContext, trainer_log: Path, stop: asyncio.Event) -> None:
    async for point in TrainerLogFollower(trainer_log).follow(stop):
        await ctx.progress(step=point.step, total=point.total, loss=point.loss, eta_s=point.eta_s,
                           message="training")


async def _upload_outputs(ctx: StageContext, rid: str, workspace: Path, output_dir: Path) -> list[WorkspaceFile]:
    # The models store, not the artifacts store: agents may read it (`ftbus pull`), and nothing else.
    models = await ctx.bus.models_artifacts()
    uploaded: list[WorkspaceFile] = []
    for path in output_files_to_keep(output_dir):
        rel = path.relative_to(workspace).as_posix()
        ref = await models.put_file(f"{rid}/{rel}", path)
        uploaded.append(WorkspaceFile(path=rel, ref=ref))
    return uploaded


# It reads the results of the stage before it (the data stage's in ftbus's pipeline): any StageResult.
SPEC = StageSpec(stage=Stage.train, label="train", handler=handle, sandboxed=True,
                 disk_quota=lambda settings: settings.train_disk_quota_bytes, device_phase=True,
                 result=TrainResult, record_name=FailedStage.training, words="training",
                 grants=Grants(
                     note="`ftbus worker train` (GPU nodes). Same shape as data.",
                     artifacts=Grant("artifacts: workspace + data.json in, logs out"),
                     models=Grant("the trained outputs out, to {s.object_store_models} (agents read them there: "
                                  "`ftbus pull`)"),
                     no_cache="the workers-only cache store: any read, and any write (train gets the data\n"
                              "stage's output in the artifacts store; a planted `cache/data/<key>/data.json`\n"
                              "would be served to every request whose process_data.py hashes to that key)"),
                 timeout=lambda settings: settings.train_timeout_s, next=Stage.bench)
