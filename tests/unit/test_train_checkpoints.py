"""Resumable training: which checkpoint folders are complete, the upload's manifest, the download,
and a loss history merged by step (services/trainer/checkpoints.py, outputs.py).

The store is the filesystem one (shared/artifacts.py), the same code the workers use with
``artifact_store: filesystem``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.trainer.checkpoints import (
    CheckpointError,
    CheckpointUploader,
    delete_all,
    download,
    is_complete,
    latest_complete,
    manifest_name,
    read_manifest,
)
from services.trainer.config import prepare_train_yaml
from services.trainer.outputs import extract_loss_history, merge_histories
from shared.artifacts import ArtifactError
from shared.events import LossHistory, TrainLossPoint
from shared.fs_artifacts import FilesystemArtifacts
from shared.train_yaml import load_yaml


def _checkpoint(output: Path, step: int, *, state: bool = True, state_step: int | None = None,
                optimizer: bool = True) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"w" * 32)
    if optimizer:
        (folder / "optimizer.pt").write_bytes(step.to_bytes(4, "little") * 4)
    (folder / "scheduler.pt").write_bytes(b"s")
    (folder / "rng_state.pth").write_bytes(b"r")
    if state:
        history = [{"loss": 1.0 / s, "step": s} for s in range(1, step + 1)]
        (folder / "trainer_state.json").write_text(
            json.dumps({"global_step": step if state_step is None else state_step, "log_history": history}))
    return folder


def test_a_checkpoint_is_complete_once_hf_wrote_its_trainer_state_last(tmp_path: Path) -> None:
    assert is_complete(_checkpoint(tmp_path, 10))
    assert not is_complete(_checkpoint(tmp_path, 20, state=False))  # still being written
    assert not is_complete(_checkpoint(tmp_path, 30, optimizer=False))  # save_only_model: cannot resume
    assert not is_complete(_checkpoint(tmp_path, 40, state_step=39))  # not this folder's state
    half = _checkpoint(tmp_path, 50)
    (half / "trainer_state.json").write_text('{"global_step": 50, "log_hi')  # cut short
    assert not is_complete(half)
    # The latest complete one, not the latest folder.
    assert latest_complete(tmp_path) == (10, tmp_path / "checkpoint-10")


async def test_the_manifest_names_only_a_complete_upload_and_replaces_the_previous(tmp_path: Path) -> None:
    store = FilesystemArtifacts(tmp_path / "store")
    output = tmp_path / "output"
    uploader = CheckpointUploader(store, "r1", 1, output)
    assert await uploader.upload_latest() is None  # nothing yet
    _checkpoint(output, 20, state=False)
    assert await uploader.upload_latest() is None  # being written: not uploaded
    assert await read_manifest(store, "r1") is None

    _checkpoint(output, 10)
    first = await uploader.upload_latest()
    assert first is not None and first.step == 10 and first.attempt == 1
    assert await read_manifest(store, "r1") == first
    assert await uploader.upload_latest() is None  # nothing newer

    (output / "checkpoint-20" / "trainer_state.json").write_text(json.dumps({"global_step": 20, "log_history": []}))
    second = await uploader.upload_latest()
    assert second is not None and second.step == 20
    assert await read_manifest(store, "r1") == second
    # The previous checkpoint's files are gone once the manifest names the new one.
    assert [await store.stat(f.ref.name) for f in first.files] == [None] * len(first.files)
    assert None not in [await store.stat(f.ref.name) for f in second.files]

    # Another attempt downloads it, verified, and resumes from it.
    resumed = tmp_path / "resumed"
    folder = await download(store, second, resumed)
    assert folder == resumed / "checkpoint-20" and is_complete(folder)
    assert (folder / "optimizer.pt").read_bytes() == (output / "checkpoint-20" / "optimizer.pt").read_bytes()

    await delete_all(store, "r1", second)
    assert await store.stat(manifest_name("r1")) is None
    assert [await store.stat(f.ref.name) for f in second.files] == [None] * len(second.files)


async def test_a_corrupted_upload_is_never_resumed_from(tmp_path: Path) -> None:
    store = FilesystemArtifacts(tmp_path / "store")
    _checkpoint(tmp_path / "output", 10)
    manifest = await CheckpointUploader(store, "r2", 1, tmp_path / "output").upload_latest()
    assert manifest is not None
    optimizer = next(f for f in manifest.files if f.path == "optimizer.pt")
    await store.put_bytes(optimizer.ref.name, b"other bytes")  # not what the manifest names
    with pytest.raises(ArtifactError):
        await download(store, manifest, tmp_path / "again")

    await store.put_bytes(manifest_name("r2"), b"{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        await read_manifest(store, "r2")


def test_train_yaml_saves_resumable_checkpoints_and_resumes(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    (assets / "models" / "tiny").mkdir(parents=True)
    (assets / "models" / "tiny" / "config.json").write_text("{}")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "data.json"}}))
    text = "model_name_or_path: tiny\ndataset: d\nsave_only_model: true\n"
    prepared = prepare_train_yaml(text, assets_dir=assets, workspace_dir=ws, checkpoint_every_steps=40,
                                  resume_from="output/checkpoint-160")
    config = load_yaml(prepared.yaml_text, "train.yaml")
    assert prepared.save_steps == 40
    assert config["save_strategy"] == "steps" and config["save_steps"] == 40
    assert config["save_only_model"] is False  # optimizer, scheduler and RNG state are needed to resume
    assert config["resume_from_checkpoint"] == "output/checkpoint-160"
    # The candidate's own save_steps wins; 0 turns checkpoints off (the old behaviour).
    own = prepare_train_yaml(text + "save_steps: 7\n", assets_dir=assets, workspace_dir=ws, checkpoint_every_steps=40)
    assert own.save_steps == 7 and "resume_from_checkpoint" not in load_yaml(own.yaml_text, "train.yaml")
    off = prepare_train_yaml(text, assets_dir=assets, workspace_dir=ws, checkpoint_every_steps=0)
    assert off.save_steps is None and load_yaml(off.yaml_text, "train.yaml")["save_only_model"] is True


def _points(*steps: int, loss: float = 1.0) -> LossHistory:
    return LossHistory(train=[TrainLossPoint(step=s, loss=loss) for s in steps])


def test_histories_merge_by_step_without_gap_or_repeat() -> None:
    merged = merge_histories(_points(1, 2, 3, 4, loss=1.0), _points(3, 4, 5, 6, loss=2.0))
    assert [p.step for p in merged.train] == [1, 2, 3, 4, 5, 6]
    assert [p.loss for p in merged.train] == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # the later source wins


def test_a_killed_resumed_run_has_the_checkpoints_history_then_its_log(tmp_path: Path) -> None:
    output = tmp_path / "output"
    _checkpoint(output, 4)  # steps 1..4, downloaded from the earlier attempt
    lines = [{"current_steps": s, "total_steps": 8, "loss": 0.5} for s in (5, 6, 7)]
    (output / "trainer_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    history = extract_loss_history(output)
    assert [p.step for p in history.train] == [1, 2, 3, 4, 5, 6, 7]


async def test_a_candidates_links_in_its_checkpoints_are_never_uploaded(tmp_path: Path) -> None:
    """The training (candidate code) wrote the output folder: a link to a file of the worker's
    (a secret, the test split) must not travel to the store as part of a checkpoint."""
    secret = tmp_path / "worker-secret"
    secret.write_text("nkey SUAB...")
    output = tmp_path / "output"
    linked = _checkpoint(output, 10, optimizer=False)
    (linked / "optimizer.pt").symlink_to(secret)  # the optimizer state is the secret
    assert not is_complete(linked)  # a linked file is no file of the checkpoint
    ok = _checkpoint(output, 20)
    (ok / "extra.bin").symlink_to(secret)
    (ok / "nested").mkdir()
    (ok / "nested" / "leak").symlink_to(secret)
    store = FilesystemArtifacts(tmp_path / "store")
    manifest = await CheckpointUploader(store, "r1", 1, output).upload_latest()
    assert manifest is not None and manifest.step == 20
    uploaded = {file.path for file in manifest.files}
    assert uploaded and not any("extra.bin" in p or "leak" in p for p in uploaded)
    for file in manifest.files:
        assert await store.get_bytes(file.ref) != secret.read_bytes()
