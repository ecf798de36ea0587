"""Resumable training: the checkpoints HF Trainer writes in ``output/checkpoint-<step>/``, their
upload while the training runs, and their download when a redelivered training resumes.

HF Trainer (``Trainer._save_checkpoint``) writes a checkpoint in this order: the weights, then
``optimizer.pt`` and ``scheduler.pt``, the RNG state (``rng_state.pth``, one per process), and
last ``trainer_state.json``. A folder is complete when its trainer_state.json reads as JSON whose
``global_step`` is the folder's step and the resume files lie beside it: everything written before
it is then complete too. Anything less is a checkpoint still being written (or one cut short by a
kill) and is never uploaded.

The checkpoints store (trainer-private: agents never read it) holds
``<id>/attempt-<n>/checkpoint-<step>/<file>`` and ``<id>/manifest.json``, which names the latest
complete upload. The manifest is written only once every file of its checkpoint is uploaded and
read back with the sha256 of the file on disk, and the previous checkpoint's files are deleted only
after it: the manifest never names a partial upload, and each attempt writes under its own prefix,
so a new attempt never overwrites the files the manifest names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from datetime import datetime
from pathlib import Path, PurePosixPath

from pydantic import Field

from services.trainer.outputs import TRAINER_STATE
from shared.artifacts import ArtifactError, ArtifactStore
from shared.events import Model, WorkspaceFile, utcnow
from shared.logs import get_logger

log = get_logger("ftbus.trainer.checkpoints")

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
MANIFEST = "manifest.json"
#: What HF Trainer needs besides the weights to resume exactly where it stopped.
_RESUME_FILES = ("optimizer.pt", "scheduler.pt")


class CheckpointError(RuntimeError):
    """An upload that did not read back as written, or a manifest that cannot be used."""


class CheckpointManifest(Model):
    """The latest complete checkpoint of a request's training in the checkpoints store."""

    request_id: str
    attempt: int
    step: int
    #: The folder's name in ``output/``: ``checkpoint-<step>``.
    folder: str
    #: Every file, its path relative to the folder.
    files: list[WorkspaceFile] = Field(default_factory=list)
    saved_at: datetime = Field(default_factory=utcnow)


def manifest_name(request_id: str) -> str:
    return f"{request_id}/{MANIFEST}"


def checkpoint_step(name: str) -> int | None:
    match = CHECKPOINT.match(name)
    return int(match[1]) if match else None


def is_complete(folder: Path) -> bool:
    """HF Trainer has finished writing ``folder`` (see the module's docstring)."""
    step = checkpoint_step(folder.name)
    if step is None or folder.is_symlink() or not folder.is_dir():
        return False
    state = folder / TRAINER_STATE
    if state.is_symlink() or not state.is_file():
        return False
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
        names = {p.name for p in folder.iterdir() if p.is_file() and not p.is_symlink()}
    except (OSError, ValueError):  # half written, or rotated away while we looked
        return False
    if not isinstance(data, dict) or data.get("global_step") != step:
        return False
    return all(n in names for n in _RESUME_FILES) and any(n.startswith("rng_state") for n in names)


def latest_complete(output_dir: Path) -> tuple[int, Path] | None:
    """The complete checkpoint of the highest step in ``output_dir``, if any."""
    if not output_dir.is_dir() or output_dir.is_symlink():
        return None
    found = [(step, p) for p in output_dir.iterdir() if (step := checkpoint_step(p.name)) is not None]
    for step, folder in sorted(found, reverse=True):
        if is_complete(folder):
            return step, folder
    return None


def checkpoint_files(folder: Path) -> list[Path]:
    """Regular files under ``folder``, sorted; links skipped (the sandbox wrote this folder)."""
    files: list[Path] = []
    stack = [folder]
    while stack:
        for entry in stack.pop().iterdir():
            if entry.is_symlink():
                continue
            if entry.is_dir():
                stack.append(entry)
            elif entry.is_file():
                files.append(entry)
    return sorted(files)


