"""Artifacts as files on a filesystem that every worker mounts (``artifact_store: filesystem``).

The same behaviour as the JetStream Object Store (shared/object_artifacts.py), for models too big to
push through NATS; shared/artifacts.py says what every store promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import secrets
import stat as stat_mod
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from shared.artifacts import (
    COPY_CHUNK,
    ArtifactError,
    ArtifactMissing,
    open_exclusive,
    unlink_quietly,
    validate_name,
    verify,
    write_verified,
)
from shared.events import ArtifactRef
from shared.paths import safe_join


@dataclass(frozen=True)
class _FsMeta:
    size: int
    sha256: str
    ino: int
    mtime_ns: int


def _copy(src: BinaryIO, out: BinaryIO | None) -> tuple[int, str]:
    """Copy ``src`` into ``out`` (None: only read it), chunk by chunk: its size and sha256."""
    sha = hashlib.sha256()
    size = 0
    while chunk := src.read(COPY_CHUNK):
        sha.update(chunk)
        if out is not None:
            out.write(chunk)
        size += len(chunk)
    return size, sha.hexdigest()


class FilesystemArtifacts:
    """Artifacts as files under ``root`` on a filesystem that every worker mounts (NFS, Lustre...).

    Layout: ``objects/<name>`` holds the bytes, ``meta/<name>.json`` the sha256 together with the
    inode, size and mtime of the file it describes, ``tmp/`` the files being written (same
    filesystem, so the final rename is atomic). When the metadata does not describe the current
    file (copied in by hand, or replaced behind our back), ``stat`` hashes the file again: it never
    returns a stale sha256.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._objects = self.root / "objects"
        self._meta = self.root / "meta"
        self._tmp = self.root / "tmp"

    def _object_path(self, name: str) -> Path:
        return safe_join(self._objects, name)

    def _meta_path(self, name: str) -> Path:
        return safe_join(self._meta, name + ".json")

    def _new_tmp(self) -> Path:
        self._tmp.mkdir(parents=True, exist_ok=True)
        return self._tmp / f"{secrets.token_hex(12)}"

    def _commit(self, name: str, tmp: Path, size: int, sha: str) -> ArtifactRef:
        target = self._object_path(name)
        meta_target = self._meta_path(name)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            meta_target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise ArtifactError(
                f"cannot store {name!r}: a parent of it is already stored as a file ({exc.filename}); "
                f"a filesystem store cannot hold both 'a' and 'a/b'"
            ) from exc
        if target.is_dir():
            raise ArtifactError(f"cannot store {name!r}: other artifacts are stored under it as a folder")
        st = tmp.stat()
        meta = _FsMeta(size=size, sha256=sha, ino=st.st_ino, mtime_ns=st.st_mtime_ns)
        meta_tmp = self._new_tmp()
        meta_tmp.write_text(json.dumps(meta.__dict__))
        # Data first, then its description: a reader between the two renames sees new bytes with
        # old metadata, which stat() detects (inode changed) and get_*() rejects (sha mismatch).
        os.replace(tmp, target)
        os.replace(meta_tmp, meta_target)
        return ArtifactRef(name=name, size=size, sha256=sha)

    def _put_sync(self, name: str, src: BinaryIO) -> ArtifactRef:
        tmp = self._new_tmp()
        try:
            with src, open_exclusive(tmp) as out:
                size, sha = _copy(src, out)
            return self._commit(name, tmp, size, sha)
        except BaseException:
            unlink_quietly(tmp)
            raise

    async def put_file(self, name: str, path: Path) -> ArtifactRef:
        name = validate_name(name)
        return await asyncio.to_thread(lambda: self._put_sync(name, Path(path).open("rb")))

    async def put_bytes(self, name: str, data: bytes) -> ArtifactRef:
        return await asyncio.to_thread(self._put_sync, validate_name(name), io.BytesIO(data))

    def _open_object(self, name: str) -> BinaryIO:
        path = self._object_path(name)
        try:
            fh = path.open("rb")
        except (FileNotFoundError, NotADirectoryError):
            raise ArtifactMissing(f"artifact {name!r} does not exist under {self._objects}") from None
        except IsADirectoryError:
            raise ArtifactMissing(f"artifact {name!r} is a folder of other artifacts, not a file") from None
        return fh

    async def get_to_file(self, ref: ArtifactRef, dest: Path) -> None:
        name = validate_name(ref.name)

        async def fill(out: BinaryIO) -> tuple[int, str]:
            src = await asyncio.to_thread(self._open_object, name)
            try:
                sha = hashlib.sha256()
                size = 0
                # One thread hop per 4 MiB chunk: a cancelled task stops within one chunk, which
                # matters for multi-gigabyte models.
                while chunk := await asyncio.to_thread(src.read, COPY_CHUNK):
                    sha.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
                    size += len(chunk)
                return size, sha.hexdigest()
            finally:
                await asyncio.to_thread(src.close)

        await write_verified(ref, dest, fill)

    def _read_sync(self, name: str) -> bytes:
        with self._open_object(name) as src:
            return src.read()

    async def get_bytes(self, ref: ArtifactRef) -> bytes:
        name = validate_name(ref.name)
        data = await asyncio.to_thread(self._read_sync, name)
        verify(ref, len(data), hashlib.sha256(data).hexdigest())
        return data

    def _stat_sync(self, name: str) -> ArtifactRef | None:
        path = self._object_path(name)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        try:
            meta = _FsMeta(**json.loads(self._meta_path(name).read_text()))
        except (OSError, ValueError, TypeError):
            meta = None
        if meta and (meta.ino, meta.size, meta.mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns):
            return ArtifactRef(name=name, size=meta.size, sha256=meta.sha256)
        with path.open("rb") as src:
            size, sha = _copy(src, None)
        return ArtifactRef(name=name, size=size, sha256=sha)

    async def stat(self, name: str) -> ArtifactRef | None:
        return await asyncio.to_thread(self._stat_sync, validate_name(name))

    def _delete_sync(self, name: str) -> None:
        # Metadata first: a crash in between leaves bytes without metadata, which stat() rehashes,
        # never metadata that describes missing bytes.
        unlink_quietly(self._meta_path(name))
        with contextlib.suppress(NotADirectoryError, IsADirectoryError):
            unlink_quietly(self._object_path(name))

    async def delete(self, name: str) -> None:
        """Delete ``name``; deleting what does not exist is not an error (deliveries repeat)."""
        await asyncio.to_thread(self._delete_sync, validate_name(name))

    def _list_sync(self) -> list[tuple[str, float]]:
        if not self._objects.is_dir():
            return []
        found = []
        for path in self._objects.rglob("*"):
            if path.is_file() and not path.is_symlink():
                found.append((path.relative_to(self._objects).as_posix(), path.stat().st_mtime))
        return found

    async def list_objects(self) -> list[tuple[str, float]]:
        """Every object's name and when it was written (a Unix time)."""
        return await asyncio.to_thread(self._list_sync)
