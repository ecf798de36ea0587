"""The trainer stage: check ``train.yaml``, run LlamaFactory, keep its outputs and loss history.

Consumes ``data.completed``; returns a ``TrainResult``, which its worker publishes on ``train.completed``
or ``train.failed``. Training progress (step, total, loss, ETA) is read from
``output/trainer_log.jsonl`` while it runs and published on ``ftbus.progress.<request_id>``. A
redelivered training resumes from the latest complete checkpoint (services/trainer/checkpoints.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runners.base import EXIT_TIMEOUT, RunResult
from runners.sandbox import Sandbox
from services.trainer.checkpoints import (
    CheckpointError,
    CheckpointManifest,
    CheckpointUploader,
    delete_all,
    download,
    read_manifest,
)
from services.trainer.config import PreparedTrainConfig, TrainConfigError, prepare_train_yaml
from services.trainer.outputs import extract_loss_history, find_model_files, output_files_to_keep
from services.trainer.progress import TrainerLogFollower
from shared import metrics
from shared.artifacts import ArtifactError, ArtifactStore, materialise
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


class Resume(BaseModel):
    """What a training starts from: a downloaded checkpoint, or step 0 (and why, when one was saved)."""

    model_config = ConfigDict(extra="forbid")

    manifest: CheckpointManifest | None = None
    note: str | None = None

    @property
    def folder(self) -> str | None:
        """The checkpoint as train.yaml's resume_from_checkpoint names it (relative to the workspace)."""
        return f"output/{self.manifest.folder}" if self.manifest is not None else None


async def _fetch_checkpoint(ctx: StageContext, store: ArtifactStore, output_dir: Path) -> Resume:
    """The latest complete checkpoint of an earlier attempt, downloaded into ``output_dir``."""
    try:
        manifest = await read_manifest(store, ctx.request_id)
    except CheckpointError as exc:
        return Resume(note=f"{exc}: training restarted from step 0")
    if manifest is None:
        return Resume()
    try:
        await download(store, manifest, output_dir)
    except (ArtifactError, CheckpointError) as exc:
        shutil.rmtree(output_dir, ignore_errors=True)
        return Resume(note=f"the checkpoint of step {manifest.step} could not be downloaded ({exc}): "
                           "training restarted from step 0")
    log.info("resuming training", step=manifest.step, from_attempt=manifest.attempt)
    await ctx.progress(message=f"resuming from the checkpoint of step {manifest.step}")
    return Resume(manifest=manifest)


def _prepare(original_yaml: str, ctx: StageContext, workspace: Path, resume: Resume) -> PreparedTrainConfig:
    settings = ctx.settings
    return prepare_train_yaml(original_yaml, assets_dir=settings.assets, workspace_dir=workspace,
                              checkpoint_every_steps=settings.train_checkpoint_every_steps,
                              resume_from=resume.folder)


