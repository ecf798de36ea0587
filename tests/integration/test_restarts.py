"""`ftbus up` as users run it, and a request that survives a nats-server restart."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from ftbus.embedded import EmbeddedServer, free_port
from shared.events import TaskSpec
from shared.settings import Settings
from tests.integration.conftest import Pipeline, wait_for_file, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
FTBUS = [sys.executable, "-m", "ftbus.cli"]
REPO = Path(__file__).resolve().parents[2]


def test_ftbus_up_records_its_url_and_submit_finds_it(tmp_path: Path, standin_bin: Path, assets_dir: Path) -> None:
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")},
        # Not about what "better" means: the tests' policy (tests/conftest.py), not the default.
        "FTBUS_JUDGE_POLICY": os.environ.get("FTBUS_JUDGE_POLICY", "llm"),
        "FTBUS_HOME": str(home),
        "FTBUS_ASSETS_DIR": str(assets_dir),
        "FTBUS_TOOLCHAIN_BIN": str(standin_bin),
        "FTBUS_SANDBOX": "local",  # the stand-in tools live on the host (tests/conftest.py)
        "FTBUS_BENCH_ENGINE": "cold",  # the stand-in `lm_eval` is a command, not the harness
        "FTBUS_LOG_FORMAT": "json",
    }
    up = subprocess.Popen([*FTBUS, "up"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        url_file = home / "nats.url"
        while not url_file.is_file() and time.monotonic() < deadline:
            assert up.poll() is None, up.stdout.read().decode() if up.stdout else ""
            time.sleep(0.1)
        url = url_file.read_text().strip()
        assert url.startswith("nats://127.0.0.1:")
        # No URL given: submit finds the server through the home.
        ws = write_workspace(tmp_path / "ws")
        submit = subprocess.run(
            [*FTBUS, "submit", str(ws), "--base-model", "tiny-standin", "--benchmark", "tiny-arith",
             "--wait", "--json"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False,
        )
        assert submit.returncode == 0, submit.stderr[-3000:]
        verdict = json.loads(submit.stdout)
        assert verdict["final_decision"] is True
    finally:
        up.send_signal(signal.SIGINT)
        output = up.communicate(timeout=60)[0].decode()
    assert up.returncode == 0, output[-3000:]
    assert url in output  # it printed where it listens
    assert "SANDBOX DISABLED (sandbox=local)" in output  # and, loudly, that candidate code is not isolated
    assert not (home / "nats.url").exists()  # and forgot it on the way out


async def test_a_request_survives_a_server_restart(tmp_path: Path, standin_bin: Path, assets_dir: Path) -> None:
    port = free_port()
    store = tmp_path / "store"
    server = EmbeddedServer(store, port=port)
    server.start()
    settings = Settings(
        home=tmp_path / "home", assets_dir=assets_dir, nats_url=server.url, subject_prefix="r" + secrets.token_hex(4),
        toolchain_bin=standin_bin, ack_wait_s=4.0, heartbeat_s=1.0, max_deliver=5, retry_backoff_s=[0.5, 1.0],
        sweep_interval_s=1.0, log_format="json", log_level="WARNING",
    )
    pipeline = Pipeline(settings)
    try:
        await pipeline.start()
        pid_file = tmp_path / "trainer.pid"
        ws = write_workspace(tmp_path / "ws", train={"standin_step_s": 0.5, "max_steps": 8,
                                                     "standin_pid_file": str(pid_file)})
        rid = await pipeline.client.submit(ws, TASK)
        await wait_for_file(pid_file)  # training has started
        server.stop()  # mid-training: the server goes away ...
        await asyncio.sleep(2)
        server.start()  # ... and comes back on the same port with the same store
        verdict = await pipeline.client.wait(rid, timeout_s=180)
        assert verdict.status == "completed", verdict.execution
        assert verdict.final_decision is True
        info = await pipeline.bus.js.stream_info(settings.subject_prefix.upper() + "_VERDICTS")
        assert info.state.messages == 1
    finally:
        await pipeline.stop()
        server.stop()


async def test_a_stopping_worker_hands_its_message_over(
    tmp_path: Path, settings: Settings, pipeline: Pipeline
) -> None:
    """Stopping a worker mid-training naks the message at once: another worker finishes it."""
    from ftbus.stages import PIPELINE
    from services.trainer import service as trainer
    from shared.events import Stage

    await pipeline.start([Stage.data, Stage.bench, Stage.judge, Stage.aggregate])
    assert pipeline.bus is not None and pipeline.client is not None
    stop_first = asyncio.Event()
    first = asyncio.create_task(trainer.SPEC.run(pipeline.bus, stop_first, None, PIPELINE))
    pid_file = tmp_path / "trainer.pid"
    # The first training waits for the gate: it cannot end by itself before the stop, however slow
    # the machine; the second finishes once the gate is open.
    gate = tmp_path / "gate"
    ws = write_workspace(tmp_path / "ws", train={"standin_pid_file": str(pid_file), "standin_gate_file": str(gate)})
    rid = await pipeline.client.submit(ws, TASK)
    await wait_for_file(pid_file)
    trainer_pid = int(pid_file.read_text().split()[0])
    stop_first.set()
    await asyncio.wait_for(first, timeout=60)  # hang guard: a stop naks and ends at once
    assert not Path(f"/proc/{trainer_pid}/cmdline").exists() or _zombie(trainer_pid), "training was not stopped"

    gate.touch()
    await pipeline.start([Stage.train])
    verdict = await pipeline.client.wait(rid, timeout_s=180)
    assert verdict.final_decision is True
    view = await pipeline.client.status(rid)
    assert view is not None and view.stages["train"].attempts == 2


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except OSError:
        return True


async def test_the_topology_creates_every_stream_a_readiness_check_waits_for(settings: Settings) -> None:
    from shared.bus import Bus
    from shared.subjects import topology_stream_names

    bus = await Bus.connect(settings)
    try:
        await bus.ensure_topology()
        await bus.ensure_topology()  # idempotent: a second process starting does no harm
        for name in topology_stream_names(bus.subjects):
            info = await bus.js.stream_info(name)
            assert info.config.name == name
    finally:
        await bus.close()
