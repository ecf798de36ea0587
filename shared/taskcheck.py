"""Is a task's base model, benchmark and every dataset known? Checked before any work is done.

A typo in a benchmark name must not cost a training run: the client refuses it at submit time when
it can see the assets folder (the submitter may not have one), and the data stage's pre-check
refuses it in any case, before process_data.py runs. Both answer with the names that do exist.
"""

from __future__ import annotations

from pathlib import Path

from shared.events import TaskSpec
from shared.modelpaths import available_models
from shared.paths import UnsafePath, validate_relative_path

BENCHMARK_DESCRIPTOR = "benchmark.yaml"  # as evaluation/registry.py reads it


class UnknownAsset(ValueError):
    """The task names a model, benchmark or dataset that the assets folder does not hold."""


def available_benchmarks(assets_dir: Path) -> list[str]:
    root = assets_dir / "benchmarks"
    return sorted(p.name for p in root.iterdir() if (p / BENCHMARK_DESCRIPTOR).is_file()) if root.is_dir() else []


def available_datasets(assets_dir: Path) -> list[str]:
    root = assets_dir / "datasets"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def assets_visible(assets_dir: Path) -> bool:
    """Whether this machine has an assets folder to check against (a submitter may not)."""
    return any((assets_dir / sub).is_dir() for sub in ("models", "benchmarks", "datasets"))


def _plain(name: str, what: str) -> str | None:
    try:
        validate_relative_path(name)
    except UnsafePath as exc:
        return f"{what} {name!r} is not a plain name: {exc}"
    if name.strip("/") in {"", ".", ".."}:
        return f"{what} {name!r} is not a plain name"
    if "/" in name.strip("/"):
        return f"{what} {name!r} is not a plain name: it holds a '/'"
    return None


def _listing(names: list[str]) -> str:
    return ", ".join(names) or "none (run `ftbus assets init`)"


def model_problem(name: str, assets_dir: Path) -> str | None:
    """Why base model ``name`` is unknown, or None. An absolute path is left to the trainer (it may
    exist only on GPU hosts)."""
    if Path(name).is_absolute():
        return None
    problem = _plain(name, "base model")
    if problem is None and not (assets_dir / "models" / name).is_dir():
        problem = (f"unknown base model {name!r} (not under {assets_dir / 'models'}); "
                   f"available models: {_listing(available_models(assets_dir))}")
    return problem


def benchmark_problem(name: str, assets_dir: Path) -> str | None:
    problem = _plain(name, "benchmark")
    if problem is None and not (assets_dir / "benchmarks" / name / BENCHMARK_DESCRIPTOR).is_file():
        problem = (f"unknown benchmark {name!r} (not under {assets_dir / 'benchmarks'}); "
                   f"available benchmarks: {_listing(available_benchmarks(assets_dir))}")
    return problem


def dataset_problem(name: str, assets_dir: Path) -> str | None:
    problem = _plain(name, "declared dataset")
    if problem is None and not (assets_dir / "datasets" / name).is_dir():
        problem = (f"declared dataset {name!r} is not under {assets_dir / 'datasets'}; "
                   f"available: {', '.join(available_datasets(assets_dir)) or 'none'}")
    return problem


def task_problems(task: TaskSpec, assets_dir: Path) -> list[str]:
    """Everything unknown in ``task`` (base model, benchmark, each dataset), with the known names."""
    found = [model_problem(task.base_model, assets_dir), benchmark_problem(task.benchmark, assets_dir)]
    found += [dataset_problem(name, assets_dir) for name in task.involving_datasets]
    return [problem for problem in found if problem]


def task_problem(task: TaskSpec, assets_dir: Path) -> str | None:
    """The first of :func:`task_problems`; None when everything exists."""
    problems = task_problems(task, assets_dir)
    return problems[0] if problems else None


def check_task(task: TaskSpec, assets_dir: Path) -> None:
    """Raise :class:`UnknownAsset` when the task names something the assets folder lacks."""
    problem = task_problem(task, assets_dir)
    if problem:
        raise UnknownAsset(problem)
