"""`ftbus pull` / ``Client.pull`` on a real server: the verdict's training outputs, read from the
models store, checked against their sha256, written all at once or not at all.

The verdicts here are published by the test with outputs it stored itself (the pipeline's own run
is in test_pipeline_pass.py, and the real model's in tests/e2e/test_examples.py): what is under
test is the pull.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftbus.client import Client
from ftbus.pull import PullError
from shared.bus import Bus
from shared.events import Verdict, WorkspaceFile
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
FILES = {
    "adapter_model.safetensors": os.urandom(300_000),  # three chunks of the object store
    "adapter_config.json": b'{"peft_type": "LORA", "base_model_name_or_path": "tiny-standin"}',
    "tokenizer_config.json": b"{}",
    "trainer_state.json": json.dumps({"log_history": [{"step": 1, "loss": 2.0}]}).encode(),
}


async def publish_trained(bus: Bus, rid: str, files: dict[str, bytes] = FILES) -> list[WorkspaceFile]:
    """Outputs in the models store, as the trainer leaves them, and a verdict that references them."""
    models = await bus.models_artifacts()
    refs = [WorkspaceFile(path=f"output/{name}", ref=await models.put_bytes(f"{rid}/output/{name}", data))
            for name, data in files.items()]
    verdict = Verdict(request_id=rid, status="completed", execution="ok", return_checking="", code="",
                      final_decision=True, artifacts=refs)
    await bus.publish(bus.subjects.verdict(rid), verdict, f"{rid}:aggregate:verdict")
    return refs


@pytest.fixture
async def client(settings: Settings, bus: Bus) -> AsyncIterator[Client]:
    async with Client(settings=settings) as conn:
        yield conn


async def test_pull_writes_the_verdicts_outputs_checked(settings: Settings, bus: Bus, tmp_path: Path) -> None:
    await publish_trained(bus, "req-1")
    seen: list[tuple[str, int, int]] = []
    async with Client(settings=settings) as c:
        pulled = await c.pull("req-1", tmp_path / "model", on_progress=lambda *a: seen.append(a))
    assert pulled.path == tmp_path / "model" and pulled.model_kind == "lora"
    assert sorted(pulled.files) == sorted(FILES)
    for name, data in FILES.items():
        assert (tmp_path / "model" / name).read_bytes() == data
    assert ("adapter_model.safetensors", 300_000, 300_000) in seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging folder left


async def test_a_digest_mismatch_names_the_file_and_leaves_nothing(
    settings: Settings, bus: Bus, client: Client, tmp_path: Path
) -> None:
    from ftbus.pull import pull

    await publish_trained(bus, "req-2")
    # The stored bytes change after the verdict referenced them (same size, other content).
    models = await bus.models_artifacts()
    await models.put_bytes("req-2/output/trainer_state.json", b"x" * len(FILES["trainer_state.json"]))
    with pytest.raises(PullError) as refused:
        await pull(client, "req-2", tmp_path / "model")
    assert str(refused.value).startswith("trainer_state.json: the bytes read do not match the stored digest")
    assert list(tmp_path.iterdir()) == []


async def test_pull_refuses_what_it_cannot_do_with_a_reason(
    settings: Settings, bus: Bus, client: Client, tmp_path: Path
) -> None:
    from ftbus.pull import pull

    with pytest.raises(PullError, match="no verdict for req-none yet"):
        await pull(client, "req-none", tmp_path / "a")
    await publish_trained(bus, "req-3")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(PullError, match="exists and is not an empty folder"):
        await pull(client, "req-3", tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    failed = Verdict(request_id="req-4", status="completed", execution="", return_checking="", code="",
                     final_decision=False, failed_stage="training")
    await bus.publish(bus.subjects.verdict("req-4"), failed, "req-4:aggregate:verdict")
    with pytest.raises(PullError, match="req-4 has no trained model"):
        await pull(client, "req-4", tmp_path / "b")


async def test_the_cli_pulls_and_says_what_it_wrote(settings: Settings, bus: Bus, tmp_path: Path) -> None:
    await publish_trained(bus, "req-5")
    env = {**os.environ, "FTBUS_NATS_URL": settings.nats_url or "", "FTBUS_HOME": str(tmp_path / "home"),
           "FTBUS_SUBJECT_PREFIX": settings.subject_prefix, "FTBUS_LOG_LEVEL": "WARNING"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ftbus.cli", "pull", *args], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=120)

    done = await asyncio.to_thread(cli, "req-5", "--to", str(tmp_path / "m"), "--json")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["model_kind"] == "lora" and said["bytes"] == sum(len(b) for b in FILES.values())
    assert (tmp_path / "m" / "adapter_model.safetensors").read_bytes() == FILES["adapter_model.safetensors"]
    again = await asyncio.to_thread(cli, "req-5", "--to", str(tmp_path / "m"))
    assert again.returncode == 2 and "exists and is not an empty folder" in " ".join(again.stderr.split())

async def test_an_output_path_that_climbs_out_is_refused_and_nothing_is_written(
    settings: Settings, bus: Bus, client: Client, tmp_path: Path
) -> None:
    # The model folder is written where the user says, from the paths the verdict names (the store
    # refuses such names itself, but a verdict's path is its own string): one that climbs out of the
    # folder, or an absolute one, must write nothing anywhere.
    from ftbus.pull import pull

    models = await bus.models_artifacts()
    # The absolute one names a place of this test's own (never a shared /tmp name another run may hold).
    absolute = tmp_path / "elsewhere" / "escaped-abs.txt"
    for n, name in enumerate(("../escaped.txt", str(absolute), "sub/../../escaped.txt")):
        rid = f"req-climb-{n}"
        refs = [WorkspaceFile(path=f"output/{f}", ref=await models.put_bytes(f"{rid}/output/{f}", data))
                for f, data in FILES.items()]
        planted = WorkspaceFile(path=f"output/{name}", ref=await models.put_bytes(f"{rid}/output/planted", b"x"))
        verdict = Verdict(request_id=rid, status="completed", execution="ok", return_checking="", code="",
                          final_decision=True, artifacts=[*refs, planted])
        await bus.publish(bus.subjects.verdict(rid), verdict, f"{rid}:aggregate:verdict")
        with pytest.raises(PullError, match="unsafe path"):
            await pull(client, rid, tmp_path / "pulls" / "model")
        assert not (tmp_path / "pulls").exists() or list((tmp_path / "pulls").iterdir()) == []
        assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "pulls" / "escaped.txt").exists()
    assert not absolute.exists() and not absolute.parent.exists()
