"""The artifact store: workspaces, data, training outputs and logs, keyed ``<request_id>/<path>``.

Events carry :class:`~shared.events.ArtifactRef` (name, size, sha256), never the bytes. Two stores
behave the same: :class:`ObjectStoreArtifacts` on the JetStream Object Store (the default: nothing
else to run) and :class:`FilesystemArtifacts` on a shared filesystem (for models too big to push
through NATS). Every read is verified against the reference's sha256 and size, so a reader never
acts on a file that was overwritten, truncated or corrupted after the reference was made.

Writes of a local file are atomic: bytes go to a temporary file beside the destination, are
verified, then renamed into place. A reader therefore sees the old file or the new one, never half.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import secrets
import stat as stat_mod
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol, Self, runtime_checkable

from nats.js import JetStreamContext, api
from nats.js.errors import (
    BadObjectMetaError,
    BadRequestError,
    BucketNotFoundError,
    DigestMismatchError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
    ObjectStore,
)

from shared.events import ArtifactRef, WorkspaceFile
from shared.paths import UnsafePath, safe_join, validate_relative_path

# Names skipped by upload_dir unless the caller says otherwise: caches and VCS data are never part
# of a candidate, and a `.git` folder alone can exceed the workspace limits.
DEFAULT_SKIP_NAMES: frozenset[str] = frozenset({"__pycache__", ".git"})

_COPY_CHUNK = 4 * 2**20
_UPLOAD_CONCURRENCY = 4
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


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


def artifact_name(request_id: str, path: str) -> str:
    """The store key of a request's file: ``<request_id>/<path>``, validated."""
    return validate_name(f"{request_id}/{path}")


def validate_name(name: str) -> str:
    """Artifact names obey the same rules as workspace paths, so a name is always a safe path."""
    return str(validate_relative_path(name))


# ---------------------------------------------------------------------------- hashing helpers


class _HashingReader(io.RawIOBase):
    """Wraps a binary file: hashes and counts what the object store reads through ``readinto``."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            view = memoryview(buffer)[:n]
            self.sha.update(view)
            self.size += n
        return n or 0


class _HashingSink(io.BufferedIOBase):
    """The ``writeinto`` target of ObjectStore.get: hashes, counts and records progress.

    It deliberately has no ``buffer`` attribute: nats-py writes to ``writeinto.buffer`` when it
    exists (meant for text wrappers).
    """

    def __init__(self, target: BinaryIO) -> None:
        super().__init__()
        self._target = target
        self.sha = hashlib.sha256()
        self.size = 0
        self.last_progress = time.monotonic()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        # Called from an executor thread, one chunk at a time (nats-py awaits each write).
        self._target.write(data)
        self.sha.update(data)
        n = len(data)
        self.size += n
        self.last_progress = time.monotonic()
        return n


def _verify(ref: ArtifactRef, size: int, sha256: str) -> None:
    if size != ref.size or sha256 != ref.sha256:
        raise ArtifactCorrupt(
            f"artifact {ref.name!r} does not match its reference: expected {ref.size} bytes with sha256 "
            f"{ref.sha256}, got {size} bytes with sha256 {sha256}. It was overwritten or damaged after "
            f"the reference was made; re-run the stage that produced it"
        )


def _digest_to_hex(digest: str | None) -> str | None:
    """The object store's ``SHA-256=<urlsafe base64>`` digest as lowercase hex."""
    if not digest:
        return None
    prefix, _, encoded = digest.partition("=")
    if prefix.upper() != "SHA-256" or not encoded:
        return None
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def _open_exclusive(path: Path) -> BinaryIO:
    # O_EXCL: a temporary name never silently shares a file with another writer. Mode 0o666
    # minus the umask, like any normal file (mkstemp's 0o600 would hide it from other users,
    # e.g. a container running candidate code under another uid).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, "wb")


