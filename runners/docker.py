"""The container runner: each run of candidate code in its own Docker container (docs/sandbox.md).

Written with the docker SDK (blocking calls, each in a thread). Inside the container:

- **mounts**: the run's working folder read-write and the stage's :class:`Sandbox` paths
  read-only, each at the same path as on the host, so argv, environment and the files a stage
  wrote (train.yaml, lm-eval task files) need no translation; nothing else of the host;
- **network**: none, or only the LLM gateway: its Unix socket is mounted and ``socat`` inside the
  container listens on 127.0.0.1 for it (the container has no route anywhere else);
- **isolation**: its own PID namespace with docker's init as PID 1, a non-root user, a read-only
  root filesystem with a size-limited tmpfs ``/tmp``, every capability dropped,
  ``no-new-privileges``, and only the environment the stage gives (never the worker's);
- **limits**: memory (no swap beyond it), CPUs, pids and /dev/shm from settings; an OOM kill comes
  back as exit 137 with ``oom_killed`` set;
- **lifecycle**: output streams into the stage log as it is printed; a timeout or a cancel kills
  the container (exit 124 / 130); the container is removed after every run; containers are
  labelled with request id, stage and owning worker, and a worker starting on a host removes those
  whose owner died (:func:`reap_containers`);
- **resident containers** (:meth:`DockerRunner.start_resident`): the same isolation for one
  long-lived container a stage keeps between messages (the warm benchmark engine), its mounts
  fixed at start, killed on a timeout or cancel by its stage and reaped like the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import structlog
from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from runners.base import (
    EXIT_CANCELLED,
    EXIT_OOM_KILLED,
    EXIT_TIMEOUT,
    LineCallback,
    RunOutput,
    RunResult,
    check_run,
    thread_env,
)
from runners.sandbox import Sandbox, SandboxUnavailable, gpu_selection, host_identity, owner_alive
from shared.logs import get_logger

log = get_logger("ftbus.sandbox")

LABEL_OWNER = "ftbus.owner"
#: The container the owning worker runs in, when it runs in a container of the same engine.
LABEL_OWNER_CONTAINER = "ftbus.owner-container"
LABEL_REQUEST = "ftbus.request_id"
LABEL_STAGE = "ftbus.stage"
#: The sandbox user when the worker runs as root (the image's ``ftbus`` user).
SANDBOX_UID = 1000
#: What every container gets, whatever the stage: caches and HOME on the tmpfs.
BASE_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "HF_HOME": "/tmp/hf",
    "MPLCONFIGDIR": "/tmp/matplotlib",
    "XDG_CACHE_HOME": "/tmp/cache",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def sandbox_env(cpus: float, env: Mapping[str, str]) -> dict[str, str]:
    """A sandboxed run's whole environment: the base above, the thread counts of its ``cpus``
    (:func:`runners.base.thread_env`), the stage's own variables over both; nothing of the worker's."""
    return {**BASE_ENV, **thread_env(cpus), **env}


_GATEWAY_SOCKET_IN_CONTAINER = "/run/ftbus-llm/llm.sock"


def engine_client(timeout_s: float = 10.0) -> docker.DockerClient:
    """A client of the engine named by DOCKER_HOST (default: the local socket), checked with a ping."""
    try:
        client = docker.from_env(timeout=int(max(timeout_s, 1)))
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(
            f"no Docker engine is reachable ({exc}); start one (`make docker`, or "
            "deploy/sandbox/engine.sh), or set FTBUS_SANDBOX=local for development without isolation"
        ) from None
    return client


def parse_size(text: str) -> int:
    """``512m``, ``8g``, ``1073741824`` -> bytes (docker's units: b, k, m, g)."""
    value = text.strip().lower()
    units = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
    if value and value[-1] in units:
        return int(float(value[:-1]) * units[value[-1]])
    return int(value)


def gpu_request(spec: str | None) -> list[DeviceRequest]:
    """GPUs for a container, as :func:`runners.sandbox.gpu_selection` reads ``spec``."""
    selection = gpu_selection(spec)
    if isinstance(selection, list):
        return [DeviceRequest(device_ids=selection, capabilities=[["gpu"]])] if selection else []
    if selection == 0:
        return []
    return [DeviceRequest(count=selection, capabilities=[["gpu"]])]


class DockerRunner:
    """Runs each command in a fresh container of ``image`` (see the module docstring)."""

    def __init__(
        self,
        image: str,
        *,
        stage: str,
        memory: str = "8g",
        cpus: float = 0.0,
        pids: int = 4096,
        shm: str = "1g",
        tmp_size: str = "2g",
        gpus: str | None = None,
        user: str | None = None,
        kill_grace_s: float = 5.0,
        max_line_chars: int = 64 * 1024,
        client: docker.DockerClient | None = None,
    ) -> None:
        self.image = image
        self.stage = stage
        self.memory = parse_size(memory)
        #: CPUs per run (0: all of the host's): its CPU limit and its thread counts (sandbox_env).
        self.cpus = cpus
        self.pids = pids
        self.shm = parse_size(shm)
        self.tmp_size = parse_size(tmp_size)
        self.gpus = gpus
        self.user = user or (f"{SANDBOX_UID}:{SANDBOX_UID}" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}")
        self.kill_grace_s = kill_grace_s
        self.max_line_chars = max_line_chars
        self._client = client
        self.owner = host_identity()
        self.owner_container = ""  # set by check(): the worker's own container on this engine, if any

    @property
    def name(self) -> str:
        return f"docker:{self.image}"

    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = engine_client()
        return self._client

    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` unless the engine answers and the image exists. Notes
        the worker's own container on this engine, if it runs in one, for the reaper."""
        client = self.client()
        self.owner_container = container_of_host(client)
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"the sandbox image {self.image} does not exist on this engine: build it with "
                "`make sandbox` (deploy/sandbox/build.sh), or set FTBUS_SANDBOX_IMAGE to an image that has "
                "the toolchain on PATH (deploy/docker/)"
            ) from None

    # ------------------------------------------------------------------ one run

    async def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float,
                  log_path: Path, on_line: LineCallback | None = None, tail_chars: int = 20000,
                  sandbox: Sandbox | None = None, cancel: asyncio.Event | None = None,
                  request_id: str = "", max_file_bytes: int | None = None) -> RunResult:
        cwd = check_run(argv, cwd, timeout_s)
        sandbox = sandbox or Sandbox()
        # The stage runtime binds the request to every log line; the container label names it too.
        request_id = request_id or str(structlog.contextvars.get_contextvars().get("request_id", ""))
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._hand_over, cwd)
        spec = self._container_spec(list(argv), cwd, dict(env or {}), sandbox, request_id, max_file_bytes)

        log_file = await asyncio.to_thread(log_path.open, "wb")
        output = RunOutput(log_file, on_line, tail_chars, self.max_line_chars)
        start = time.monotonic()
        container: Any = None
        try:
            container = await self._create(spec)
            await asyncio.to_thread(container.start)
            how, state = await self._supervise(container, output, timeout_s, cancel)
        except BaseException:
            # Cancelled (worker stopping, user cancel through task.cancel()) or our own failure:
            # the container must not outlive the run.
            if container is not None:
                await asyncio.shield(asyncio.to_thread(_remove, container))
            log_file.close()
            raise
        await asyncio.to_thread(_remove, container)
        try:
            exit_code = int(state.get("ExitCode", -1))
            oom = bool(state.get("OOMKilled"))
            if how == "timeout":
                output.note(f"killed after {timeout_s:g} seconds: the stage timeout")
                exit_code = EXIT_TIMEOUT
            elif how == "cancel":
                output.note("killed on request: the run was cancelled")
                exit_code = EXIT_CANCELLED
            elif oom or (exit_code == EXIT_OOM_KILLED and state.get("OOMKilled") is None):
                oom = True
                output.note(
                    f"killed by the kernel: out of memory (the sandbox's limit is {self.memory / 2**30:.2f} GiB; "
                    "exit code 137)"
                )
                exit_code = EXIT_OOM_KILLED
            return RunResult(
                exit_code=exit_code,
                timed_out=how == "timeout",
                cancelled=how == "cancel",
                duration_s=round(time.monotonic() - start, 3),
                timeout_s=timeout_s,
                log_path=log_path,
                output_tail=output.tail,
                oom_killed=oom and how == "exited",
                sandbox=self.name,
            )
        finally:
            log_file.close()

    async def _supervise(
        self, container: Any, output: RunOutput, timeout_s: float, cancel: asyncio.Event | None
    ) -> tuple[str, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        reader = threading.Thread(
            target=_stream_logs, args=(container, loop, chunks), name=f"logs-{container.short_id}", daemon=True
        )
        reader.start()
        waiter = asyncio.ensure_future(asyncio.to_thread(_wait, container))
        deadline = None if math.isinf(timeout_s) else time.monotonic() + timeout_s
        how = "exited"
        pump = asyncio.ensure_future(_pump(chunks, output))
        try:
            while not waiter.done():
                if cancel is not None and cancel.is_set():
                    how = "cancel"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    how = "timeout"
                    break
                if pump.done() and pump.exception() is not None:
                    pump.result()  # the on_line callback failed
                await asyncio.wait({waiter}, timeout=0.1)
            if how != "exited":
                await asyncio.to_thread(_kill, container)
            await waiter
            # The log stream ends when the container stops; give it a moment to deliver the tail.
            await asyncio.wait({pump}, timeout=10)
            if not pump.done():
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            state = await asyncio.to_thread(_state, container)
            return how, state
        finally:
            if not pump.done():
                pump.cancel()

    # ------------------------------------------------------------------ a resident container

    async def start_resident(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                             log_path: Path, sandbox: Sandbox | None = None, label: str = "") -> DockerResident:
        """Start one long-lived container (the warm benchmark engine) with the isolation of :meth:`run`.

        Its mounts are fixed now: ``cwd`` read-write, ``sandbox``'s paths read-only. It keeps
        running between messages; its output streams into ``log_path``; it is labelled like a run
        (``label`` as its request id), so :func:`reap_containers` removes it when its worker dies."""
        cwd = check_run(argv, cwd, math.inf)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._hand_over, cwd)
        spec = self._container_spec(list(argv), cwd, dict(env or {}), sandbox or Sandbox(), label)
        container: Any = None
        try:
            container = await self._create(spec)
            await asyncio.to_thread(container.start)
        except BaseException:
            if container is not None:
                await asyncio.shield(asyncio.to_thread(_remove, container))
            raise
        resident = DockerResident(self, container, log_path)
        resident.follow()
        return resident

    async def _create(self, spec: dict[str, Any]) -> Any:
        """Create the container. Cancelled meanwhile (a cancel, the worker stopping), the engine
        goes on creating it in its thread: it is then removed as soon as it exists, instead of
        staying behind (created, never started) for as long as this worker lives."""
        creating = asyncio.ensure_future(asyncio.to_thread(self.client().containers.create, **spec))
        try:
            return await asyncio.shield(creating)
        except BaseException:
            creating.add_done_callback(_remove_once_created)  # now, or once the engine made it
            raise

    # ------------------------------------------------------------------ container spec

    def _hand_over(self, folder: Path) -> None:
        """Let the sandbox user write the working folder (a worker running as root owns it)."""
        if os.getuid() != 0:
            return
        uid, _, gid = self.user.partition(":")
        uid_n, gid_n = int(uid), int(gid or uid)
        for root, dirs, files in os.walk(folder):
            os.chown(root, uid_n, gid_n)
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.chown(os.path.join(root, name), uid_n, gid_n, follow_symlinks=False)

    def _container_spec(
        self, argv: list[str], cwd: Path, env: dict[str, str], sandbox: Sandbox, request_id: str,
        max_file_bytes: int | None = None,
    ) -> dict[str, Any]:
        mounts = [Mount(target=str(cwd), source=str(cwd.resolve()), type="bind", read_only=False)]
        seen = {str(cwd)}
        for mount in sandbox.mounts:
            path = Path(mount.path).absolute()
            if not path.exists():
                continue  # nothing to show; the run reports the missing file itself
            for target in dict.fromkeys([str(path), str(path.resolve())]):
                if target not in seen:
                    seen.add(target)
                    mounts.append(Mount(target=target, source=str(path.resolve()), type="bind",
                                        read_only=mount.read_only))
        command = argv
        if sandbox.llm_socket is not None:
            mounts.append(Mount(target=str(Path(_GATEWAY_SOCKET_IN_CONTAINER).parent),
                                source=str(Path(sandbox.llm_socket).parent.resolve()), type="bind", read_only=True))
            command = gateway_command(argv, sandbox.llm_port)
        container_env = sandbox_env(self.cpus, env)
        return {
            "image": self.image,
            "command": command,
            "working_dir": str(cwd),
            "user": self.user,
            "environment": container_env,
            "network_mode": "none",
            "mounts": mounts,
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={self.tmp_size},mode=1777"},
            "mem_limit": self.memory,
            "memswap_limit": self.memory,
            "nano_cpus": int((self.cpus or os.cpu_count() or 1) * 1e9),
            "pids_limit": self.pids,
            # RLIMIT_FSIZE (bytes): no single file past the run's disk quota, whatever the polling.
            "ulimits": [Ulimit(name="fsize", soft=max_file_bytes, hard=max_file_bytes)] if max_file_bytes else [],
            "shm_size": self.shm,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "init": True,
            "ipc_mode": "private",
            "device_requests": gpu_request(self.gpus) if sandbox.gpus else [],
            "labels": {LABEL_OWNER: self.owner, LABEL_REQUEST: request_id, LABEL_STAGE: self.stage,
                       **({LABEL_OWNER_CONTAINER: self.owner_container} if self.owner_container else {})},
            # The stage log is the record; docker's own copy is bounded so a chatty run cannot fill its disk.
            "log_config": LogConfig(type="json-file", config={"max-size": "20m", "max-file": "2"}),
            "detach": True,
        }


class DockerResident:
    """A resident container started by :meth:`DockerRunner.start_resident`."""

    def __init__(self, runner: DockerRunner, container: Any, log_path: Path) -> None:
        self._runner = runner
        self.container = container
        self.sandbox = runner.name
        self._log_path = log_path
        self._reader: threading.Thread | None = None

    def follow(self) -> None:
        """Copy the container's output into its log file, from a thread, until it stops."""

        def copy() -> None:
            with contextlib.suppress(Exception), self._log_path.open("ab") as fh:
                for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    fh.write(chunk)
                    fh.flush()

        self._reader = threading.Thread(target=copy, name=f"resident-{self.container.short_id}", daemon=True)
        self._reader.start()

    async def poll(self) -> int | None:
        try:
            state = await asyncio.to_thread(_state, self.container)
        except docker.errors.NotFound:
            return EXIT_OOM_KILLED  # removed under us: as good as killed
        if state.get("Running") or state.get("Status") in ("created", "running", "restarting"):
            return None
        if state.get("OOMKilled"):
            return EXIT_OOM_KILLED
        return int(state.get("ExitCode", -1))

    def hand_over(self, folder: Path) -> None:
        self._runner._hand_over(folder)

    async def kill(self) -> None:
        await asyncio.shield(asyncio.to_thread(_remove, self.container))


def gateway_command(argv: Sequence[str], port: int) -> list[str]:
    """``argv`` behind a forwarder: 127.0.0.1:port inside the container -> the gateway's socket.

    The forwarder is started first and waited for (its listening socket shows in /proc/net/tcp),
    so the candidate's first call cannot race it."""
    port_hex = f"{port:04X}"
    script = (
        f"socat TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{_GATEWAY_SOCKET_IN_CONTAINER} "
        "2>/dev/null & "
        f'i=0; while ! grep -q ":{port_hex} 00000000:0000 0A" /proc/net/tcp 2>/dev/null && [ $i -lt 200 ]; '
        'do i=$((i+1)); sleep 0.01; done; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "ftbus-sandbox", *argv]


# ------------------------------------------------------------------ blocking helpers (threads)


def _stream_logs(container: Any, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes | None]) -> None:
    try:
        stream: Iterator[bytes] = container.logs(stream=True, follow=True, stdout=True, stderr=True)
        for chunk in stream:
            loop.call_soon_threadsafe(chunks.put_nowait, chunk)
    except Exception:  # the container was removed under us: the run is over
        pass
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            loop.call_soon_threadsafe(chunks.put_nowait, None)


async def _pump(chunks: asyncio.Queue[bytes | None], output: RunOutput) -> None:
    while (chunk := await chunks.get()) is not None:
        await output.feed(chunk)
    await output.finish()


def _wait(container: Any) -> dict[str, Any]:
    while True:
        try:
            return container.wait()
        except Exception as exc:  # the wait call's own HTTP timeout: the run goes on
            if "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
                continue
            raise


def _kill(container: Any) -> None:
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.kill()


def _state(container: Any) -> dict[str, Any]:
    container.reload()
    return dict(container.attrs.get("State", {}))


def _remove(container: Any) -> None:
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.remove(force=True)


def _remove_once_created(creating: asyncio.Future[Any]) -> None:
    """Done callback of a creation whose run was cancelled: remove the container it made, off the
    event loop (a daemon thread: the loop may be closing)."""
    if creating.cancelled() or creating.exception() is not None:
        return
    threading.Thread(target=_remove, args=(creating.result(),), name="remove-created", daemon=True).start()


def reap_containers(client: docker.DockerClient) -> list[str]:
    """Remove sandbox containers whose worker died (SIGKILL, OOM) without removing them.

    Called when a worker starts, like :func:`runners.base.reap_orphans` for local processes. A
    worker of this host is judged by its process. A worker that ran in a container of this same
    engine (a compose service; a container since replaced, under another hostname) is judged by
    that container: its sandbox containers go once it no longer runs. A worker of any other host
    is not this engine's to judge. Returns the names of the containers removed."""
    removed: list[str] = []
    here = socket.gethostname()
    # Sparse: the listing's own data, not an inspect of each (one removed meanwhile would raise).
    for container in client.containers.list(all=True, filters={"label": LABEL_OWNER}, sparse=True):
        labels = container.attrs.get("Labels") or {}
        owner = labels.get(LABEL_OWNER, "")
        host = owner.partition(":")[0]
        its_container = labels.get(LABEL_OWNER_CONTAINER, "")
        if host == here or not host:
            alive = owner_alive(owner)
        elif its_container:
            alive = _running(client, its_container)
        else:
            alive = True
        if alive:
            continue
        _remove(container)
        removed.append(str((container.attrs.get("Names") or [container.id])[0]).lstrip("/"))
    return removed


def container_of_host(client: docker.DockerClient, hostname: str | None = None) -> str:
    """The id of the running container of this engine whose hostname is ``hostname`` (default: this
    process's): the worker's own container, when it runs in one; "" when none or several are."""
    hostname = hostname or socket.gethostname()
    found = []
    for summary in client.api.containers(filters={"status": "running"}):
        try:  # one by one: a container removed meanwhile is no answer, not an error
            info = client.api.inspect_container(summary["Id"])
        except docker.errors.NotFound:
            continue
        if info.get("Config", {}).get("Hostname") == hostname:
            found.append(summary["Id"])
    return found[0] if len(found) == 1 else ""


def _running(client: docker.DockerClient, container_id: str) -> bool:
    try:
        return client.containers.get(container_id).status in ("running", "restarting", "paused")
    except docker.errors.NotFound:
        return False
