"""Runners: how every stage runs candidate code (docs/sandbox.md).

The candidate's code is untrusted and its failure is a *result*: a non-zero exit, a timeout or a
command that does not exist all come back as a :class:`RunResult`, never as an exception. What
does raise is our own trouble (a missing working directory) and cancellation of the awaiting task,
which kills the process tree before it propagates.

:class:`LocalRunner` runs a subprocess in its own session and process group, with a scrubbed
environment, output streamed line by line to a log file and a callback, and a timeout that kills
the whole tree. Processes that leave the session on purpose (``setsid``, daemons) escape any
process-group based runner; the container runner is the answer for that.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import functools
import inspect
import math
import os
import resource
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

import psutil
from pydantic import BaseModel

from runners.sandbox import Sandbox
from shared.events import ArtifactRef, StageOutcome

LineCallback = Callable[[str], Awaitable[None] | None]

EXIT_TIMEOUT = 124  # as `timeout(1)` and the reference evaluator
EXIT_CANNOT_EXECUTE = 126  # as the shell: found but not executable
EXIT_NOT_FOUND = 127  # as the shell: command not found
EXIT_CANCELLED = 130  # as the shell for SIGINT: stopped on request
EXIT_OOM_KILLED = 137  # 128 + SIGKILL, as docker reports a container the kernel killed for memory

_READ_CHUNK = 64 * 1024


class RunResult(BaseModel):
    exit_code: int
    timed_out: bool
    cancelled: bool
    duration_s: float
    timeout_s: float
    log_path: Path
    output_tail: str
    #: Killed by the kernel for exceeding its memory limit (the container runner can tell; exit 137).
    oom_killed: bool = False
    #: Which isolation the run had: ``local`` (none) or ``docker:<image>``.
    sandbox: str = "local"

    def outcome(self, log: ArtifactRef | None) -> StageOutcome:
        """The event form of this run, its log stored as ``log``."""
        return StageOutcome(
            exit_code=self.exit_code,
            timed_out=self.timed_out,
            duration_s=self.duration_s,
            timeout_s=self.timeout_s,
            log=log,
            log_tail=self.output_tail,
            oom_killed=self.oom_killed,
            sandbox=self.sandbox,
        )


#: The variables that size a process's math-library thread pools (torch's OpenMP and MKL, numpy's BLAS).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_env(cpus: float) -> dict[str, str]:
    """The thread counts for a candidate process given ``cpus`` CPUs (settings.sandbox_cpus): as many
    threads as whole CPUs, at least one; none set for 0 (the libraries' own choice: every core of the
    host). Why: torch sizes its pools by the host's cores, not by a container's CPU quota or by the
    other runs beside it, and an OpenMP thread that waits at a barrier for a descheduled sibling
    spins, burning the CPU that sibling needs. On 2 loaded cores the three example trainings took
    247 s with the host's count and 130 s with one thread each (docs/operations.md, "CPU nodes")."""
    if cpus <= 0:
        return {}
    threads = str(max(1, int(cpus)))
    return dict.fromkeys(THREAD_VARIABLES, threads)


def check_run(argv: Sequence[str], cwd: Path, timeout_s: float) -> Path:
    """What every runner checks before it starts anything; returns ``cwd`` as an absolute path.

    These are our own errors, not the candidate's (the stage prepares the folder): they raise, so
    the message is retried."""
    if not argv:
        raise ValueError("argv is empty: nothing to run")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    cwd = Path(cwd).absolute()
    if not cwd.is_dir():
        raise NotADirectoryError(f"working directory {cwd} does not exist")
    return cwd


@runtime_checkable
class Runner(Protocol):
    #: ``local``, or ``docker:<image>``: recorded in every outcome (and so in the verdict).
    name: str

    async def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float,
                  log_path: Path, on_line: LineCallback | None = None, tail_chars: int = 20000,
                  sandbox: Sandbox | None = None, cancel: asyncio.Event | None = None,
                  max_file_bytes: int | None = None) -> RunResult: ...


# ---------------------------------------------------------------------------- process trees


