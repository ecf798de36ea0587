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
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

from services.benchmark.lmeval import (
    LmEvalOutputError,
    ModelSelection,
    parse_lm_eval_output,
    prepare_lm_eval_run,
)
from services.benchmark.opencompass import (
    OpenCompassOutputError,
    OpenCompassUnsupported,
    parse_opencompass_output,
    prepare_opencompass_run,
)
from services.benchmark.registry import BenchmarkSpec
from services.benchmark.splits import SplitManifest
from shared.events import BenchmarkScores

Backend = Literal["lm-eval", "opencompass"]
BACKENDS: tuple[str, ...] = get_args(Backend)

# The executable each backend runs, by name (resolved as the module docstring says).
EXECUTABLES: dict[str, str] = {"lm-eval": "lm_eval", "opencompass": "opencompass"}
# For log files and error messages.
LABELS: dict[str, str] = {"lm-eval": "lm-eval", "opencompass": "OpenCompass"}
LOG_FILES: dict[str, str] = {"lm-eval": "lm_eval.log", "opencompass": "opencompass.log"}

REPO_OPENCOMPASS_BIN = Path(__file__).resolve().parents[2] / ".opencompass" / "bin"

# What a run's output can fail with, whichever backend: the service reports it, never crashes.
OUTPUT_ERRORS: tuple[type[Exception], ...] = (LmEvalOutputError, OpenCompassOutputError)


class BackendUnavailable(RuntimeError):
    """The selected backend is not installed where the settings say; the message says how to fix it."""


# What prepare_run can fail with before anything runs: a missing backend, a benchmark the backend
# cannot score (OpenCompassUnsupported, e.g. acc_norm), a path lm-eval cannot carry (ValueError).
PREPARE_ERRORS: tuple[type[Exception], ...] = (BackendUnavailable, OpenCompassUnsupported, ValueError)


class PreparedRun(NamedTuple):
    """Unpacks as ``argv, env, output_dir``."""

    argv: list[str]
    env: dict[str, str]
    output_dir: Path


def _check(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown benchmark backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


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
    name = EXECUTABLES[_check(backend)]
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
) -> PreparedRun:
    """Write the backend's inputs under ``run_dir``; return what to run there (``cwd=run_dir``).

    ``executable`` overrides the resolved argv[0] (tests); ``settings`` supplies ``opencompass_bin``.
    """
    exe = str(executable) if executable is not None else resolve_executable(backend, settings)
    if _check(backend) == "opencompass":
        oc = prepare_opencompass_run(spec, manifest, run_dir, opencompass=exe, model=model, device=device)
        return PreparedRun(oc.argv, oc.env, oc.output_dir)
    lm = prepare_lm_eval_run(spec, manifest, run_dir, lm_eval=exe, model=model, device=device)
    return PreparedRun(lm.argv, lm.env, lm.output_dir)


def parse_run(
    backend: str,
    output_dir: Path,
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    max_error_samples: int = 10,
    seed: int = 0,
) -> BenchmarkScores:
    """The run's ``BenchmarkScores``; raises one of ``OUTPUT_ERRORS`` when the output is incomplete."""
    if _check(backend) == "opencompass":
        return parse_opencompass_output(output_dir, spec, manifest, max_error_samples, seed)
    return parse_lm_eval_output(output_dir, spec, manifest, max_error_samples, seed)
