"""A worker killed with SIGKILL takes its candidate process with it (no orphaned training)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from runners.base import LocalRunner

    async def main():
        tmp = Path(sys.argv[1])
        runner = LocalRunner(["PATH"])
        await runner.run(["sh", "-c", f"echo $$ > {tmp}/child.pid; exec sleep 300"],
                         cwd=tmp, timeout_s=600, log_path=tmp / "log")

    asyncio.run(main())
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in {"Z", "X"}  # PID 1 here never reaps zombies: a zombie is dead


def test_child_dies_when_the_worker_is_killed(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], cwd=repo,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 60  # hang guard: a condition wait, not a timing
    while not (pid_file.is_file() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 60  # hang guard: a condition wait, not a timing
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the candidate process outlived its killed worker"


GRANDCHILD_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from runners.base import LocalRunner

    async def main():
        tmp = Path(sys.argv[1])
        runner = LocalRunner(["PATH"])
        # The grandchild leaves the process group and ignores the parent's death: only the
        # owner tag in its environment can find it.
        script = f"setsid sleep 300 & echo $! > {tmp}/grandchild.pid; exec sleep 300"
        await runner.run(["sh", "-c", script], cwd=tmp, timeout_s=600, log_path=tmp / "log")

    asyncio.run(main())
    """
)


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def test_orphaned_grandchildren_are_reaped_by_the_next_worker(tmp_path: Path) -> None:
    from runners.base import reap_orphans

    repo = Path(__file__).resolve().parents[2]
    worker = subprocess.Popen([sys.executable, "-c", GRANDCHILD_WORKER, str(tmp_path)], cwd=repo,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    pid_file = tmp_path / "grandchild.pid"
    deadline = time.monotonic() + 60  # hang guard: a condition wait, not a timing
    while not (pid_file.is_file() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert grandchild not in reap_orphans()  # its worker is alive: left alone
    assert _alive(grandchild)
    parent = psutil.Process(grandchild).ppid()
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    # Its parent (the worker's child) dies with the worker; the grandchild is re-parented, alive.
    deadline = time.monotonic() + 60  # hang guard: a condition wait, not a timing
    while _alive(grandchild) and _parent(grandchild) == parent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _alive(grandchild), "setsid + re-parenting should have let it survive the worker"
    # The next worker's start reaps it (in a parallel test run another test's worker may get there
    # first: then it is gone already).
    assert grandchild in reap_orphans() or not _alive(grandchild)
    deadline = time.monotonic() + 60  # hang guard: a condition wait, not a timing
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
