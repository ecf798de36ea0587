"""The artifact store: workspaces, data, training outputs and logs, keyed ``<request_id>/<path>``.

Events carry :class:`~shared.events.ArtifactRef` (name, size, sha256), never the bytes. Two stores
behave the same: ``ObjectStoreArtifacts`` on the JetStream Object Store (shared/object_artifacts.py,
the default: nothing else to run) and ``FilesystemArtifacts`` on a shared filesystem
(shared/fs_artifacts.py, for models too big to push through NATS). Every read is verified against
the reference's sha256 and size, so a reader never acts on a file that was overwritten, truncated
or corrupted after the reference was made. This module holds what both share: the protocol, the
errors, the names, the verified write of a local file, and a workspace's upload and download.

Writes of a local file are atomic: bytes go to a temporary file beside the destination, are
verified, then renamed into place. A reader therefore sees the old file or the new one, never half.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat as stat_mod
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol, runtime_checkable

from shared.events import ArtifactRef, WorkspaceFile
from shared.paths import UnsafePath, safe_join, validate_relative_path

# Names skipped by upload_dir unless the caller says otherwise: caches and VCS data are never part
# of a candidate, and a `.git` folder alone can exceed the workspace limits.
DEFAULT_SKIP_NAMES: frozenset[str] = frozenset({"__pycache__", ".git"})

#: How much a local copy reads at once.
COPY_CHUNK = 4 * 2**20
_UPLOAD_CONCURRENCY = 4


class ArtifactError(Exception):
    """Base of the artifact store's errors."""


class ArtifactMissing(ArtifactError):
    """The named artifact does not exist (never stored, deleted, or expired)."""


class ArtifactCorrupt(ArtifactError):
    """The stored bytes do not match the reference (sha256 or size): overwritten or damaged."""


class WorkspaceTooLarge(ArtifactError):
    """A workspace exceeds the configured size or file-count limit."""


@runtime_checkable
class ArtifactStore(Protocol):
    async def put_file(self, name: str, path: Path) -> ArtifactRef: ...

    async def put_bytes(self, name: str, data: bytes) -> ArtifactRef: ...

    async def get_to_file(self, ref: ArtifactRef, dest: Path) -> None: ...

    async def get_bytes(self, ref: ArtifactRef) -> bytes: ...

    async def stat(self, name: str) -> ArtifactRef | None: ...

    async def delete(self, name: str) -> None: ...


def validate_name(name: str) -> str:
    """Artifact names obey the same rules as workspace paths, so a name is always a safe path."""
    return str(validate_relative_path(name))


# ---------------------------------------------------------------------------- verified local writes


def verify(ref: ArtifactRef, size: int, sha256: str) -> None:
    if size != ref.size or sha256 != ref.sha256:
        raise ArtifactCorrupt(
            f"artifact {ref.name!r} does not match its reference: expected {ref.size} bytes with sha256 "
            f"{ref.sha256}, got {size} bytes with sha256 {sha256}. It was overwritten or damaged after "
            f"the reference was made; re-run the stage that produced it"
        )


def open_exclusive(path: Path) -> BinaryIO:
    # O_EXCL: a temporary name never silently shares a file with another writer. Mode 0o666
    # minus the umask, like any normal file (mkstemp's 0o600 would hide it from other users,
    # e.g. a container running candidate code under another uid).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, "wb")


