"""The warm benchmark engine, from the bench worker's side (the engine: engine/ftbus_engine.py).

One engine per bench worker: a long-lived process (``sandbox=local``) or container
(``sandbox=docker``) that imported lm-eval once and serves jobs, one at a time. A job is one
model and an ordered list of splits: the engine loads the model once and runs the splits in turn.

The engine sees its exchange folder (read-write), the assets' base models and its own script
folder (read-only): the benchmarks folder never. Per job the worker links the candidate's
weights into the exchange folder; per split it writes that split's run folder (data and task
files) there, waits for the result, and moves the folder out before it writes the next split's:
the engine never has both splits of a benchmark in view at once, and each split's log holds only
that split (the engine points its output at the split's log while it runs it).

A split given a journal (:class:`evaluation.resume.SplitJournal`) is resumable: its journal is
restored into the run folder before the engine sees it, the engine answers what it records from it
and appends each answer it generates, and the worker ships the new lines to the store while it
waits for the split (docs/benchmarks.md, "Resuming an interrupted run").

Lifecycle: started on the first job and kept warm; a split over its timeout, a cancel (the
handler's task is cancelled) or an engine that died kills it, and the next job starts a fresh
one; the worker stops it when it stops (:class:`EnginePolicy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.engine.journal import JOURNAL_FILE
from evaluation.inference import InferenceConfig
from evaluation.lmeval import chat_template_for, letter_task_name, repeat_batch, task_name, write_task_configs
from evaluation.models import ModelSelection
from evaluation.registry import BenchmarkSpec
from evaluation.resume import SplitJournal
from evaluation.splits import SplitManifest, write_split_data
from runners.base import EXIT_OOM_KILLED, EXIT_TIMEOUT, Resident, RunResult
from runners.sandbox import ALL_GPUS, Sandbox, gpu_selection, host_identity, owner_alive
from shared.logs import get_logger
from shared.offline import OFFLINE_ENV
from shared.runtime import Policy, StageWorker
from shared.settings import Settings

log = get_logger("ftbus.benchmark.engine")

ENGINE_DIR = Path(__file__).resolve().parent / "engine"
ENGINE_SCRIPT = ENGINE_DIR / "ftbus_engine.py"
LOG_FILE = "lm_eval.log"
_RESULT_POLL_S = 0.05
_ALIVE_POLL_S = 1.0


@dataclass(frozen=True)
class WarmSplit:
    label: str
    manifest: SplitManifest
    #: Where the split's answers are recorded as they finish, and restored from (None: not resumable).
    journal: SplitJournal | None = None


@dataclass
class WarmRun:
    """One split's run by the engine: its run folder (moved out of the exchange area), its output
    folder and log there, and how it ended (a :class:`RunResult`, like a cold run's)."""

    run_dir: Path
    output_dir: Path
    log_path: Path
    result: RunResult
    #: The engine's error for this split (a harness exception), or why the engine stopped.
    error: str | None = None
    #: How many times this split's job had loaded its model when the split ended.
    loads: int = 0
    #: What the exchange folder held while the split ran (the engine's own listing).
    listing: list[str] = field(default_factory=list)
    engine_pid: int | None = None
    #: With a journal: what it answered, ``{"items", "of", "requests", "generated"}`` (engine/journal.py).
    resume: dict[str, int] | None = None


OnSplit = Callable[[WarmSplit], Awaitable[None]]


def _gpu_count(settings: Settings, device: str) -> int:
    """How many GPUs the engine may use: those the container is given (the same reading)."""
    if device != "cuda":
        return 0
    selection = gpu_selection(settings.sandbox_gpus or None)
    if isinstance(selection, list):
        return len(selection)
    if selection == ALL_GPUS:
        return len(list(Path("/dev").glob("nvidia[0-9]*")))
    return selection


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)


def _tail(path: Path, chars: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chars * 4))
            return fh.read().decode("utf-8", errors="replace")[-chars:] if chars else ""
    except OSError:
        return ""


def _note(path: Path, message: str) -> None:
    with contextlib.suppress(OSError), path.open("a", encoding="utf-8") as fh:
        fh.write(f"\n[ftbus] {message}\n")


