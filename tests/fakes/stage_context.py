"""A stage context without a server: in-memory artifact stores, a recording runner, recorded progress.

Each stage's handler takes ``(event, ctx)``; with :func:`fake_context` its branches run in a unit
test, in milliseconds. What the runner "runs" is a Python function of the test's that writes the
files the real tool would write into the run's folder and returns its exit code and output.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.base import EXIT_TIMEOUT, RunResult
from runners.sandbox import Sandbox
from shared.artifacts import validate_name
from shared.events import ArtifactRef, Progress, RequestContext, Stage, TaskSpec, WorkspaceFile
from shared.runtime import Handler, Outgoing, StageContext, route
from shared.settings import Settings
from shared.subjects import Subjects


class MemoryArtifacts:
    """The ArtifactStore protocol over a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def _ref(self, name: str, data: bytes) -> ArtifactRef:
        return ArtifactRef(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest())

    async def put_bytes(self, name: str, data: bytes) -> ArtifactRef:
        name = validate_name(name)
        self.objects[name] = bytes(data)
        return self._ref(name, data)

    async def put_file(self, name: str, path: Path) -> ArtifactRef:
        return await self.put_bytes(name, Path(path).read_bytes())

    async def get_bytes(self, ref: ArtifactRef) -> bytes:
        return self.objects[ref.name]

    async def get_to_file(self, ref: ArtifactRef, dest: Path) -> None:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.objects[ref.name])

    async def stat(self, name: str) -> ArtifactRef | None:
        data = self.objects.get(validate_name(name))
        return None if data is None else self._ref(name, data)

    async def delete(self, name: str) -> None:
        self.objects.pop(name, None)


#: What a scripted run does: (argv, cwd, env) -> (exit code, output). It may write files in cwd.
Script = Callable[[Sequence[str], Path, Mapping[str, str]], tuple[int, str]]


@dataclass
class RunCall:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    sandbox: Sandbox | None
    timeout_s: float


@dataclass
class RecordingRunner:
    """Records every run; ``script`` plays the tool. ``timed_out`` makes every run a timeout."""

    script: Script
    name: str = "docker:fake"
    timed_out: bool = False
    calls: list[RunCall] = field(default_factory=list)

    async def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                  timeout_s: float, log_path: Path, on_line: Any = None, tail_chars: int = 20000,
                  sandbox: Sandbox | None = None, cancel: Any = None) -> RunResult:
        self.calls.append(RunCall(list(argv), Path(cwd), dict(env or {}), sandbox, timeout_s))
        code, output = (EXIT_TIMEOUT, "") if self.timed_out else self.script(argv, Path(cwd), dict(env or {}))
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(output)
        return RunResult(exit_code=code, timed_out=self.timed_out, cancelled=False, duration_s=0.01,
                         timeout_s=timeout_s, log_path=Path(log_path), output_tail=output[-tail_chars:],
                         sandbox=self.name)


class FakeBus:
    """What handlers use of the bus: settings, subjects, the five stores, core progress."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.stores = {"artifacts": MemoryArtifacts(), "cache": MemoryArtifacts(), "private": MemoryArtifacts(),
                       "models": MemoryArtifacts(), "checkpoints": MemoryArtifacts()}
        self.progress: list[Progress] = []

    async def artifacts(self) -> MemoryArtifacts:
        return self.stores["artifacts"]

    async def cache_artifacts(self) -> MemoryArtifacts:
        return self.stores["cache"]

    async def private_artifacts(self) -> MemoryArtifacts:
        return self.stores["private"]

    async def models_artifacts(self) -> MemoryArtifacts:
        return self.stores["models"]

    async def checkpoint_artifacts(self) -> MemoryArtifacts:
        return self.stores["checkpoints"]

    async def publish_core(self, subject: str, event: Progress) -> None:
        self.progress.append(event)


def fake_context(stage: Stage, settings: Settings, runner: RecordingRunner, request_id: str = "r1",
                 bus: FakeBus | None = None) -> StageContext:
    """A context as the stage's worker makes it, with its row of ftbus's pipeline table."""
    from ftbus.stages import BY_STAGE

    bus = bus or FakeBus(settings)
    return StageContext(bus, stage, request_id, bus.stores["artifacts"], runner, 1,  # type: ignore[arg-type]
                        settings.work / stage.value, row=BY_STAGE[stage])


async def handled(handler: Handler, event: Any, ctx: StageContext) -> list[Outgoing]:
    """What the worker publishes for ``handler``'s answer to ``event``: each event routed by the
    stage's row (shared/runtime.py ``route``)."""
    return [route(item, event, ctx) for item in await handler(event, ctx)]


async def upload_workspace(store: MemoryArtifacts, folder: Path, request_id: str = "r1") -> list[WorkspaceFile]:
    files = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        files.append(WorkspaceFile(path=rel, ref=await store.put_file(f"{request_id}/workspace/{rel}", path)))
    return files


def request_context(files: list[WorkspaceFile], **task: Any) -> RequestContext:
    spec = {"base_model": "tiny-standin", "benchmark": "tiny-arith", **task}
    return RequestContext(task=TaskSpec(**spec), workspace=files)


def copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, dirs_exist_ok=True)
