"""LocalRunner: real subprocesses, real signals. No wall clock decides a test: a stage timeout fires
when the test moves the runner's clock (:class:`StageClock`), and the only bounds on real time are
generous hang guards."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runners.base import LocalRunner, Runner, RunResult

PY = sys.executable
LONG = "300"  # seconds: far beyond any test; the runner must kill these
HANG_S = 60.0  # hang guard only: a kill or an exit this test waits for takes well under a second


def _alive(pid: int) -> bool:
    """True while ``pid`` is a live process. A zombie counts as dead: where PID 1 does not reap
    orphans (this sandbox's init does not), a killed grandchild stays a zombie forever."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2] not in "ZX"


async def _wait_gone(pid: int, within_s: float = HANG_S) -> bool:  # within_s: a hang guard
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        await asyncio.sleep(0.05)
    return not _alive(pid)


def _kill_if_alive(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def runner() -> LocalRunner:
    return LocalRunner(["PATH"], kill_grace_s=2.0)


class StageClock:
    """runners.base's ``time``, as the test says: it stands still, so no stage timeout can fire
    however slow the machine, until :meth:`expire` moves it ``seconds`` on; from there it runs with
    the real clock (the kill grace that follows is real time)."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._jump: float | None = None
        self._expired_at = 0.0

    def monotonic(self) -> float:
        if self._jump is None:
            return self._start
        return self._start + self._jump + (time.monotonic() - self._expired_at)

    def expire(self, seconds: float) -> None:
        self._jump, self._expired_at = seconds, time.monotonic()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> StageClock:
    import runners.base

    stage_clock = StageClock()
    monkeypatch.setattr(runners.base, "time", stage_clock)
    return stage_clock


class Lines:
    """Collects on_line output and lets a test wait for a marker line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        self._changed.set()

    async def wait_for(self, prefix: str, within_s: float = 30.0) -> str:
        deadline = time.monotonic() + within_s
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line starting with {prefix!r} in {self.lines!r}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    def pids(self, prefix: str) -> list[int]:
        return [int(line.split("=", 1)[1]) for line in self.lines if line.startswith(prefix)]


def test_local_runner_satisfies_the_protocol(runner: LocalRunner) -> None:
    assert isinstance(runner, Runner)


@pytest.mark.parametrize("code", [0, 1, 3, 42])
async def test_exit_codes_propagate(runner: LocalRunner, tmp_path: Path, code: int) -> None:
    result = await runner.run(
        ["sh", "-c", f"echo out; exit {code}"], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log"
    )
    assert isinstance(result, RunResult)
    assert result.exit_code == code
    assert not result.timed_out and not result.cancelled
    assert result.output_tail == "out\n"
    assert result.timeout_s == 60
    assert result.log_path == tmp_path / "log"
    assert 0 <= result.duration_s < 60


async def test_death_by_signal_is_reported_as_128_plus_signal(runner: LocalRunner, tmp_path: Path) -> None:
    result = await runner.run(["sh", "-c", "kill -9 $$"], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log")
    assert result.exit_code == 128 + signal.SIGKILL
    assert not result.timed_out


async def test_output_is_streamed_to_on_line_in_order(runner: LocalRunner, tmp_path: Path) -> None:
    seen: list[str] = []
    script = "import sys\nfor i in range(500):\n    print(f'line-{i}')\n    sys.stdout.flush()\n"
    result = await runner.run(
        [PY, "-c", script], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log", on_line=seen.append
    )
    assert result.exit_code == 0
    assert seen == [f"line-{i}" for i in range(500)]


async def test_async_on_line_and_stderr_merged(runner: LocalRunner, tmp_path: Path) -> None:
    seen: list[str] = []

    async def on_line(line: str) -> None:
        await asyncio.sleep(0)
        seen.append(line)

    script = "import sys\nprint('to-stdout', flush=True)\nprint('to-stderr', file=sys.stderr, flush=True)\n"
    result = await runner.run([PY, "-c", script], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log",
                              on_line=on_line)
    assert result.exit_code == 0
    assert seen == ["to-stdout", "to-stderr"]


async def test_output_arrives_while_the_command_runs(runner: LocalRunner, tmp_path: Path) -> None:
    lines = Lines()
    # No flush in the script: the runner's PYTHONUNBUFFERED=1 makes Python stream.
    script = "import time\nprint('first')\ntime.sleep(300)\n"
    task = asyncio.ensure_future(
        runner.run([PY, "-c", script], cwd=tmp_path, timeout_s=120, log_path=tmp_path / "log", on_line=lines)
    )
    try:
        assert await lines.wait_for("first") == "first"
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_tail_is_kept_and_log_is_complete(runner: LocalRunner, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "run.log"  # parent folders are created
    script = "for i in range(20000):\n    print(f'line-{i:05d}')\n"
    result = await runner.run([PY, "-c", script], cwd=tmp_path, timeout_s=60, log_path=log, tail_chars=1000)
    assert result.exit_code == 0
    assert len(result.output_tail) == 1000
    assert result.output_tail.endswith("line-19999\n")
    assert "line-19950\n" in result.output_tail
    assert "line-00000" not in result.output_tail
    content = log.read_text().splitlines()
    assert content == [f"line-{i:05d}" for i in range(20000)]


async def test_non_utf8_bytes_and_very_long_lines(tmp_path: Path) -> None:
    runner = LocalRunner(["PATH"], max_line_chars=1000)
    seen: list[str] = []
    script = textwrap.dedent(
        """
        import sys
        out = sys.stdout.buffer
        out.write(b"bad \\xff\\xfe bytes\\n")
        out.write("caf\\u00e9 ok\\n".encode())
        out.write(b"x" * 5000 + b"\\n")
        out.write(b"no newline at end")
        out.flush()
        """
    )
    result = await runner.run([PY, "-c", script], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log",
                              on_line=seen.append)
    assert result.exit_code == 0
    assert seen[0] == "bad \ufffd\ufffd bytes"
    assert seen[1] == "café ok"
    assert seen[2:7] == ["x" * 1000] * 5  # a 5000-char line comes in 1000-char pieces
    assert seen[7:] == ["no newline at end"]
    raw = (tmp_path / "log").read_bytes()
    assert raw.startswith(b"bad \xff\xfe bytes\n")  # the log keeps the exact bytes
    assert raw.endswith(b"no newline at end")


async def test_timeout_kills_the_whole_tree_including_a_grandchild(
    runner: LocalRunner, clock: StageClock, tmp_path: Path
) -> None:
    lines = Lines()
    # main sh -> child sh -> background sleep (the grandchild), all holding stdout.
    script = f"sh -c 'sleep {LONG} & echo grandchild=$!; wait' & echo child=$!; wait"
    task = asyncio.ensure_future(
        runner.run(["sh", "-c", script], cwd=tmp_path, timeout_s=2, log_path=tmp_path / "log", on_line=lines)
    )
    await lines.wait_for("grandchild=")
    await lines.wait_for("child=")
    assert not task.done()  # the clock stands still: no timeout yet, however long the start took
    clock.expire(2.5)
    result = await asyncio.wait_for(task, HANG_S)  # hang guard
    (grandchild,) = lines.pids("grandchild=")
    (child,) = lines.pids("child=")
    try:
        assert result.exit_code == 124
        assert result.timed_out and not result.cancelled
        assert await _wait_gone(grandchild), "grandchild survived the timeout"
        assert await _wait_gone(child), "child survived the timeout"
        message = "[ftbus] killed after 2 seconds: the stage timeout"
        assert result.output_tail.rstrip("\n").endswith(message)
        assert (tmp_path / "log").read_text().rstrip("\n").endswith(message)
    finally:
        _kill_if_alive(grandchild)
        _kill_if_alive(child)


async def test_timeout_escalates_to_sigkill_for_processes_ignoring_sigterm(clock: StageClock, tmp_path: Path) -> None:
    runner = LocalRunner(["PATH"], kill_grace_s=1.0)  # the grace runs on: SIGTERM is ignored forever
    lines = Lines()
    stubborn = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"sub = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({LONG})'])\n"
        "print(f'grandchild={sub.pid}', flush=True)\n"
        f"time.sleep({LONG})\n"
    )
    task = asyncio.ensure_future(runner.run([PY, "-c", stubborn], cwd=tmp_path, timeout_s=1.5,
                                            log_path=tmp_path / "log", on_line=lines))
    await lines.wait_for("grandchild=")  # SIGTERM is ignored from here on, in both processes
    assert not task.done()
    clock.expire(2.0)
    result = await asyncio.wait_for(task, HANG_S)  # hang guard
    (grandchild,) = lines.pids("grandchild=")
    try:
        assert result.exit_code == 124 and result.timed_out
        assert await _wait_gone(grandchild)
    finally:
        _kill_if_alive(grandchild)


async def test_a_child_in_its_own_process_group_is_killed_too(
    runner: LocalRunner, clock: StageClock, tmp_path: Path
) -> None:
    lines = Lines()
    # setpgid leaves our process group but not the session: it is still found and killed.
    regrouped = (
        f"import os, time; os.setpgid(0, 0); print(f'regrouped={{os.getpid()}}', flush=True); time.sleep({LONG})"
    )
    script = f"{PY} -c \"{regrouped}\" & sleep {LONG}"
    task = asyncio.ensure_future(runner.run(["sh", "-c", script], cwd=tmp_path, timeout_s=2,
                                            log_path=tmp_path / "log", on_line=lines))
    await lines.wait_for("regrouped=")  # it has left the group: the timeout comes after
    assert not task.done()
    clock.expire(2.5)
    result = await asyncio.wait_for(task, HANG_S)  # hang guard
    (pid,) = lines.pids("regrouped=")
    try:
        assert result.timed_out
        assert await _wait_gone(pid)
    finally:
        _kill_if_alive(pid)


async def test_cancelling_the_task_kills_the_tree_and_reraises(runner: LocalRunner, tmp_path: Path) -> None:
    lines = Lines()
    script = f"sh -c 'sleep {LONG} & echo grandchild=$!; wait' & echo child=$!; sleep {LONG}"
    task = asyncio.ensure_future(
        runner.run(["sh", "-c", script], cwd=tmp_path, timeout_s=600, log_path=tmp_path / "log", on_line=lines)
    )
    await lines.wait_for("grandchild=")
    await lines.wait_for("child=")
    (grandchild,) = lines.pids("grandchild=")
    (child,) = lines.pids("child=")
    try:
        assert _alive(grandchild) and _alive(child)
        task.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < HANG_S  # hang guard: the cancel kills at once
        assert await _wait_gone(grandchild), "grandchild survived cancellation"
        assert await _wait_gone(child), "child survived cancellation"
    finally:
        _kill_if_alive(grandchild)
        _kill_if_alive(child)


async def test_cancel_event_stops_the_run_and_reports_it(runner: LocalRunner, tmp_path: Path) -> None:
    lines = Lines()
    cancel = asyncio.Event()
    task = asyncio.ensure_future(
        runner.run(["sh", "-c", f"echo started; sleep {LONG}"], cwd=tmp_path, timeout_s=600,
                   log_path=tmp_path / "log", on_line=lines, cancel=cancel)
    )
    await lines.wait_for("started")
    cancel.set()
    result = await asyncio.wait_for(task, HANG_S)  # hang guard
    assert result.cancelled and not result.timed_out
    assert result.exit_code == 130
    assert "cancelled" in result.output_tail


async def test_leftover_processes_are_killed_after_the_command_exits(runner: LocalRunner, tmp_path: Path) -> None:
    lines = Lines()
    started = time.monotonic()
    # The background sleep holds stdout open: without straggler cleanup the run would hang.
    result = await runner.run(["sh", "-c", f"sleep {LONG} & echo straggler=$!; echo done"], cwd=tmp_path,
                              timeout_s=120, log_path=tmp_path / "log", on_line=lines)
    (straggler,) = lines.pids("straggler=")
    try:
        assert result.exit_code == 0 and not result.timed_out
        assert time.monotonic() - started < HANG_S  # hang guard: the straggler is killed, not waited for
        assert "done" in lines.lines
        assert await _wait_gone(straggler), "straggler survived"
        note = "[ftbus] the command exited, leaving 1 process(es) of its group running: killed\n"
        assert result.output_tail.endswith("done\n" + note)
    finally:
        _kill_if_alive(straggler)


async def test_a_process_that_left_the_session_does_not_hang_the_run(tmp_path: Path) -> None:
    runner = LocalRunner(["PATH"], kill_grace_s=1.0, drain_idle_s=1.0)
    lines = Lines()
    left = tmp_path / "left-the-session"
    # The main command ends only once the escaper has left the session (not after a sleep that a
    # slow start could outlast): it then holds the pipe open, silent, for good.
    escaper = (f"import os, time; os.setsid(); print(f'escaped={{os.getpid()}}', flush=True); "
               f"open('{left}', 'w').close(); time.sleep({LONG})")
    main = f"{PY} -c \"{escaper}\" & while [ ! -e '{left}' ]; do sleep 0.05; done; echo main-done"
    result = await asyncio.wait_for(
        runner.run(["sh", "-c", main], cwd=tmp_path, timeout_s=600, log_path=tmp_path / "log", on_line=lines),
        HANG_S * 2,  # hang guard
    )
    for pid in lines.pids("escaped="):
        _kill_if_alive(pid)
    assert result.exit_code == 0
    assert "main-done" in lines.lines
    assert "held open by a process that left the session" in result.output_tail


async def test_environment_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBUS_TEST_SECRET", "must-not-leak")
    monkeypatch.setenv("FTBUS_TEST_VISIBLE", "listed")
    runner = LocalRunner(["PATH", "FTBUS_TEST_VISIBLE", "FTBUS_TEST_UNSET"])
    result = await runner.run(
        [PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        cwd=tmp_path,
        env={"EXPLICIT": "from-call"},
        timeout_s=60,
        log_path=tmp_path / "log",
    )
    assert result.exit_code == 0
    child_env = json.loads(result.output_tail)
    assert "FTBUS_TEST_SECRET" not in child_env
    assert child_env["FTBUS_TEST_VISIBLE"] == "listed"
    assert child_env["EXPLICIT"] == "from-call"
    assert child_env["PATH"] == os.environ["PATH"]
    assert "FTBUS_TEST_UNSET" not in child_env
    assert "HOME" not in child_env  # not listed: scrubbed like everything else
    assert child_env.get("PYTHONUNBUFFERED") == "1"
    assert "OMP_NUM_THREADS" not in child_env or child_env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS")


async def test_a_local_run_gets_the_thread_counts_of_its_cpus(tmp_path: Path) -> None:
    runner = LocalRunner(["PATH"], cpus=2)
    result = await runner.run(
        [PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        cwd=tmp_path, env={"MKL_NUM_THREADS": "3"}, timeout_s=60, log_path=tmp_path / "log",
    )
    child_env = json.loads(result.output_tail)
    assert child_env["OMP_NUM_THREADS"] == child_env["OPENBLAS_NUM_THREADS"] == "2"
    assert child_env["MKL_NUM_THREADS"] == "3"  # the stage's own count wins


async def test_path_prefix_is_where_tools_are_found(tmp_path: Path) -> None:
    tools = tmp_path / "toolchain" / "bin"
    tools.mkdir(parents=True)
    tool = tools / "fake-llamafactory-cli"
    tool.write_text("#!/bin/sh\necho \"tool ran with $1\"\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    runner = LocalRunner(["PATH"], path_prefix=[tools])
    result = await runner.run(["fake-llamafactory-cli", "train"], cwd=tmp_path, timeout_s=60,
                              log_path=tmp_path / "log")
    assert result.exit_code == 0
    assert result.output_tail == "tool ran with train\n"
    assert runner.child_env()["PATH"].split(os.pathsep)[0] == str(tools)


async def test_missing_executable_is_a_result_not_an_exception(runner: LocalRunner, tmp_path: Path) -> None:
    result = await runner.run(["no-such-command-ftbus"], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log")
    assert result.exit_code == 127
    assert not result.timed_out
    assert "no-such-command-ftbus" in result.output_tail
    assert "not found" in result.output_tail
    assert "not found" in (tmp_path / "log").read_text()


async def test_non_executable_file_is_126(runner: LocalRunner, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("echo hi\n")
    result = await runner.run([str(script)], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log")
    assert result.exit_code == 126
    assert "script.sh" in result.output_tail


async def test_missing_working_directory_is_our_error(runner: LocalRunner, tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        await runner.run(["true"], cwd=tmp_path / "missing", timeout_s=60, log_path=tmp_path / "log")


async def test_a_failing_on_line_callback_kills_the_tree_and_propagates(
    runner: LocalRunner, tmp_path: Path
) -> None:
    pids: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("pid="):
            pids.append(int(line.split("=")[1]))
            raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        await runner.run(["sh", "-c", f"sleep {LONG} & echo pid=$!; sleep {LONG}"], cwd=tmp_path,
                         timeout_s=600, log_path=tmp_path / "log", on_line=on_line)
    try:
        assert pids and await _wait_gone(pids[0])
    finally:
        for pid in pids:
            _kill_if_alive(pid)