def _temp_beside(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.ftbus-tmp-{secrets.token_hex(6)}")


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def write_verified(
    ref: ArtifactRef, dest: Path, fill: Callable[[BinaryIO], Awaitable[tuple[int, str]]]
) -> None:
    """Run ``fill`` into a temporary file beside ``dest``, verify it, then rename it into place."""
    dest = Path(dest)
    await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
    tmp = _temp_beside(dest)
    fh = await asyncio.to_thread(open_exclusive, tmp)
    try:
        try:
            size, sha = await fill(fh)
        finally:
            await asyncio.to_thread(fh.close)
        verify(ref, size, sha)
        await asyncio.to_thread(os.replace, tmp, dest)
    except BaseException:
        unlink_quietly(tmp)
        raise


# ---------------------------------------------------------------------------- workspaces


@dataclass(frozen=True)
class _LocalFile:
    rel: PurePosixPath
    path: Path
    size: int


def _scan(
    root: Path,
    exclude: Callable[[PurePosixPath], bool] | None,
    skip_names: Collection[str],
) -> list[_LocalFile]:
    files: list[_LocalFile] = []
    pending: list[tuple[Path, PurePosixPath | None]] = [(root, None)]
    while pending:
        folder, rel_folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name in skip_names:
                    continue
                raw_rel = entry.name if rel_folder is None else f"{rel_folder}/{entry.name}"
                rel = validate_relative_path(raw_rel)
                if exclude is not None and exclude(rel):
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat_mod.S_ISLNK(st.st_mode):
                    raise UnsafePath(
                        f"unsafe path {raw_rel!r}: it is a symlink (to {os.readlink(entry.path)!r}); "
                        f"a workspace may hold only regular files and folders. Copy the file it points "
                        f"to into the workspace instead"
                    )
                if stat_mod.S_ISDIR(st.st_mode):
                    pending.append((Path(entry.path), rel))
                elif stat_mod.S_ISREG(st.st_mode):
                    files.append(_LocalFile(rel=rel, path=Path(entry.path), size=st.st_size))
                else:
                    raise UnsafePath(
                        f"unsafe path {raw_rel!r}: it is not a regular file (a FIFO, socket or device); "
                        f"a workspace may hold only regular files and folders. Remove it"
                    )
    files.sort(key=lambda f: f.rel.as_posix())
    return files


async def upload_dir(
    store: ArtifactStore,
    prefix: str,
    root: Path,
    *,
    max_bytes: int,
    max_files: int,
    exclude: Callable[[PurePosixPath], bool] | None = None,
    skip_names: Collection[str] = DEFAULT_SKIP_NAMES,
) -> list[WorkspaceFile]:
    """Upload every regular file under ``root`` as ``<prefix>/<relative path>``.

    The whole tree is checked (no symlinks or special files, valid names, within the limits)
    before the first byte is uploaded, so a rejected workspace leaves nothing behind.
    ``exclude`` gets each relative path (folders too: an excluded folder is not entered);
    ``skip_names`` are file or folder names skipped at any depth.
    """
    prefix_path = validate_relative_path(prefix)
    root = Path(root)
    if not await asyncio.to_thread(root.is_dir):
        raise NotADirectoryError(f"workspace {root} is not a folder")
    files = await asyncio.to_thread(_scan, root, exclude, skip_names)
    total = sum(f.size for f in files)
    if len(files) > max_files:
        raise WorkspaceTooLarge(
            f"workspace {root} has {len(files)} files, over the limit of {max_files} files "
            f"(max_workspace_files); remove generated files or raise the limit"
        )
    if total > max_bytes:
        raise WorkspaceTooLarge(
            f"workspace {root} holds {total} bytes, over the limit of {max_bytes} bytes "
            f"(max_workspace_bytes); keep large data out of the workspace or raise the limit"
        )

    results: dict[PurePosixPath, WorkspaceFile] = {}
    semaphore = asyncio.Semaphore(_UPLOAD_CONCURRENCY)

    async def upload(local: _LocalFile) -> None:
        async with semaphore:
            ref = await store.put_file(str(prefix_path / local.rel), local.path)
        results[local.rel] = WorkspaceFile(path=local.rel.as_posix(), ref=ref)

    # Not a TaskGroup: its ExceptionGroup would hide ArtifactError from callers' except clauses.
    tasks = [asyncio.ensure_future(upload(local)) for local in files]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return [results[f.rel] for f in files]


async def materialise(store: ArtifactStore, files: list[WorkspaceFile], dest: Path) -> None:
    """Download ``files`` under ``dest``, each at its ``path``.

    Every path is validated first; one unsafe path (or two files at the same path) rejects the
    whole list before anything is written.
    """
    dest = Path(dest)
    targets: list[tuple[WorkspaceFile, Path]] = []
    seen: dict[PurePosixPath, str] = {}
    for item in files:
        target = safe_join(dest, item.path)
        rel = validate_relative_path(item.path)
        if rel in seen:
            raise UnsafePath(
                f"unsafe path {item.path!r}: the workspace lists it twice (also as {seen[rel]!r}); "
                f"each file may appear once"
            )
        seen[rel] = item.path
        validate_name(item.ref.name)
        targets.append((item, target))
    # A file and a folder of the same name cannot both exist: find it now, not halfway through.
    for rel in seen:
        for parent in rel.parents:
            if parent in seen:
                raise UnsafePath(
                    f"unsafe path {rel.as_posix()!r}: {parent.as_posix()!r} is also listed as a file; "
                    f"a path cannot be both a file and a folder"
                )
    await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
    for item, target in targets:
        await store.get_to_file(item.ref, target)