async def handle(event: StageResult, ctx: StageContext) -> list[TrainResult]:
    settings = ctx.settings
    rid = event.request_id
    workspace = ctx.workdir / "workspace"
    await materialise(ctx.artifacts, event.context.workspace, workspace)
    if event.data.data is None:  # a malformed upstream event: retrying cannot fix it
        return _result(event, TrainSummary(), "internal error: the data stage's result carried no data.json")
    await ctx.artifacts.get_to_file(event.data.data, workspace / "data.json")

    original_yaml = (workspace / "train.yaml").read_text(errors="replace")
    output_dir = workspace / "output"
    store = await ctx.bus.checkpoint_artifacts()
    resume = await _fetch_checkpoint(ctx, store, output_dir) if settings.train_checkpoint_every_steps else Resume()
    try:
        prepared = _prepare(original_yaml, ctx, workspace, resume)
    except TrainConfigError as exc:
        await delete_all(store, rid, resume.manifest)
        return _result(event, TrainSummary(train_yaml=original_yaml), f"train.yaml rejected: {exc}")

    timeout = ctx.timeout(event.context)
    uploader = CheckpointUploader(store, rid, ctx.deliveries, output_dir, previous=resume.manifest)
    run, first_step = await _train(ctx, event, prepared, workspace, uploader, timeout)
    if resume.manifest is not None:
        step = resume.manifest.step
        if run.exit_code != 0 and not (run.timed_out or run.cancelled or run.oom_killed) and first_step is None:
            # The checkpoint did not load (or the run failed before its first step): once more from 0.
            resume = Resume(note=f"the checkpoint of step {step} did not load (training exited with code "
                                 f"{run.exit_code} before its first step): training restarted from step 0")
            shutil.rmtree(output_dir, ignore_errors=True)
            await delete_all(store, rid, uploader.current)  # a later attempt must not try it again
            uploader = CheckpointUploader(store, rid, ctx.deliveries, output_dir)
            prepared = _prepare(original_yaml, ctx, workspace, resume)
            run, first_step = await _train(ctx, event, prepared, workspace, uploader, timeout)
        elif first_step is not None and first_step <= step:
            resume = Resume(note=f"LlamaFactory did not resume from the checkpoint of step {step} (its first "
                                 f"logged step was {first_step}): training restarted from step 0")
    # The trainer has exited and the GPU is free: the next candidate may start training while
    # this one's outputs upload.
    ctx.device_done()

    log_ref = await ctx.artifacts.put_file(f"{rid}/logs/training.log", ctx.workdir / "training.log")
    kind, model_files = find_model_files(output_dir)
    history = extract_loss_history(output_dir)
    outputs = await _upload_outputs(ctx, rid, workspace, output_dir)
    # Training is over and its outcome stored: the resume state has no use any more.
    await delete_all(store, rid, uploader.current, resume.manifest)
    summary = TrainSummary(
        model_kind=kind,
        model_files=model_files,
        outputs=outputs,
        base_model_path=str(prepared.model_path),
        training_metrics=TrainingMetrics.from_history(history),
        train_yaml=prepared.yaml_text,
        resumed_from_step=resume.manifest.step if resume.manifest is not None else None,
        resume_note=resume.note,
    )
    if run.timed_out:
        error: str | None = f"training timed out after {timeout:.0f} s (exit code {EXIT_TIMEOUT})"
    elif run.exit_code != 0:
        error = f"training exited with code {run.exit_code}"
    elif not model_files:
        error = "training exited 0 but wrote no model files (output/*.safetensors, *.bin, adapter_*)"
    else:
        error = None
    log.info("training done", exit_code=run.exit_code, model_kind=kind, steps=len(history.train),
             resumed_from_step=summary.resumed_from_step)
    if summary.resumed_from_step is not None:  # the steps before the checkpoint were not trained again
        metrics.training_resumed(summary.resumed_from_step)
    return _result(event, summary, error, run.outcome(log_ref))


async def _train(ctx: StageContext, event: StageResult, prepared: PreparedTrainConfig, workspace: Path,
                 uploader: CheckpointUploader, timeout_s: float) -> tuple[RunResult, int | None]:
    """One ``llamafactory-cli train`` run, following its progress and uploading its checkpoints;
    the run and the first step it logged."""
    settings = ctx.settings
    (workspace / "train.yaml").write_text(prepared.yaml_text)
    env = {**TRAIN_ENV, "FTBUS_ASSETS_DIR": str(settings.assets)}
    stop = asyncio.Event()
    steps: list[int] = []
    await ctx.progress(message=f"running {settings.train_command.split()[0]} (loading the model)")
    followers = [asyncio.create_task(_publish_progress(ctx, uploader.output_dir / "trainer_log.jsonl", stop, steps))]
    if prepared.save_steps is not None:
        followers.append(asyncio.create_task(uploader.follow(stop)))
    try:
        run = await ctx.runner.run(
            shlex.split(settings.train_command),
            cwd=workspace,
            env=env,
            timeout_s=timeout_s,
            log_path=ctx.workdir / "training.log",
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
        stop.set()
        for task in followers:
            with contextlib.suppress(Exception):
                await task
    return run, (steps[0] if steps else None)


async def _publish_progress(ctx: StageContext, trainer_log: Path, stop: asyncio.Event, steps: list[int]) -> None:
    async for point in TrainerLogFollower(trainer_log).follow(stop):
        steps.append(point.step)
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
                 disk_quota=lambda settings: settings.train_disk_quota_bytes, device_phase=True, fair_share=True,
                 result=TrainResult, record_name=FailedStage.training, words="training",
                 grants=Grants(
                     note="`ftbus worker train` (GPU nodes). Same shape as data.",
                     artifacts=Grant("artifacts: workspace + data.json in, logs out"),
                     models=Grant("the trained outputs out, to {s.object_store_models} (agents read them there: "
                                  "`ftbus pull`)"),
                     checkpoints=Grant("checkpoints of a running training to {s.object_store_checkpoints}, and "
                                       "back on a redelivery\n(resume state: agents never read it)"),
                     no_cache="the workers-only cache store: any read, and any write (train gets the data\n"
                              "stage's output in the artifacts store; a planted `cache/data/<key>/data.json`\n"
                              "would be served to every request whose process_data.py hashes to that key)"),
                 timeout=lambda settings: settings.train_timeout_s, next=Stage.bench)