def _temp_beside(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.ftbus-tmp-{secrets.token_hex(6)}")


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def _write_verified(
    ref: ArtifactRef, dest: Path, fill: Callable[[BinaryIO], Awaitable[tuple[int, str]]]
) -> None:
    """Run ``fill`` into a temporary file beside ``dest``, verify it, then rename it into place."""
    dest = Path(dest)
    await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
    tmp = _temp_beside(dest)
    fh = await asyncio.to_thread(_open_exclusive, tmp)
    try:
        try:
            size, sha = await fill(fh)
        finally:
            await asyncio.to_thread(fh.close)
        _verify(ref, size, sha)
        await asyncio.to_thread(os.replace, tmp, dest)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _mtime(value: object) -> float:
    """An object's ``mtime`` as nats-py gives it (an RFC 3339 string) as a Unix time; 0 if unreadable."""
    from datetime import datetime

    text = str(value or "")
    try:
        # nanoseconds: Python reads at most microseconds
        head, dot, rest = text.partition(".")
        if dot:
            digits = "".join(ch for ch in rest if ch.isdigit())
            text = f"{head}.{digits[:6]}{rest[len(digits):]}"
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# ---------------------------------------------------------------------------- object store


class _MetadataByDirectGet(ObjectStore):
    """An Object Store whose metadata reads (get_info, and put's look for an object it replaces)
    are direct gets of the metadata subject, ``$JS.API.DIRECT.GET.OBJ_<bucket>.$O.<bucket>.M.<name>``.

    For submitters (the ``agent`` NATS user), who write workspaces but may read no object: their
    grant names the metadata subjects alone. A message get (``$JS.API.STREAM.MSG.GET``, what
    nats-py uses) carries its subject in the request body, so its grant reads every chunk of every
    object in the bucket. A direct get may be answered by a replica that lags the leader by a
    moment: put's look for an object it replaces is the only read, and a submitter's names are new.
    """

    async def get_info(self, name: str, show_deleted: bool | None = False) -> api.ObjectInfo:
        encoded = base64.urlsafe_b64encode(name.encode()).decode()
        subject = OBJ_META_PRE_TEMPLATE.format(bucket=self._name, obj=encoded)
        try:
            msg = await self._js.get_last_msg(self._stream, subject, direct=True)
        except NotFoundError:
            raise ObjectNotFoundError from None
        try:
            info = api.ObjectInfo.from_response(json.loads(msg.data or b""))
        except Exception as exc:
            raise BadObjectMetaError from exc
        if info.deleted and not show_deleted:
            raise ObjectNotFoundError
        return info


class ObjectStoreArtifacts:
    """Artifacts in a JetStream Object Store bucket.

    The sha256 of an object is the store's own digest (``SHA-256=`` + urlsafe base64 of the same
    hash), converted to hex: it is computed by the writer over exactly the bytes sent, so there is
    nothing to keep in sync. ``put_*`` cross-checks it against our own hash of what was read.
    """

    def __init__(self, store: ObjectStore, *, js: JetStreamContext | None = None, bucket: str | None = None,
                 stall_timeout_s: float = 60.0) -> None:
        self._store = store
        # With both, an object of one chunk is read with two message gets (_get_small).
        self._js = js
        self._bucket = bucket
        # nats-py's get() waits forever for chunks that were purged under it (a concurrent put of
        # the same name, a delete): a read that makes no progress for this long is abandoned.
        self._stall_timeout_s = stall_timeout_s

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        bucket: str,
        replicas: int = 1,
        *,
        stall_timeout_s: float = 60.0,
        description: str = "ftbus artifacts",
        ttl: float | None = None,
        submitter: bool = False,
    ) -> Self:
        """Open the bucket, creating it when missing. Safe when several processes race to create it.
        ``submitter``: metadata by direct get (:class:`_MetadataByDirectGet`), the one object read the
        ``agent`` NATS user is granted; it writes, and reads no object."""
        try:
            store = await js.object_store(bucket)
        except BucketNotFoundError:
            try:
                # The server answers a create of an existing stream with an identical config with
                # success, so two processes creating it at once both succeed.
                store = await js.create_object_store(
                    bucket,
                    config=api.ObjectStoreConfig(
                        description=description,
                        storage=api.StorageType.FILE,
                        replicas=replicas,
                        ttl=ttl,  # objects expire this long after they were written (None: never)
                    ),
                )
            except BadRequestError:
                # Created meanwhile with another config (another version, an operator's settings):
                # use it as it is rather than fight over the configuration.
                store = await js.object_store(bucket)
        if submitter:
            store = _MetadataByDirectGet(name=bucket, stream=OBJ_STREAM_TEMPLATE.format(bucket=bucket), js=js)
        return cls(store, js=js, bucket=bucket, stall_timeout_s=stall_timeout_s)

    async def put_file(self, name: str, path: Path) -> ArtifactRef:
        name = validate_name(name)
        fh = await asyncio.to_thread(Path(path).open, "rb")
        try:
            reader = _HashingReader(fh)
            # A RawIOBase has readinto, so nats-py reads it in an executor, 128 KiB at a time:
            # the file is streamed, never held in memory.
            info = await self._store.put(name, reader)  # type: ignore[arg-type]
        finally:
            await asyncio.to_thread(fh.close)
        return self._ref_after_put(name, info, reader.size, reader.sha.hexdigest())

    async def put_bytes(self, name: str, data: bytes) -> ArtifactRef:
        name = validate_name(name)
        info = await self._store.put(name, bytes(data))
        return self._ref_after_put(name, info, len(data), hashlib.sha256(data).hexdigest())

    @staticmethod
    def _ref_after_put(name: str, info: api.ObjectInfo, size: int, sha: str) -> ArtifactRef:
        stored = _digest_to_hex(info.digest)
        if stored != sha or info.size != size:
            raise ArtifactError(
                f"object store wrote {name!r} as {info.size} bytes / sha256 {stored}, but we sent "
                f"{size} bytes / sha256 {sha}; the file changed while it was uploaded"
            )
        return ArtifactRef(name=name, size=size, sha256=sha)

    async def _get_small(self, name: str) -> bytes | None:
        """The bytes of an object of one chunk (most of what the stages read: a config, a log, a
        script), with two message gets: its info, then its chunk. None for any other object.

        nats-py's get() reads every object through an ordered consumer: one consumer created per
        read, which the server keeps for minutes after it (the judge reading one small config per
        request left hundreds on the stream), and about three times the CPU of these two reads on
        either side (bench/artifact_reads.py)."""
        if self._js is None or self._bucket is None:
            return None
        try:
            info = await self._store.get_info(name)
        except ObjectNotFoundError:
            raise ArtifactMissing(f"artifact {name!r} does not exist in the object store") from None
        except BadObjectMetaError as exc:
            raise ArtifactCorrupt(f"artifact {name!r} is damaged in the object store: {exc!r}") from exc
        if info.is_link() or not info.nuid:
            return None  # get() follows links
        if not info.size:
            return b""
        if info.chunks != 1:
            return None
        try:
            msg = await self._js.get_last_msg(OBJ_STREAM_TEMPLATE.format(bucket=self._bucket),
                                              OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self._bucket, obj=info.nuid))
        except NotFoundError:
            raise ArtifactError(
                f"reading {name!r}: its chunk was replaced or deleted while it was read; retry"
            ) from None
        return msg.data or b""

    async def _get_into(self, name: str, sink: _HashingSink) -> None:
        small = await self._get_small(name)
        if small is not None:
            # One chunk, at most the store's chunk size (128 KiB): into memory at once, into a file
            # off the event loop, as get() writes its chunks.
            if isinstance(sink._target, io.BytesIO):
                sink.write(small)
            else:
                await asyncio.to_thread(sink.write, small)
            return
        task = asyncio.ensure_future(self._store.get(name, writeinto=sink))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=min(1.0, self._stall_timeout_s))
                if task in done:
                    result = task.result()
                    # nats-py follows an object link with a plain get() that ignores writeinto.
                    if sink.size == 0 and result.data:
                        await asyncio.to_thread(sink.write, result.data)
                    return
                if time.monotonic() - sink.last_progress > self._stall_timeout_s:
                    raise ArtifactError(
                        f"reading {name!r} made no progress for {self._stall_timeout_s:g} s: its chunks "
                        f"were probably replaced or deleted while it was read; retry"
                    )
        except ObjectNotFoundError:
            raise ArtifactMissing(f"artifact {name!r} does not exist in the object store") from None
        except (DigestMismatchError, BadObjectMetaError) as exc:
            raise ArtifactCorrupt(f"artifact {name!r} is damaged in the object store: {exc!r}") from exc
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def get_to_file(self, ref: ArtifactRef, dest: Path) -> None:
        name = validate_name(ref.name)

        async def fill(fh: BinaryIO) -> tuple[int, str]:
            sink = _HashingSink(fh)
            await self._get_into(name, sink)
            return sink.size, sink.sha.hexdigest()

        await _write_verified(ref, dest, fill)

    async def get_bytes(self, ref: ArtifactRef) -> bytes:
        name = validate_name(ref.name)
        buffer = io.BytesIO()
        # Always writeinto: without it nats-py grows the result with bytes += (quadratic).
        sink = _HashingSink(buffer)
        await self._get_into(name, sink)
        _verify(ref, sink.size, sink.sha.hexdigest())
        return buffer.getvalue()

    async def stat(self, name: str) -> ArtifactRef | None:
        name = validate_name(name)
        try:
            info = await self._store.get_info(name)
        except ObjectNotFoundError:
            return None
        size = info.size or 0
        sha = _digest_to_hex(info.digest)
        if sha is None and size == 0:
            sha = _EMPTY_SHA256
        if sha is None:
            raise ArtifactCorrupt(
                f"artifact {name!r} has no usable digest in the object store: {info.digest!r}"
            )
        return ArtifactRef(name=name, size=size, sha256=sha)

    async def delete(self, name: str) -> None:
        """Delete ``name``; deleting what does not exist is not an error (deliveries repeat)."""
        name = validate_name(name)
        with contextlib.suppress(ObjectNotFoundError):
            await self._store.delete(name)

    async def list_objects(self) -> list[tuple[str, float]]:
        """Every object's name and when it was written (a Unix time): the store's metadata only."""
        try:
            infos = await self._store.list()
        except NotFoundError:  # nats-py's "no objects found"
            return []
        return [(info.name, _mtime(info.mtime)) for info in infos if not info.deleted and info.name]


