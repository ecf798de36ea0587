"""One interface over the benchmark backends: lm-eval (default) and OpenCompass.

The benchmark service asks for a run (argv, env, output folder), runs it with ``cwd=run_dir``, and
asks for the scores; which backend did the work is invisible in ``BenchmarkScores`` (same subset
keys, metric names and 0-1 scale). Both backends live outside the services' environment:

- lm-eval in the fine-tuning toolchain: ``lm_eval`` is found on PATH, which the stage runner
  prefixes with ``settings.toolchain_path()``;
- OpenCompass in its own env (deploy/opencompass/install.sh; it breaks the toolchain's numpy and
  datasets): ``opencompass`` is called by absolute path from ``settings.opencompass_bin``, else the
  repository's ``.opencompass/bin``, else PATH.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

from evaluation.inference import InferenceConfig
from evaluation.lmeval import LmEvalOutputError, parse_lm_eval_output, prepare_lm_eval_run
from evaluation.models import ModelSelection
from evaluation.opencompass import (
    OpenCompassOutputError,
    OpenCompassUnsupported,
    parse_opencompass_output,
    prepare_opencompass_run,
)
from evaluation.registry import BenchmarkSpec
from evaluation.splits import SplitManifest
from shared.events import BenchmarkScores

BackendName = Literal["lm-eval", "opencompass"]
BACKENDS: tuple[str, ...] = get_args(BackendName)

REPO_OPENCOMPASS_BIN = Path(__file__).resolve().parents[1] / ".opencompass" / "bin"


class BackendUnavailable(RuntimeError):
    """The selected backend is not installed where the settings say; the message says how to fix it."""


class PreparedRun(NamedTuple):
    """Unpacks as ``argv, env, output_dir``."""

    argv: list[str]
    env: dict[str, str]
    output_dir: Path


#: The scores of a finished run: ``parse(output_dir, spec, manifest, max_error_samples, seed)``.
Parse = Callable[[Path, BenchmarkSpec, SplitManifest, int, int], BenchmarkScores]
#: Write a run's inputs and say what to run:
#: ``prepare(spec, manifest, run_dir, exe, model, device, inference)``.
Prepare = Callable[[BenchmarkSpec, SplitManifest, Path, str, ModelSelection, str, InferenceConfig | None],
                   PreparedRun]


@dataclass(frozen=True)
class Backend:
    """One benchmark harness: writes a run's inputs, says what to run, reads its scores back.

    Whichever backend did the work is invisible in ``BenchmarkScores`` (same subset keys, metric
    names and 0-1 scale); each parses its own output format, on the scoring both share
    (evaluation/scoring.py), and neither imports the other."""

    name: str
    label: str  # for messages
    log_file: str
    executable: str  # argv[0] by name
    prepare: Prepare
    parse: Parse
    #: What a run's output can fail with (the service reports it, never crashes).
    output_errors: tuple[type[Exception], ...]
    #: What preparing can fail with before anything runs.
    prepare_errors: tuple[type[Exception], ...]


def _prepare_lm_eval(spec: BenchmarkSpec, manifest: SplitManifest, run_dir: Path, exe: str,
                     model: ModelSelection, device: str, inference: InferenceConfig | None) -> PreparedRun:
    run = prepare_lm_eval_run(spec, manifest, run_dir, lm_eval=exe, model=model, device=device, inference=inference)
    return PreparedRun(run.argv, run.env, run.output_dir)


def _prepare_opencompass(spec: BenchmarkSpec, manifest: SplitManifest, run_dir: Path, exe: str,
                         model: ModelSelection, device: str, inference: InferenceConfig | None) -> PreparedRun:
    # OpenCompass generates greedily, as it always has: its own configs carry its sampling.
    run = prepare_opencompass_run(spec, manifest, run_dir, opencompass=exe, model=model, device=device)
    return PreparedRun(run.argv, run.env, run.output_dir)


LM_EVAL = Backend(
    name="lm-eval", label="lm-eval", log_file="lm_eval.log", executable="lm_eval",
    prepare=_prepare_lm_eval, parse=parse_lm_eval_output,
    output_errors=(LmEvalOutputError,),
    prepare_errors=(ValueError,),  # a path lm-eval's --model_args cannot carry
)
OPENCOMPASS = Backend(
    name="opencompass", label="OpenCompass", log_file="opencompass.log", executable="opencompass",
    prepare=_prepare_opencompass, parse=parse_opencompass_output,
    output_errors=(OpenCompassOutputError,),
    prepare_errors=(OpenCompassUnsupported,),  # e.g. acc_norm
)

REGISTRY: dict[str, Backend] = {backend.name: backend for backend in (LM_EVAL, OPENCOMPASS)}

# Derived from the backends: for log files, messages and what the service catches.
EXECUTABLES: dict[str, str] = {name: b.executable for name, b in REGISTRY.items()}
LABELS: dict[str, str] = {name: b.label for name, b in REGISTRY.items()}
LOG_FILES: dict[str, str] = {name: b.log_file for name, b in REGISTRY.items()}
# What a run's output can fail with, whichever backend: the service reports it, never crashes.
OUTPUT_ERRORS: tuple[type[Exception], ...] = tuple(e for b in REGISTRY.values() for e in b.output_errors)
# What prepare_run can fail with before anything runs: a missing backend, or one of a backend's own.
PREPARE_ERRORS: tuple[type[Exception], ...] = (
    BackendUnavailable, *(e for b in REGISTRY.values() for e in b.prepare_errors)
)


def backend_of(name: str) -> Backend:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown benchmark backend {name!r}; choose one of {', '.join(BACKENDS)}") from None


def opencompass_bin(settings: Any = None) -> Path | None:
    """The OpenCompass env's bin folder: the ``opencompass_bin`` setting, else the repository's
    ``.opencompass/bin`` when it exists (as ``toolchain_path`` does for ``.toolchain``), else None."""
    configured = getattr(settings, "opencompass_bin", None)
    if configured is not None:
        return Path(configured)
    return REPO_OPENCOMPASS_BIN if REPO_OPENCOMPASS_BIN.is_dir() else None


def resolve_executable(backend: str, settings: Any = None) -> str:
    """What argv[0] is for ``backend``. lm-eval stays a bare name (the runner's PATH has the
    toolchain); OpenCompass gets an absolute path, since its env is not on that PATH."""
    name = backend_of(backend).executable
    if backend == "lm-eval":
        return name
    folder = opencompass_bin(settings)
    if folder is not None:
        path = folder / name
        if not path.exists():
            raise BackendUnavailable(
                f"bench_backend is opencompass but {path} does not exist: run deploy/opencompass/install.sh "
                f"{folder.parent} or point FTBUS_OPENCOMPASS_BIN at an OpenCompass env's bin folder"
            )
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise BackendUnavailable(
            "bench_backend is opencompass but no OpenCompass env was found (no opencompass_bin setting, no "
            f"{REPO_OPENCOMPASS_BIN}, no opencompass on PATH): run deploy/opencompass/install.sh"
        )
    return found


def prepare_run(
    backend: str,
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    run_dir: Path,
    *,
    model: ModelSelection,
    device: str,
    settings: Any = None,
    executable: str | Path | None = None,
    inference: InferenceConfig | None = None,
) -> PreparedRun:
    """Write the backend's inputs under ``run_dir``; return what to run there (``cwd=run_dir``).

    ``executable`` overrides the resolved argv[0] (tests); ``settings`` supplies ``opencompass_bin``.
    """
    harness = backend_of(backend)
    exe = str(executable) if executable is not None else resolve_executable(backend, settings)
    return harness.prepare(spec, manifest, run_dir, exe, model, device, inference)


def parse_run(backend: str, output_dir: Path, spec: BenchmarkSpec, manifest: SplitManifest,
              max_error_samples: int = 10, seed: int = 0) -> BenchmarkScores:
    """The run's ``BenchmarkScores``; raises one of ``OUTPUT_ERRORS`` when the output is incomplete."""
    return backend_of(backend).parse(output_dir, spec, manifest, max_error_samples, seed)