def tree_members(sid: int) -> list[int]:
    """Live processes of the session/process group led by ``sid`` (the child we started).

    Zombies don't count: they are dead, and where PID 1 does not reap orphans (some container
    inits) they would otherwise look alive forever. A process that made its own process group
    inside the session (shell job control, some launchers) is still found through its session.
    """
    me = os.getpid()
    members = []
    for proc in psutil.process_iter(["status"]):
        if proc.pid == me or proc.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        try:
            if os.getpgid(proc.pid) == sid or os.getsid(proc.pid) == sid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue  # exited meanwhile, or not ours to see
    return members


def _signal_tree(sid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid in tree_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _tree_alive(sid: int) -> bool:
    return bool(tree_members(sid))


# ---------------------------------------------------------------------------- output


class RunOutput:
    """Splits the child's byte stream into lines for the log file, the callback and the tail."""

    def __init__(
        self, log: BinaryIO, on_line: LineCallback | None, tail_chars: int, max_line_chars: int
    ) -> None:
        self._log = log
        self._on_line = on_line
        self._tail_chars = max(0, tail_chars)
        self._max_line = max_line_chars
        # Incremental: a multi-byte character split across two reads still decodes correctly;
        # bytes that are not UTF-8 become U+FFFD instead of an exception.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._tail = ""
        self._ends_with_newline = True
        self.last_read = time.monotonic()

    def _keep(self, text: str) -> None:
        self._tail += text
        if len(self._tail) > 2 * self._tail_chars + 4096:
            self._tail = self._tail[-self._tail_chars :] if self._tail_chars else ""

    @property
    def tail(self) -> str:
        return self._tail[-self._tail_chars :] if self._tail_chars else ""

    async def _emit(self, line: str) -> None:
        if self._on_line is None:
            return
        outcome = self._on_line(line)
        if inspect.isawaitable(outcome):
            await outcome

    async def feed(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        # The log gets the exact bytes: it is the record of what the candidate printed.
        self._log.write(data)
        self._log.flush()
        self._ends_with_newline = data.endswith(b"\n")
        text = self._decoder.decode(data)
        self._keep(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            for piece in self._pieces(line.removesuffix("\r")):
                await self._emit(piece)
        # A line without end (progress bars, minified JSON) must not grow without bound.
        while len(self._pending) > self._max_line:
            piece, self._pending = self._pending[: self._max_line], self._pending[self._max_line :]
            await self._emit(piece)

    def _pieces(self, line: str) -> list[str]:
        if len(line) <= self._max_line:
            return [line]
        return [line[i : i + self._max_line] for i in range(0, len(line), self._max_line)]

    async def finish(self) -> None:
        text = self._decoder.decode(b"", final=True)
        self._keep(text)
        self._pending += text
        if self._pending:
            for piece in self._pieces(self._pending.removesuffix("\r")):
                await self._emit(piece)
            self._pending = ""

    def note(self, message: str) -> None:
        """Append one line of our own, marked ``[ftbus]``, to the log and the tail."""
        line = ("" if self._ends_with_newline else "\n") + f"[ftbus] {message}\n"
        self._log.write(line.encode())
        self._log.flush()
        self._keep(line)
        self._ends_with_newline = True


# ---------------------------------------------------------------------------- local runner


class LocalRunner:
    """Runs commands as local subprocesses, one process group and session per run.

    ``passthrough_env`` names the host variables a child may see; all others are scrubbed (API
    keys, cloud credentials and the like never reach candidate code unless listed). ``path_prefix``
    folders are put first on PATH: that is where the fine-tuning toolchain's executables are found.
    ``extra_env`` is the base environment under both (default: ``PYTHONUNBUFFERED=1``, so that
    Python children stream their output instead of delivering it at exit). ``cpus``: the CPUs a run
    may use (settings.sandbox_cpus), which sizes its thread pools (:func:`thread_env`); nothing
    enforces it here.
    """

    name = "local"

    def __init__(
        self,
        passthrough_env: Sequence[str],
        path_prefix: Sequence[Path] = (),
        kill_grace_s: float = 10.0,
        *,
        extra_env: Mapping[str, str] | None = None,
        cancel_grace_s: float = 2.0,
        max_line_chars: int = 64 * 1024,
        drain_idle_s: float = 5.0,
        cpus: float = 0.0,
    ) -> None:
        self.passthrough_env = tuple(passthrough_env)
        # Absolute now: the child's cwd differs from ours.
        self.path_prefix = tuple(Path(p).absolute() for p in path_prefix)
        self.kill_grace_s = kill_grace_s
        self.cancel_grace_s = min(cancel_grace_s, kill_grace_s)
        self.extra_env = dict(extra_env) if extra_env is not None else {"PYTHONUNBUFFERED": "1"}
        #: The thread counts for ``cpus`` CPUs (no quota here: the processes' own sizing, thread_env).
        self.extra_env.update(thread_env(cpus))
        self.max_line_chars = max_line_chars
        self.drain_idle_s = drain_idle_s

    def child_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        result = dict(self.extra_env)
        result.update({k: os.environ[k] for k in self.passthrough_env if k in os.environ})
        result.update(env or {})
        if self.path_prefix:
            base = result.get("PATH") or os.defpath
            result["PATH"] = os.pathsep.join([*(str(p) for p in self.path_prefix), base])
        # Inherited by everything the candidate starts: lets reap_orphans() find them all.
        result[OWNER_ENV] = f"{os.getpid()}:{_start_time(os.getpid())}"
        return result

    async def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float,
                  log_path: Path, on_line: LineCallback | None = None, tail_chars: int = 20000,
                  sandbox: Sandbox | None = None, cancel: asyncio.Event | None = None,
                  max_file_bytes: int | None = None) -> RunResult:
        """Run ``argv`` and report how it ended.

        ``sandbox`` is accepted and not enforced: this runner isolates nothing (docs/sandbox.md).

        ``max_file_bytes`` caps every file the run writes (RLIMIT_FSIZE): a write past it fails
        with EFBIG ("File too large"), so one fast writer cannot overshoot a disk quota between two
        of the quota watchdog's polls (runners/quota.py).

        ``cancel``, when set while the command runs, stops it like a timeout but reports
        ``cancelled=True`` (exit code 130): for a user's cancel request, which is a result to
        publish, unlike cancellation of the awaiting task, which kills the tree and re-raises.
        """
        cwd = check_run(argv, cwd, timeout_s)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = self.child_env(env)

        # Truncated: one log per run. Writes later are small and synchronous (local disk), which
        # keeps the output in order without a thread hop per chunk.
        log = await asyncio.to_thread(log_path.open, "wb")
        try:
            output = RunOutput(log, on_line, tail_chars, self.max_line_chars)
            start = time.monotonic()

            def result(exit_code: int, *, timed_out: bool = False, cancelled: bool = False) -> RunResult:
                return RunResult(
                    exit_code=exit_code,
                    timed_out=timed_out,
                    cancelled=cancelled,
                    duration_s=round(time.monotonic() - start, 3),
                    timeout_s=timeout_s,
                    log_path=log_path,
                    output_tail=output.tail,
                    sandbox=self.name,
                )

            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=child_env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=functools.partial(_prepare_child, max_file_bytes),
                )
            except FileNotFoundError as exc:
                output.note(f"cannot start {argv[0]!r}: command not found ({exc.strerror}); PATH is "
                            f"{child_env.get('PATH', os.defpath)!r}")
                return result(EXIT_NOT_FOUND)
            except OSError as exc:
                # Permission denied, exec format error (a script without a shebang) and the like.
                output.note(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
                return result(EXIT_CANNOT_EXECUTE)

            return await self._supervise(proc, output, result, timeout_s, cancel)
        finally:
            log.close()

    async def start_resident(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                             log_path: Path, sandbox: Sandbox | None = None, label: str = "") -> LocalResident:
        """Start a long-lived process (``sandbox`` not enforced, as for :meth:`run`); see :class:`Resident`."""
        return await start_local_resident(self, argv, cwd=cwd, env=env, log_path=log_path)

    async def _supervise(
        self,
        proc: asyncio.subprocess.Process,
        output: RunOutput,
        result: Callable[..., RunResult],
        timeout_s: float,
        cancel: asyncio.Event | None,
    ) -> RunResult:
        sid = proc.pid  # start_new_session: the child leads its own session and process group
        assert proc.stdout is not None
        pump = asyncio.ensure_future(self._pump(proc.stdout, output))
        deadline = None if math.isinf(timeout_s) else time.monotonic() + timeout_s
        stragglers = 0
        try:
            how = await self._wait_exit(proc, pump, deadline, cancel)
            if how == "timeout":
                await self._terminate(sid, proc, self.kill_grace_s)
            elif how == "cancel":
                await self._terminate(sid, proc, self.cancel_grace_s)
            elif _tree_alive(sid):
                stragglers = len(tree_members(sid)) or 1
                await self._terminate(sid, proc, self.kill_grace_s)
            # Notes go after the drained output, so they are the log's last lines.
            await self._drain(proc, pump, output)
        except BaseException:
            # Cancelled, or the on_line callback failed: no process may outlive the run.
            try:
                await self._terminate(sid, proc, self.cancel_grace_s)
            except BaseException:
                _signal_tree(sid, signal.SIGKILL)
                raise
            finally:
                self._abandon(proc, pump)
            raise

        code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        if how == "timeout":
            output.note(f"killed after {timeout_s:g} seconds: the stage timeout")
            run = result(EXIT_TIMEOUT, timed_out=True)
        elif how == "cancel":
            output.note("killed on request: the run was cancelled")
            run = result(EXIT_CANCELLED, cancelled=True)
        else:
            if stragglers:
                output.note(f"the command exited, leaving {stragglers} process(es) of its group running: killed")
            # Killed by a signal: report it as the shell and docker do (128 + signal number).
            run = result(code if code >= 0 else 128 - code)
        return run

    @staticmethod
    async def _pump(stream: asyncio.StreamReader, output: RunOutput) -> None:
        while data := await stream.read(_READ_CHUNK):
            await output.feed(data)
        await output.finish()

    @staticmethod
    async def _wait_exit(
        proc: asyncio.subprocess.Process,
        pump: asyncio.Future[None],
        deadline: float | None,
        cancel: asyncio.Event | None,
    ) -> str:
        # Poll the return code rather than await proc.wait(): on Python 3.11 wait() returns only
        # once every pipe is closed, and a background grandchild holding stdout keeps it open.
        delay = 0.01
        while proc.returncode is None:
            if pump.done() and not pump.cancelled() and pump.exception() is not None:
                pump.result()  # the on_line callback failed: raise its error
            if cancel is not None and cancel.is_set():
                return "cancel"
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return "timeout"
            step = delay if deadline is None else min(delay, max(deadline - now, 0.001))
            await asyncio.sleep(step)
            delay = min(delay * 2, 0.1)
        return "exited"

    @staticmethod
    async def _terminate(sid: int, proc: asyncio.subprocess.Process, grace_s: float) -> None:
        """SIGTERM the tree, SIGKILL whatever is left after ``grace_s``, wait for the main process."""
        _signal_tree(sid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.returncode is not None and not _tree_alive(sid):
                return
            await asyncio.sleep(0.05)
        _signal_tree(sid, signal.SIGKILL)
        # SIGKILL cannot be refused; only a process stuck in the kernel (D state) takes long.
        deadline = time.monotonic() + 30.0
        while (proc.returncode is None or _tree_alive(sid)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            _signal_tree(sid, signal.SIGKILL)

    async def _drain(
        self, proc: asyncio.subprocess.Process, pump: asyncio.Future[None], output: RunOutput
    ) -> None:
        """Read what is left in the pipe. Only a process outside the tree can hold it open now."""
        while not pump.done():
            await asyncio.wait({pump}, timeout=0.5)
            if not pump.done() and time.monotonic() - output.last_read > self.drain_idle_s:
                self._abandon(proc, pump)
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                output.note(
                    "stopped reading output: the pipe is held open by a process that left the "
                    "session (setsid or a daemon), which this runner cannot kill"
                )
                return
        pump.result()

    @staticmethod
    def _abandon(proc: asyncio.subprocess.Process, pump: asyncio.Future[None]) -> None:
        pump.cancel()
        # Without this the transport lingers until the pipe closes (never, if an escaped process
        # holds it); asyncio offers no public handle on it.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()


# ---------------------------------------------------------------------------- resident processes


@runtime_checkable
class Resident(Protocol):
    """A long-lived process a stage keeps between messages (the warm benchmark engine).

    Started by a runner's ``start_resident``; it talks to its stage through files in its working
    folder, not through its output (which goes to a log file)."""

    #: Which isolation it has: ``local`` or ``docker:<image>``.
    sandbox: str

    async def poll(self) -> int | None:
        """None while it runs; its exit code once it ended (137 for an out-of-memory kill)."""
        ...

    def hand_over(self, folder: Path) -> None:
        """Let it write ``folder`` (created by the worker after it started)."""
        ...

    async def kill(self) -> None:
        """Stop it now, whatever it is doing (its whole process tree, or its container)."""
        ...


class LocalResident:
    """A subprocess in its own session that dies with the worker (``PR_SET_PDEATHSIG``)."""

    sandbox = "local"

    def __init__(self, proc: asyncio.subprocess.Process, log: BinaryIO) -> None:
        self._proc = proc
        self._log = log

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def poll(self) -> int | None:
        code = self._proc.returncode
        if code is None:
            return None
        return code if code >= 0 else 128 - code

    def hand_over(self, folder: Path) -> None:
        """The same user: nothing to hand over."""

    async def kill(self) -> None:
        sid = self._proc.pid
        _signal_tree(sid, signal.SIGKILL)
        deadline = time.monotonic() + 30.0
        while (self._proc.returncode is None or _tree_alive(sid)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            _signal_tree(sid, signal.SIGKILL)
        self._log.close()


async def start_local_resident(
    runner: LocalRunner, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None, log_path: Path,
) -> LocalResident:
    """Start ``argv`` as a resident process of ``runner`` (its environment rules, its die-with-parent).

    Raises ``OSError`` (``FileNotFoundError`` and the like) when it cannot start."""
    cwd = check_run(argv, cwd, math.inf)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = await asyncio.to_thread(log_path.open, "ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=runner.child_env(env), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, preexec_fn=functools.partial(_prepare_child, None),
        )
    except BaseException:
        log.close()
        raise
    return LocalResident(proc, log)


_PR_SET_PDEATHSIG = 1


def _prepare_child(max_file_bytes: int | None) -> None:
    """In the child, before exec: die with the worker, and cap the size of every file it writes."""
    _die_with_parent()
    if max_file_bytes is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        limit = max_file_bytes if hard == resource.RLIM_INFINITY else min(hard, max_file_bytes)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the worker dies.

    A worker killed with SIGKILL cannot clean up; without this its training process would go on
    as an orphan while the redelivered message starts the same training on another worker.
    (Grandchildren that the candidate starts itself are not covered: they are re-parented.)
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


OWNER_ENV = "FTBUS_WORKER"


def _start_time(pid: int) -> str:
    """A process's start time: a pid plus this identifies it even after pid reuse."""
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return "?"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def reap_orphans() -> list[int]:
    """Kill candidate processes whose worker died without cleaning up (e.g. SIGKILL).

    PR_SET_PDEATHSIG covers the direct child; what it started (re-parented grandchildren) is found
    here by the owner tag every candidate process inherits. Called when a worker starts on a host;
    only processes of this user whose owning worker is gone (or was replaced by another process
    with the same pid) are killed. Returns the pids killed.
    """
    uid = os.getuid()
    me = os.getpid()
    killed: list[int] = []
    for proc in psutil.process_iter(["uids"]):
        if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
            continue
        try:
            tag = proc.environ().get(OWNER_ENV)
        except psutil.Error:
            continue
        if tag is None:
            continue
        owner, _, started = tag.partition(":")
        if owner.isdigit() and _alive(int(owner)) and (_start_time(int(owner)) == started or "." not in started):
            # Its worker is alive: not an orphan. (A tag without a fractional start time was written
            # by an older ftbus, which counted clock ticks: a live owner is then trusted.)
            continue
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed.append(proc.pid)
    return killed