async def read_manifest(store: ArtifactStore, request_id: str) -> CheckpointManifest | None:
    """The request's manifest; None when there is none. Raises CheckpointError when it is unusable."""
    ref = await store.stat(manifest_name(request_id))
    if ref is None:
        return None
    try:
        manifest = CheckpointManifest.model_validate_json(await store.get_bytes(ref))
    except (ArtifactError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint manifest is unreadable: {exc}") from exc
    if manifest.request_id != request_id or checkpoint_step(manifest.folder) != manifest.step:
        raise CheckpointError(f"the checkpoint manifest names {manifest.folder} of {manifest.request_id}")
    return manifest


async def download(store: ArtifactStore, manifest: CheckpointManifest, output_dir: Path) -> Path:
    """The manifest's checkpoint into ``output_dir/<folder>`` (every file's sha256 checked)."""
    folder = output_dir / manifest.folder
    for file in manifest.files:
        rel = PurePosixPath(file.path)
        if rel.is_absolute() or ".." in rel.parts:
            raise CheckpointError(f"the checkpoint manifest names a file outside its folder: {file.path!r}")
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        await store.get_to_file(file.ref, dest)
    if not is_complete(folder):
        raise CheckpointError(f"{manifest.folder} downloaded but is not a complete checkpoint")
    return folder


async def delete_checkpoint(store: ArtifactStore, manifest: CheckpointManifest | None) -> None:
    if manifest is None:
        return
    for file in manifest.files:
        await store.delete(file.ref.name)


async def delete_all(store: ArtifactStore, request_id: str, *manifests: CheckpointManifest | None) -> None:
    """The manifest first (so that it never names a deleted file), then the checkpoints it and
    ``manifests`` name. Objects of a worker killed mid-upload are the retention sweep's."""
    named = await read_manifest_quietly(store, request_id)
    await store.delete(manifest_name(request_id))
    files = {file.ref.name for m in (named, *manifests) if m is not None for file in m.files}
    for name in sorted(files):
        await store.delete(name)


async def read_manifest_quietly(store: ArtifactStore, request_id: str) -> CheckpointManifest | None:
    try:
        return await read_manifest(store, request_id)
    except CheckpointError:
        return None


class CheckpointUploader:
    """Uploads each new complete checkpoint of one training attempt, replacing the previous one."""

    def __init__(self, store: ArtifactStore, request_id: str, attempt: int, output_dir: Path,
                 previous: CheckpointManifest | None = None) -> None:
        self.store = store
        self.request_id = request_id
        self.attempt = attempt
        self.output_dir = output_dir
        #: What the manifest names now: an earlier attempt's checkpoint, then this one's latest.
        self.current = previous
        #: The step of the checkpoint uploaded last (the one resumed from, at first).
        self.step: int | None = previous.step if previous is not None else None

    async def upload_latest(self) -> CheckpointManifest | None:
        """Upload the latest complete checkpoint if it is newer than the current one; the new
        manifest, or None when there was nothing new (or it vanished while uploading)."""
        found = await asyncio.to_thread(latest_complete, self.output_dir)
        if found is None or (self.step is not None and found[0] <= self.step):
            return None
        step, folder = found
        prefix = f"{self.request_id}/attempt-{self.attempt}/{folder.name}"
        files: list[WorkspaceFile] = []
        try:
            for path in await asyncio.to_thread(checkpoint_files, folder):
                rel = path.relative_to(folder).as_posix()
                files.append(WorkspaceFile(path=rel, ref=await self.store.put_file(f"{prefix}/{rel}", path)))
            if not await asyncio.to_thread(is_complete, folder):
                raise FileNotFoundError(f"{folder.name} changed while it uploaded")
        except OSError as exc:  # HF's save_total_limit rotated it away: the next one will do
            log.info("checkpoint not uploaded", checkpoint=folder.name, reason=str(exc))
            await delete_checkpoint(self.store, CheckpointManifest(
                request_id=self.request_id, attempt=self.attempt, step=step, folder=folder.name, files=files))
            return None
        for file in files:
            back = await self.store.stat(file.ref.name)
            if back is None or back.sha256 != file.ref.sha256 or back.size != file.ref.size:
                raise CheckpointError(f"{file.ref.name} did not read back as uploaded")
        manifest = CheckpointManifest(request_id=self.request_id, attempt=self.attempt, step=step,
                                      folder=folder.name, files=files)
        await self.store.put_bytes(manifest_name(self.request_id), manifest.model_dump_json().encode())
        if await read_manifest(self.store, self.request_id) != manifest:
            raise CheckpointError("the checkpoint manifest did not read back as written")
        replaced, self.current, self.step = self.current, manifest, step
        if replaced is not None and (replaced.attempt, replaced.folder) != (manifest.attempt, manifest.folder):
            await delete_checkpoint(self.store, replaced)
        log.info("checkpoint uploaded", step=step, files=len(files), bytes=sum(f.ref.size for f in files))
        return manifest

    async def follow(self, stop: asyncio.Event, poll_s: float = 2.0) -> None:
        """Upload each new complete checkpoint until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.upload_latest()
            except Exception as exc:  # a failed upload must not stop the training: the next may work
                log.warning("checkpoint upload failed", error=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=poll_s)