def _link_files(source: Path, dest: Path) -> None:
    """The regular files at the top of ``source`` into ``dest``: hard links, copies across
    filesystems. Symbolic links are left out (they could point anywhere on the worker)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        try:
            os.link(path, dest / path.name)
        except OSError:
            shutil.copyfile(path, dest / path.name)


class WarmEngine:
    """One bench worker's engine (see the module docstring)."""

    def __init__(self, runner: Any, settings: Settings, root: Path) -> None:
        self.runner = runner
        self.settings = settings
        self.root = root
        self.exchange = root / "exchange"
        self.log_path = root / "engine.log"
        #: Read-only for the engine: the base models (not secret) and its own script.
        self.visible_roots = [settings.assets / "models"]
        self.lock = asyncio.Lock()
        self.starts = 0
        self._resident: Resident | None = None
        self._jobs = 0

    # ------------------------------------------------------------------ lifecycle

    async def _ensure(self) -> Resident:
        if self._resident is not None:
            code = await self._resident.poll()
            if code is None:
                return self._resident
            log.warning("the benchmark engine died, starting a new one", exit_code=code)
            await self.kill()
        await asyncio.to_thread(shutil.rmtree, self.exchange, True)
        self.exchange.mkdir(parents=True)
        # Whose folder this is, so that a worker starting after this one was killed (SIGKILL, OOM:
        # no stop() ran) can remove it: it may hold a candidate's weights (reap_engine_folders).
        (self.root / OWNER_FILE).write_text(host_identity(), encoding="utf-8")
        code = await asyncio.to_thread(self._copy_engine_code)
        argv = ["python", str(code / ENGINE_SCRIPT.name), str(self.exchange)]
        sandbox = Sandbox.reading(*self.visible_roots, code, gpus=True)
        self._resident = await self.runner.start_resident(
            argv, cwd=self.exchange, env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1"}, log_path=self.log_path,
            sandbox=sandbox, label="bench-engine",
        )
        self.starts += 1
        log.info("benchmark engine started", sandbox=self._resident.sandbox, starts=self.starts)
        return self._resident

    @property
    def code_dir(self) -> Path:
        """The engine's own code as the engine runs it: a copy in this worker's engine folder."""
        return self.root / "engine"

    def _copy_engine_code(self) -> Path:
        """Copy the engine's scripts into this worker's engine folder, and return it. Mounted from
        there, not from where ftbus is installed: the work folder is the path a worker running in a
        container shares with the engine it starts on the host's Docker engine (the same path on
        both: docs/operations.md), while its install path exists only inside its own container."""
        shutil.rmtree(self.code_dir, ignore_errors=True)
        self.code_dir.mkdir(parents=True)
        for script in ENGINE_DIR.glob("*.py"):
            shutil.copyfile(script, self.code_dir / script.name)
        return self.code_dir

    async def kill(self) -> None:
        resident, self._resident = self._resident, None
        if resident is not None:
            await resident.kill()

    async def stop(self) -> None:
        await self.kill()
        await asyncio.to_thread(shutil.rmtree, self.root, True)

    @property
    def running(self) -> bool:
        return self._resident is not None

    # ------------------------------------------------------------------ jobs

    async def run(
        self, spec: BenchmarkSpec, model: ModelSelection, splits: Sequence[WarmSplit], workdir: Path, *,
        device: str, timeout_s: float, on_split: OnSplit | None = None, seed: int = 0,
        inference: InferenceConfig | None = None,
    ) -> dict[str, WarmRun]:
        """Run ``splits`` of ``spec`` on ``model``, one model load for all of them (unless a split
        times out or the engine dies: the rest then run on a fresh engine). Each split's run folder
        ends up in ``workdir / f"bench-{label}"``."""
        runs: dict[str, WarmRun] = {}
        async with self.lock:
            pending = list(splits)
            while pending:
                try:
                    resident = await self._ensure()
                except OSError as exc:
                    for split in pending:
                        runs[split.label] = self._not_started(split, workdir, timeout_s, exc)
                    break
                done = await self._job(resident, spec, model, pending, workdir, runs, device, timeout_s,
                                       on_split, seed, inference)
                pending = pending[done:]
        return runs

    def _not_started(self, split: WarmSplit, workdir: Path, timeout_s: float, exc: OSError) -> WarmRun:
        run_dir = workdir / f"bench-{split.label}"
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path = run_dir / LOG_FILE
        message = f"cannot start the benchmark engine: {exc.strerror or exc}"
        _note(log_path, message)
        result = RunResult(exit_code=127 if isinstance(exc, FileNotFoundError) else 126, timed_out=False,
                           cancelled=False, duration_s=0.0, timeout_s=timeout_s, log_path=log_path,
                           output_tail=_tail(log_path, self.settings.log_tail_chars), sandbox=self.runner.name)
        return WarmRun(run_dir, run_dir / "output", log_path, result, error=message)

    def _visible(self, path: Path, dest: Path) -> Path:
        """``path`` as the engine sees it: as it is under a read-only root, else linked into ``dest``."""
        resolved = Path(path).resolve()
        for root in self.visible_roots:
            if resolved.is_relative_to(Path(root).resolve()):
                return resolved
        _link_files(resolved, dest)
        return dest

    async def _job(
        self, resident: Resident, spec: BenchmarkSpec, model: ModelSelection, pending: list[WarmSplit],
        workdir: Path, runs: dict[str, WarmRun], device: str, timeout_s: float, on_split: OnSplit | None,
        seed: int, inference: InferenceConfig | None,
    ) -> int:
        """One job on the running engine; returns how many of ``pending`` it ran."""
        self._jobs += 1
        n = self._jobs
        model_dir = self.exchange / f"model-{n}"
        sent = 0
        finished = False
        try:
            pretrained = await asyncio.to_thread(self._visible, model.pretrained, model_dir / "pretrained")
            peft = None
            if model.peft is not None:
                peft = await asyncio.to_thread(self._visible, model.peft, model_dir / "peft")
            await asyncio.to_thread(resident.hand_over, self.exchange)
            _write_json(self.exchange / f"job-{n}.json", {
                "model": {"pretrained": str(pretrained), "peft": str(peft) if peft else None},
                "device": device, "gpus": _gpu_count(self.settings, device), "dtype": None,
                # An item's repeats (lm-eval's ``repeats``) are one batched generation (lmeval.repeat_batch).
                "batch_size": repeat_batch(inference),
                "seed": seed, "apply_chat_template": chat_template_for(model, inference),
                "vllm": {"gpu_memory_utilization": self.settings.vllm_gpu_memory_utilization,
                         "max_model_len": self.settings.vllm_max_model_len,
                         "enforce_eager": self.settings.vllm_enforce_eager},
                "splits": [s.label for s in pending],
            })
            for i, split in enumerate(pending):
                run = await self._split(resident, spec, split, n, i, workdir, timeout_s, on_split, inference,
                                        chat=chat_template_for(model, inference))
                sent = i + 1
                runs[split.label] = run
                if self._resident is None:  # killed (timeout) or dead: the rest go to a fresh engine
                    return sent
            finished = True
            return sent
        except BaseException:
            # Cancelled (a user's cancel, the worker stopping) or our own failure: the engine may be
            # in the middle of a split; it must not go on with it.
            await asyncio.shield(self.kill())
            raise
        finally:
            if not finished and self._resident is not None and sent < len(pending):
                _write_json(self.exchange / f"end-{n}.json", {})
            for leftover in (model_dir, self.exchange / f"scratch-{n}"):
                await asyncio.to_thread(shutil.rmtree, leftover, True)

    async def _split(
        self, resident: Resident, spec: BenchmarkSpec, split: WarmSplit, n: int, i: int, workdir: Path,
        timeout_s: float, on_split: OnSplit | None, inference: InferenceConfig | None, *, chat: bool = False,
    ) -> WarmRun:
        exposed = self.exchange / f"run-{n}-{i}"
        dest = workdir / f"bench-{split.label}"
        try:
            def expose() -> list[str]:
                data_files = write_split_data(spec, split.manifest, exposed / "data")
                tasks = write_task_configs(spec, data_files, exposed / "tasks", inference, chat=chat)
                resident.hand_over(exposed)
                return tasks

            journal_path = exposed / JOURNAL_FILE
            if split.journal is not None:  # in the run folder before it is handed over to the engine
                await split.journal.restore(journal_path)
            tasks = await asyncio.to_thread(expose)
            if on_split is not None:
                await on_split(split)
            started = time.monotonic()
            _write_json(self.exchange / f"split-{n}-{i}.json", {
                "label": split.label, "run_dir": str(exposed), "tasks": tasks,
                "include_path": str(exposed / "tasks"), "output_path": str(exposed / "output"),
                "log_path": str(exposed / LOG_FILE),
                "journal": str(journal_path) if split.journal is not None else None,
                "subset_of": _subset_of(spec, split.manifest),
            })
            how, reply = await self._wait(resident, self.exchange / f"result-{n}-{i}.json", timeout_s,
                                          split.journal, journal_path)
            duration = round(time.monotonic() - started, 3)
        finally:
            # Out of the engine's view before anything else is shown to it.
            def move_out() -> None:
                if exposed.exists():
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(exposed), str(dest))

            await asyncio.shield(asyncio.to_thread(move_out))
        log_path = dest / LOG_FILE
        error: str | None = None
        oom = False
        if how == "timeout":
            _note(log_path, f"killed after {timeout_s:g} seconds: the stage timeout")
            code = EXIT_TIMEOUT
        elif how == "died":
            code = int(reply.get("exit_code", 1))
            oom = code == EXIT_OOM_KILLED and resident.sandbox != "local"
            error = f"the benchmark engine stopped (exit code {code})" + (": out of memory" if oom else "")
            engine_tail = _tail(self.log_path, 4000)
            _note(log_path, f"{error}; the engine's last output:\n{engine_tail}")
        else:
            error = reply.get("error")
            code = 0 if reply.get("ok") else 1
        result = RunResult(
            exit_code=code, timed_out=how == "timeout", cancelled=False, duration_s=duration, timeout_s=timeout_s,
            log_path=log_path, output_tail=_tail(log_path, self.settings.log_tail_chars), oom_killed=oom,
            sandbox=resident.sandbox,
        )
        return WarmRun(dest, dest / "output", log_path, result, error=error, loads=int(reply.get("loads", 0)),
                       listing=list(reply.get("listing", [])), engine_pid=reply.get("pid"),
                       resume=reply.get("resume"))

    async def _wait(self, resident: Resident, result_path: Path, timeout_s: float,
                    journal: SplitJournal | None = None, journal_path: Path | None = None,
                    ) -> tuple[str, dict[str, Any]]:
        """Wait for the engine's answer to a split; meanwhile ship the journal's new lines."""
        deadline = time.monotonic() + timeout_s
        next_check = time.monotonic() + _ALIVE_POLL_S
        while True:
            if journal is not None and journal_path is not None:
                await journal.ship(journal_path)
            if result_path.exists():
                reply = json.loads(result_path.read_text(encoding="utf-8"))
                result_path.unlink()
                if journal is not None and journal_path is not None:
                    await journal.ship(journal_path)  # the last answers, written before the reply
                return "done", reply
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _ALIVE_POLL_S
                code = await resident.poll()
                if code is not None:
                    if result_path.exists():
                        continue  # it answered, then ended
                    await self.kill()
                    return "died", {"exit_code": code}
            if now >= deadline:
                await self.kill()
                return "timeout", {}
            await asyncio.sleep(_RESULT_POLL_S)


