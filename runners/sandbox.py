"""What a run of candidate code may see, and which runner gives it that (docs/sandbox.md).

A stage describes, per run, the host paths the candidate's process needs besides its working
folder (:class:`Sandbox`); the runner decides how much of that description it can enforce:

- ``docker`` (:class:`runners.docker.DockerRunner`): a container per run that sees only its
  working folder (read-write) and the listed paths (read-only), each at the same path as on the
  host, with no network (or only the LLM gateway's socket), no bus credentials, a non-root user, a
  read-only root filesystem and resource limits. The default whenever an engine is reachable.
- ``local`` (:class:`runners.base.LocalRunner`): a subprocess of the worker. No isolation at all;
  for development on a machine without an engine, and only when chosen explicitly.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field

from shared.logs import get_logger

log = get_logger("ftbus.sandbox")


class SandboxMount(BaseModel):
    """A host path made visible inside the sandbox at the same path."""

    model_config = ConfigDict(frozen=True)

    path: Path
    read_only: bool = True


class Sandbox(BaseModel):
    """What one run may reach beyond its working folder (which is always mounted read-write)."""

    model_config = ConfigDict(frozen=True)

    mounts: tuple[SandboxMount, ...] = ()
    #: Give the run the worker's GPUs (training and benchmarks; never data processing).
    gpus: bool = False
    #: A Unix socket of the LLM gateway: the only address the run can reach, as 127.0.0.1:llm_port.
    llm_socket: Path | None = None
    llm_port: int = Field(default=8080, ge=1, le=65535)

    @classmethod
    def reading(cls, *paths: Path | None, gpus: bool = False, llm_socket: Path | None = None) -> Sandbox:
        """A sandbox that may read ``paths`` (``None`` entries skipped, duplicates dropped)."""
        seen: dict[Path, SandboxMount] = {}
        for path in paths:
            if path is not None:
                seen.setdefault(Path(path), SandboxMount(path=Path(path)))
        return cls(mounts=tuple(seen.values()), gpus=gpus, llm_socket=llm_socket)


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot run here; the message says what to do."""


LOCAL_WARNING = (
    "SANDBOX DISABLED (sandbox=local): candidate code runs as this worker's user, with its network, "
    "its files and its environment. A hostile candidate can read the bus credentials, publish its own "
    "verdict and read the hidden test split. Use only for development; set FTBUS_SANDBOX=docker in "
    "any shared deployment."
)


def host_identity() -> str:
    """This worker process, as recorded on the containers it starts: ``host:pid:start-time``.

    The start time tells a live owner from a reused pid."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{psutil.Process(pid).create_time():.2f}"


def owner_alive(owner: str) -> bool:
    """Whether the worker named by :func:`host_identity`'s string still runs (on this host)."""
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname():
        return True  # another host's worker: not ours to judge
    if not pid_text.isdigit():
        return False
    try:
        proc = psutil.Process(int(pid_text))
        return proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) and \
            f"{proc.create_time():.2f}" == started
    except psutil.Error:
        return False


ALL_GPUS = -1


def gpu_selection(spec: str | None) -> int | list[str]:
    """The GPUs a setting names: ``0`` none (``None``/``""``/``none``), :data:`ALL_GPUS` (``all``),
    a count (``2``) or device ids (``0,1``).

    ``None`` also looks at ``CUDA_VISIBLE_DEVICES`` (the ids the worker was given), then at
    ``NVIDIA_VISIBLE_DEVICES`` (what a Kubernetes device plugin or the NVIDIA container runtime gave
    the worker's container: indexes or UUIDs; ``void``/``none``: no GPU), then at the presence of
    an NVIDIA device (all of them). One reading for the container's device request and the
    engine's tensor parallelism, so the two never disagree."""
    if spec is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        given = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        # Device ids, never a count: CUDA_VISIBLE_DEVICES=3 is the fourth GPU, not three of them.
        if visible and visible != "-1":
            return [d.strip() for d in visible.split(",") if d.strip()]
        if given:
            return [] if given in ("void", "none") else ALL_GPUS if given == "all" else \
                [d.strip() for d in given.split(",") if d.strip()]
        if Path("/dev/nvidia0").exists():
            spec = "all"
        else:
            return 0
    spec = spec.strip()
    if not spec or spec == "none":
        return 0
    if spec == "all":
        return ALL_GPUS
    if spec.isdigit():
        return int(spec)
    return [d.strip() for d in spec.split(",") if d.strip()]

