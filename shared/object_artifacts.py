"""Artifacts in a JetStream Object Store bucket (the default store; shared/artifacts.py says what
every store promises).

nats-py's ``ObjectStore`` writes, deletes, lists and reads objects of several chunks. Two reads are
made here with JetStream's own message gets, by the Object Store's documented subjects: an object's
metadata, and an object of one chunk (most of what the stages read). A submitter (the ``agent``
NATS user) writes through :func:`put_new`, which makes no read at all (nats-py's put first looks
up what it replaces with a message get, which the agent's grant does not hold).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Self

from nats.js import JetStreamContext, api
from nats.js.errors import (
    BadObjectMetaError,
    BadRequestError,
    BucketNotFoundError,
    DigestMismatchError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.kv import MSG_ROLLUP_SUBJECT
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DEFAULT_CHUNK_SIZE,
    OBJ_DIGEST_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
    ObjectStore,
)
from nats.nuid import NUID

from shared.artifacts import ArtifactCorrupt, ArtifactError, ArtifactMissing, validate_name, verify, write_verified
from shared.events import ArtifactRef

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


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
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0
        self.last_progress = time.monotonic()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        # Called from an executor thread, one chunk at a time (nats-py awaits each write).
        self.target.write(data)
        self.sha.update(data)
        n = len(data)
        self.size += n
        self.last_progress = time.monotonic()
        return n


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


def _mtime(value: object) -> float:
    """An object's ``mtime`` as nats-py gives it (an RFC 3339 string) as a Unix time; 0 if unreadable."""
    try:
        return datetime.fromisoformat(str(value or "")).timestamp()  # 3.11+ reads nanoseconds and "Z"
    except ValueError:
        return 0.0


def _meta_subject(bucket: str, name: str) -> str:
    return OBJ_META_PRE_TEMPLATE.format(bucket=bucket, obj=base64.urlsafe_b64encode(name.encode()).decode())


async def read_info(js: JetStreamContext, bucket: str, name: str, *, direct: bool = False) -> api.ObjectInfo:
    """The metadata of object ``name``: the last message of its metadata subject, as nats-py's
    ``ObjectStore.get_info`` reads it. ``direct``: by direct get,
    ``$JS.API.DIRECT.GET.OBJ_<bucket>.$O.<bucket>.M.<name>``, the one object read a submitter is
    granted (a message get, ``$JS.API.STREAM.MSG.GET``, names its subject in the request body, so
    its grant reads every chunk of every object in the bucket). A direct get may be answered by a
    replica that lags the leader by a moment: only a submitter, whose names are new, reads so."""
    try:
        msg = await js.get_last_msg(OBJ_STREAM_TEMPLATE.format(bucket=bucket), _meta_subject(bucket, name),
                                    direct=direct)
    except NotFoundError:
        raise ArtifactMissing(f"artifact {name!r} does not exist in the object store") from None
    try:
        info = api.ObjectInfo.from_response(json.loads(msg.data or b""))
    except Exception as exc:
        raise ArtifactCorrupt(f"artifact {name!r} is damaged in the object store: {exc!r}") from exc
    if info.deleted:
        raise ArtifactMissing(f"artifact {name!r} does not exist in the object store (deleted)")
    return info


async def put_new(js: JetStreamContext, bucket: str, name: str, reader: BinaryIO) -> api.ObjectInfo:
    """Store ``reader``'s bytes as object ``name`` as nats-py's ``ObjectStore.put`` does (the same
    chunks, metadata and digest), without its look-up of the object it replaces: a submitter may
    make no message get, and may not purge. Its names are new; a name that held an object keeps that
    object's chunks (docs/dependencies.md, "nats-py: upstream fixes")."""
    nuid = NUID().next().decode()
    chunks_subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=nuid)
    sha = hashlib.sha256()
    buffer = bytearray(OBJ_DEFAULT_CHUNK_SIZE)
    size = chunks = 0
    while n := await asyncio.to_thread(reader.readinto, buffer):  # type: ignore[attr-defined]
        chunk = bytes(buffer[:n])
        sha.update(chunk)
        await js.publish(chunks_subject, chunk)
        size, chunks = size + n, chunks + 1
    info = api.ObjectInfo(
        name=name, bucket=bucket, nuid=nuid, size=size, chunks=chunks, mtime=datetime.now(UTC).isoformat(),
        digest=OBJ_DIGEST_TEMPLATE.format(digest=base64.urlsafe_b64encode(sha.digest()).decode()),
        options=api.ObjectMetaOptions(max_chunk_size=OBJ_DEFAULT_CHUNK_SIZE),
    )
    await js.publish(_meta_subject(bucket, name), json.dumps(info.as_dict()).encode(),
                     headers={api.Header.ROLLUP: MSG_ROLLUP_SUBJECT})
    return info


class ObjectStoreArtifacts:
    """Artifacts in a JetStream Object Store bucket.

    The sha256 of an object is the store's own digest (``SHA-256=`` + urlsafe base64 of the same
    hash), converted to hex: it is computed by the writer over exactly the bytes sent, so there is
    nothing to keep in sync. ``put_*`` cross-checks it against our own hash of what was read.
    """

    def __init__(self, store: ObjectStore, js: JetStreamContext, bucket: str, *, stall_timeout_s: float = 60.0,
                 submitter: bool = False) -> None:
        self._store = store
        self._js = js
        self._bucket = bucket
        # Writes by put_new, metadata by direct get: the agent's grant (see the module's docstring).
        self._submitter = submitter
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
        ``submitter``: writes by :func:`put_new` and metadata by direct get, all the ``agent`` NATS
        user may do here; it reads no object."""
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
        return cls(store, js, bucket, stall_timeout_s=stall_timeout_s, submitter=submitter)

    async def put_file(self, name: str, path: Path) -> ArtifactRef:
        name = validate_name(name)
        fh = await asyncio.to_thread(Path(path).open, "rb")
        try:
            reader = _HashingReader(fh)
            # A RawIOBase has readinto, so it is read in an executor, 128 KiB at a time: the file
            # is streamed, never held in memory.
            info = await self._put(name, reader)
        finally:
            await asyncio.to_thread(fh.close)
        return self._ref_after_put(name, info, reader.size, reader.sha.hexdigest())

    async def put_bytes(self, name: str, data: bytes) -> ArtifactRef:
        name = validate_name(name)
        info = await self._put(name, bytes(data))
        return self._ref_after_put(name, info, len(data), hashlib.sha256(data).hexdigest())

    async def _put(self, name: str, data: BinaryIO | bytes) -> api.ObjectInfo:
        if self._submitter:
            return await put_new(self._js, self._bucket, name, io.BytesIO(data) if isinstance(data, bytes) else data)
        return await self._store.put(name, data)  # type: ignore[arg-type]

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
        info = await read_info(self._js, self._bucket, name, direct=self._submitter)
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
            if isinstance(sink.target, io.BytesIO):
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

        await write_verified(ref, dest, fill)

    async def get_bytes(self, ref: ArtifactRef) -> bytes:
        name = validate_name(ref.name)
        buffer = io.BytesIO()
        # Always writeinto: without it nats-py grows the result with bytes += (quadratic).
        sink = _HashingSink(buffer)
        await self._get_into(name, sink)
        verify(ref, sink.size, sink.sha.hexdigest())
        return buffer.getvalue()

    async def stat(self, name: str) -> ArtifactRef | None:
        name = validate_name(name)
        try:
            info = await read_info(self._js, self._bucket, name, direct=self._submitter)
        except ArtifactMissing:
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
