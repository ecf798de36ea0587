"""What the chaos suite does to any process it owns (a nats-server node, a worker): signal, kill, stop."""

from __future__ import annotations

import os
import signal
import subprocess


class OwnedProcess:
    """Mixin for a dataclass with a ``proc`` field (``subprocess.Popen | None``)."""

    proc: subprocess.Popen[bytes] | None
    #: How long a clean shutdown may take before SIGKILL.
    stop_timeout_s: float = 30.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: the process dies at once (the OS still holds what it wrote)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown; SIGKILL after ``stop_timeout_s``."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