# ---------------------------------------------------------------------------- shared filesystem


@dataclass(frozen=True)
class _FsMeta:
    size: int
    sha256: str
    ino: int
    mtime_ns: int


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

    def _put_file_sync(self, name: str, path: Path) -> ArtifactRef:
        tmp = self._new_tmp()
        try:
            sha = hashlib.sha256()
            size = 0
            with Path(path).open("rb") as src, _open_exclusive(tmp) as out:
                while chunk := src.read(_COPY_CHUNK):
                    sha.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            return self._commit(name, tmp, size, sha.hexdigest())
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def _put_bytes_sync(self, name: str, data: bytes) -> ArtifactRef:
        tmp = self._new_tmp()
        try:
            with _open_exclusive(tmp) as out:
                out.write(data)
            return self._commit(name, tmp, len(data), hashlib.sha256(data).hexdigest())
        except BaseException:
            _unlink_quietly(tmp)
            raise

    async def put_file(self, name: str, path: Path) -> ArtifactRef:
        return await asyncio.to_thread(self._put_file_sync, validate_name(name), path)

    async def put_bytes(self, name: str, data: bytes) -> ArtifactRef:
        return await asyncio.to_thread(self._put_bytes_sync, validate_name(name), bytes(data))

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
                while chunk := await asyncio.to_thread(src.read, _COPY_CHUNK):
                    sha.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
                    size += len(chunk)
                return size, sha.hexdigest()
            finally:
                await asyncio.to_thread(src.close)

        await _write_verified(ref, dest, fill)

    def _read_sync(self, name: str) -> bytes:
        with self._open_object(name) as src:
            return src.read()

    async def get_bytes(self, ref: ArtifactRef) -> bytes:
        name = validate_name(ref.name)
        data = await asyncio.to_thread(self._read_sync, name)
        _verify(ref, len(data), hashlib.sha256(data).hexdigest())
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
        sha = hashlib.sha256()
        size = 0
        with path.open("rb") as src:
            while chunk := src.read(_COPY_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        return ArtifactRef(name=name, size=size, sha256=sha.hexdigest())

    async def stat(self, name: str) -> ArtifactRef | None:
        return await asyncio.to_thread(self._stat_sync, validate_name(name))

    def _delete_sync(self, name: str) -> None:
        # Metadata first: a crash in between leaves bytes without metadata, which stat() rehashes,
        # never metadata that describes missing bytes.
        _unlink_quietly(self._meta_path(name))
        with contextlib.suppress(NotADirectoryError, IsADirectoryError):
            _unlink_quietly(self._object_path(name))

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