def _subset_of(spec: BenchmarkSpec, manifest: SplitManifest) -> dict[str, str]:
    """Task name -> subset: the engine counts an item once, whichever of its subset's tasks ask."""
    names: dict[str, str] = {}
    for subset in manifest.item_ids:
        names[task_name(spec.name, subset)] = subset
        names[letter_task_name(spec.name, subset)] = subset
    return names


# ---------------------------------------------------------------------------- one per worker

_ENGINES: weakref.WeakKeyDictionary[Any, WarmEngine] = weakref.WeakKeyDictionary()

#: The file in an engine's folder that names the worker owning it (``host:pid:start-time``).
OWNER_FILE = "owner"


def engines_dir(settings: Settings) -> Path:
    return settings.work / "bench-engine"


def reap_engine_folders(settings: Settings) -> list[Path]:
    """Remove the engine folders of bench workers that died without stopping (their exchange
    folder, which may hold a candidate's weights and split runs). A folder whose owner runs, runs
    on another host (a shared work folder), or is not named yet (an engine starting) is left."""
    removed = []
    root = engines_dir(settings)
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        owner_file = folder / OWNER_FILE
        try:
            owner = owner_file.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if owner and not owner_alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def engine_for(runner: Any, settings: Settings) -> WarmEngine:
    """The warm engine of the worker that owns ``runner`` (one runner per worker), made on first use."""
    engine = _ENGINES.get(runner)
    if engine is None:
        root = engines_dir(settings) / f"{os.getpid()}-{secrets.token_hex(4)}"
        engine = _ENGINES[runner] = WarmEngine(runner, settings, root)
    return engine


async def stop_engine(runner: Any) -> None:
    engine = _ENGINES.pop(runner, None)
    if engine is not None:
        await engine.stop()


class EnginePolicy(Policy):
    """Removes the engine folders that dead bench workers left, as the worker starts; stops the
    worker's warm engine when the worker stops."""

    def __init__(self) -> None:
        self._runner: Any = None

    async def start(self, worker: StageWorker) -> None:
        self._runner = worker.runner
        removed = await asyncio.to_thread(reap_engine_folders, worker.bus.settings)
        if removed:
            log.warning("removed the engine folders of bench workers that died",
                        folders=[str(path) for path in removed])

    async def stop(self) -> None:
        if self._runner is not None:
            await stop_engine(self._runner)
