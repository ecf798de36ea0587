"""ftbus services as separate processes (`ftbus worker STAGE`), with the stand-in toolchain.

Each worker is its own process so that it can be SIGKILLed, SIGSTOPped and restarted alone, and
its memory measured alone. The stand-in tools (tests/standin/) run on the host: they take their
durations and outcomes from the workspace (train.yaml keys, process_data.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from chaos.network import Network
from chaos.process import OwnedProcess

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standin"


def standin_toolchain(dest: Path) -> Path:
    """The stand-in llamafactory-cli and lm_eval, run by this interpreter (it has pyyaml)."""
    dest.mkdir(parents=True, exist_ok=True)
    for script in STANDIN.iterdir():
        if script.is_file() and not script.name.endswith((".md", ".py")):
            body = script.read_text().split("\n", 1)[1]
            target = dest / script.name
            target.write_text(f"#!{sys.executable}\n{body}")
            target.chmod(0o755)
    return dest


def standin_assets(dest: Path) -> Path:
    from tests.standin.assets import build_standin_assets

    if not (dest / "models").is_dir():
        build_standin_assets(dest)
    return dest


def service_env(settings: dict[str, object]) -> dict[str, str]:
    """The environment of a service process: ours without FTBUS_*, plus ``settings`` as FTBUS_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTBUS_", "OPENAI_"))}
    for key, value in settings.items():
        env[f"FTBUS_{key.upper()}"] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Service(OwnedProcess):
    """One `ftbus worker STAGE` process, restartable."""

    stage: str
    index: int
    env: dict[str, str]
    log: Path
    concurrency: int = 1
    host: int = 0  # the host (network namespace) it runs on; 0: this machine's own network
    prefix: list[str] = field(default_factory=list)  # runs it on that host (nsenter)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0
    held: bool = False  # a fault is working on it: the supervisor leaves it alone
    exits: list[int] = field(default_factory=list)  # exit codes of exits nobody asked for

    @property
    def name(self) -> str:
        return f"{self.stage}-{self.index}"

    def start(self) -> None:
        if self.alive():
            return
        log = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "ftbus.cli", "worker", self.stage,
                 "--concurrency", str(self.concurrency)],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        self.starts += 1

    def rss_bytes(self) -> int | None:
        """Resident memory of the worker process (VmRSS), None when it is not running."""
        if not self.alive() or self.pid is None:
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None


class Services:
    """``per_stage`` workers of every stage (the aggregator included), each its own process. With
    ``network``, spread over its hosts in turn (data-1 h1, data-2 h2, train-1 h3, train-2 h1, ...):
    the workers of a stage are on different hosts."""

    STAGES = ("data", "train", "bench", "judge", "aggregate")

    def __init__(self, root: Path, settings: dict[str, object], per_stage: int = 2, concurrency: int = 1,
                 network: Network | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        env = service_env(settings)
        self.all = [
            Service(stage, i, env, root / f"{stage}-{i}.log", concurrency)
            for stage in self.STAGES
            for i in range(1, per_stage + 1)
        ]
        if network is not None:
            for k, service in enumerate(self.all):
                service.host = k % network.hosts + 1
                service.prefix = network.exec_prefix(service.host)

    def of(self, stage: str) -> list[Service]:
        return [s for s in self.all if s.stage == stage]

    def start(self) -> None:
        for service in self.all:
            service.start()

    def stop(self) -> None:
        for service in self.all:
            service.held = True
            service.stop()

    async def supervise(self, stop: asyncio.Event) -> None:
        """Like a restart policy (systemd, Kubernetes): start again a worker that exited on its own."""
        while not stop.is_set():
            for service in self.all:
                if not service.held and service.proc is not None and service.proc.poll() is not None:
                    service.exits.append(service.proc.returncode)
                    service.start()
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass


def tagged_processes(root: Path) -> list[tuple[int, str]]:
    """Live processes (pid, command) that belong to a run under ``root``: candidate processes (their
    working folder or command line is under it) and ftbus workers (their environment names it)."""
    found: list[tuple[int, str]] = []
    me = os.getpid()
    needle = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2:].split()[0] in {"Z", "X"}:
                continue
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd").encode()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in cwd or needle in cmdline or needle in environ:
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]))
    return found


def leftovers(root: Path, grace_s: float = 15.0) -> list[tuple[int, str]]:
    """``tagged_processes`` still alive after ``grace_s`` (undertakers need a moment to finish)."""
    import time

    deadline = time.monotonic() + grace_s
    found = tagged_processes(root)
    while found and time.monotonic() < deadline:
        time.sleep(0.2)
        found = tagged_processes(root)
    return found
