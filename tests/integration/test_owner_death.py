"""Nothing outlives its owner: `kill -9` of `ftbus up` (or of a worker) leaves nothing it started
running, and `ftbus up` started again on the same home resumes the request that was in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ftbus.client import Client
from ftbus.embedded import PID_FILE, EmbeddedServer, reap_stale_server, start_time
from shared.events import TaskSpec
from shared.settings import Settings
from tests.integration.conftest import Pipeline, wait_for_file, write_workspace
from tests.integration.test_delivery import alive, poll, read_pids

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
FTBUS = [sys.executable, "-m", "ftbus.cli"]
REPO = Path(__file__).resolve().parents[2]


def _env(home: Path, assets_dir: Path, standin_bin: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")},
        # Not about what "better" means: the tests' policy (tests/conftest.py), not the default.
        "FTBUS_JUDGE_POLICY": os.environ.get("FTBUS_JUDGE_POLICY", "llm"),
        "FTBUS_HOME": str(home),
        "FTBUS_ASSETS_DIR": str(assets_dir),
        "FTBUS_TOOLCHAIN_BIN": str(standin_bin),
        "FTBUS_ACK_WAIT_S": "4",
        "FTBUS_HEARTBEAT_S": "1",
        "FTBUS_MAX_DELIVER": "5",
        "FTBUS_SWEEP_INTERVAL_S": "1",
        "FTBUS_LOG_FORMAT": "json",
        "FTBUS_LOG_LEVEL": "WARNING",
        "FTBUS_SANDBOX": "local",  # the stand-in tools run on the host (tests/conftest.py)
        "FTBUS_BENCH_ENGINE": "cold",  # the stand-in `lm_eval` is a command, not the harness
        "FTBUS_DASHBOARD_IN_UP": "false",
    }


def _start_up(env: dict[str, str], home: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    url_file = home / "nats.url"
    url_file.unlink(missing_ok=True)
    up = subprocess.Popen([*FTBUS, "up"], cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not url_file.is_file() and time.monotonic() < deadline:
        assert up.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    return up, url_file.read_text().strip()


def _undertakers_of(owner: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"ftbus.undertaker" in cmd and str(owner).encode() in cmd and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _wait_dead(pids: dict[str, int], timeout_s: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout_s  # hang guard: killed processes go at once; returns when they have
    while time.monotonic() < deadline:
        left = [name for name, pid in pids.items() if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [f"{name} (pid {pid})" for name, pid in pids.items() if alive(pid)]


async def test_kill_9_of_ftbus_up_leaves_nothing_running_and_a_restart_resumes(
    tmp_path: Path, standin_bin: Path, assets_dir: Path
) -> None:
    home = tmp_path / "home"
    env = _env(home, assets_dir, standin_bin)
    log = tmp_path / "up.log"
    up, url = _start_up(env, home, log)
    try:
        settings = Settings(home=home, assets_dir=assets_dir, nats_url=url, log_level="WARNING")
        pid_file = tmp_path / "trainer.pid"
        # The training waits for the gate before its first step: it is certainly still running at the
        # kill, however slow the machine, and it finishes after the restart, once the gate is open.
        gate = tmp_path / "gate"
        client = await Client(settings=settings).connect()
        try:
            ws = write_workspace(tmp_path / "ws", train={"max_steps": 5, "standin_pid_file": str(pid_file),
                                                         "standin_gate_file": str(gate)})
            rid = await client.submit(ws, TASK)
            await wait_for_file(pid_file, 120)
            # The first attempt is on record before the kill: the aggregator writes a stage's start
            # up to 0.25 s late (with its result, when that comes first), and what it has not written
            # dies with it. (The server itself may lose its last moments' consumer state to kill -9:
            # the redelivery can then come as a first delivery, "attempt 1".)
            async def train_started() -> bool:
                view = await client.status(rid)
                return view is not None and "train" in view.stages and view.stages["train"].attempts >= 1

            await poll(train_started, "the train stage's start in the status view", timeout_s=60)
        finally:
            await client.close()
        pids = read_pids(pid_file)
        assert pids is not None
        server_pid = json.loads((home / "nats" / PID_FILE).read_text())["pid"]
        watched = {"nats-server": server_pid, "trainer": pids[0], "trainer's grandchild": pids[1],
                   **{f"undertaker {p}": p for p in _undertakers_of(up.pid)}}
        assert len(watched) == 4, f"expected one undertaker of {up.pid}: {watched}"
        assert all(alive(pid) for pid in watched.values())

        up.send_signal(signal.SIGKILL)
        up.wait(timeout=30)
        left = _wait_dead(watched)
        assert not left, f"still running after kill -9 of ftbus up: {left}"

        # The same home again: the request in flight is taken up and finished.
        pid_file.unlink()
        gate.touch()
        up, url = _start_up(env, home, log)
        client = await Client(settings=settings.model_copy(update={"nats_url": url})).connect()
        try:
            verdict = await client.wait(rid, timeout_s=180)
            view = await client.status(rid)
        finally:
            await client.close()
        assert verdict.status == "completed" and verdict.final_decision is True, verdict.execution
        assert view is not None and view.stages["train"].attempts >= 2
        # Training really ran again after the restart: the stand-in trainer wrote its pid file anew.
        again = read_pids(pid_file)
        assert again is not None and again[0] != pids[0]
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=60)
    assert up.returncode == 0, log.read_text()[-3000:]


def test_a_server_left_by_a_dead_owner_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    """The pid-file fallback: a server whose owner is gone (PR_SET_PDEATHSIG did not fire, e.g.
    started from a thread) holds the store; the next start on that store stops it first."""
    store = tmp_path / "store"
    code = (
        "import sys, threading; from pathlib import Path; from ftbus.embedded import EmbeddedServer\n"
        "s = EmbeddedServer(Path(sys.argv[1]))\n"
        # Started from a thread, PR_SET_PDEATHSIG is not set: the server outlives this process.
        "t = threading.Thread(target=s.start); t.start(); t.join(); print(s.process.pid, flush=True)\n"
        "import os; os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(store)], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    orphan = int(out.stdout.split()[0])
    try:
        assert alive(orphan), "the server did not outlive its owner: nothing to test"
        server = EmbeddedServer(store)
        server.start()  # stops the orphan first: the store is ours
        try:
            assert _wait_dead({"orphan": orphan}) == []
            assert start_time(server.pid or 0) is not None
        finally:
            server.stop()
        assert not (store / PID_FILE).exists()
        assert reap_stale_server(store) is None
    finally:
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_kill_9_of_a_worker_kills_what_it_started(
    tmp_path: Path, settings: Settings, pipeline: Pipeline
) -> None:
    """A `ftbus worker train` killed with SIGKILL mid-training: its training and the training's own
    child are gone at once (the undertaker), not only when a worker next starts on this host."""
    from shared.events import Stage
    from tests.integration.test_delivery import ftbus_env

    await pipeline.start([Stage.data, Stage.bench, Stage.judge, Stage.aggregate])
    assert pipeline.client is not None
    env = {**ftbus_env(settings), "FTBUS_SANDBOX": "local"}
    log = tmp_path / "worker.log"
    worker = _spawn([*FTBUS, "worker", "train"], env, log)
    pid_file = tmp_path / "trainer.pid"
    try:
        ws = write_workspace(tmp_path / "ws", train={"standin_step_s": 0.5, "max_steps": 600,
                                                     "standin_pid_file": str(pid_file)})
        await pipeline.client.submit(ws, TASK)
        await wait_for_file(pid_file, 120)
        pids = read_pids(pid_file)
        assert pids is not None and all(alive(pid) for pid in pids)
        undertakers = _undertakers_of(worker.pid)
        assert len(undertakers) == 1, log.read_text()[-2000:]
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        left = _wait_dead({"trainer": pids[0], "trainer's grandchild": pids[1], "undertaker": undertakers[0]})
        assert not left, f"still running after kill -9 of the worker: {left}"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
