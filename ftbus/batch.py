"""What the batch commands show: `ftbus submit` with several workspaces or a JSONL of tasks (one
progress view for all, then a summary), `ftbus ls` (a table of requests) and `ftbus logs`.

Rendering only: the commands themselves are in ftbus/cli_*.py, the calls in ftbus/client.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ftbus.client import EvalTask
from ftbus.stages import LABELS
from shared.events import Progress as ProgressEvent
from shared.events import Verdict
from shared.records import RequestStatusView

STAGE_LABELS = LABELS  # the pipeline's order and labels (ftbus/stages.py)


class TaskFileError(ValueError):
    """A JSONL task file that cannot be read; the message names the line."""


def load_tasks(path: Path, defaults: dict[str, Any]) -> list[EvalTask]:
    """One EvalTask per non-empty line of ``path``: ``{"workspace": ..., "base_model": ...,
    "benchmark": ..., "description": ..., "datasets": [...], "timeouts": {...}}``. Keys a line
    lacks come from ``defaults`` (the command-line options); a relative workspace is relative to
    the file's folder."""
    tasks: list[EvalTask] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskFileError(f"cannot read {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise TaskFileError(f"{path}:{number}: a line must be a JSON object")
        merged = {k: v for k, v in defaults.items() if v not in (None, [], "")} | raw
        if "workspace" in merged:
            ws = Path(str(merged["workspace"])).expanduser()
            merged["workspace"] = ws if ws.is_absolute() else Path(path).resolve().parent / ws
        try:
            tasks.append(EvalTask.model_validate(merged))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors())
            raise TaskFileError(f"{path}:{number}: {problems}") from None
    if not tasks:
        raise TaskFileError(f"{path} holds no tasks")
    return tasks


class BatchView:
    """One live row per request: its stage, a bar for training steps, loss, then its decision."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.fields[name]}"),
            TextColumn("{task.fields[stage]:<9}"),
            BarColumn(bar_width=24),
            TextColumn("{task.completed:>4.0f}/{task.total:<4.0f}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.rows: dict[str, TaskID] = {}
        self.names: dict[str, str] = {}
        self.width = 0

    def __enter__(self) -> BatchView:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def add(self, request_id: str, label: str) -> None:
        name = f"{request_id}  {label}"
        self.width = max(self.width, len(name))
        self.names[request_id] = name
        self.rows[request_id] = self.progress.add_task("", total=1, name="", stage="queued", status="")
        for rid, task in self.rows.items():  # keep the columns aligned as names arrive
            self.progress.update(task, name=escape(self.names[rid].ljust(self.width)))

    def update(self, event: ProgressEvent) -> None:
        task = self.rows.get(event.request_id)
        if task is None or event.stage not in STAGE_LABELS:
            return
        stage = STAGE_LABELS[event.stage]
        status = event.state
        if event.loss is not None:
            status = f"loss {event.loss:.4f}"
        elif event.message:
            status = f"{event.state}: {event.message}"[:50]
        if event.step is not None and event.total:
            self.progress.update(task, stage=stage, total=event.total, completed=event.step, status=escape(status))
        else:
            self.progress.update(task, stage=stage, status=escape(status))

    def done(self, verdict: Verdict) -> None:
        task = self.rows.get(verdict.request_id)
        if task is None:
            return
        total = self.progress.tasks[task].total or 1
        self.progress.update(task, stage="verdict", completed=total, status=decision_text(verdict, markup=True))


def decision_text(verdict: Verdict, markup: bool = False) -> str:
    if verdict.status != "completed":
        text = verdict.status + (f" ({verdict.failed_stage})" if verdict.failed_stage else "")
        colour = "red"
    else:
        text = f"final_decision {verdict.final_decision}" + (
            f" ({verdict.failed_stage})" if verdict.failed_stage else "")
        policy = verdict.judge.policy if verdict.judge is not None else None
        if verdict.final_decision and policy not in (None, "better"):
            text += f" (judge_policy {policy}: not shown better)"
        elif verdict.result.decision is not None and not verdict.final_decision:
            text += f" ({verdict.result.decision.answer})"
        colour = "green" if verdict.final_decision else "yellow"
    return f"[{colour}]{escape(text)}[/]" if markup else text


def summary_table(tasks: Sequence[EvalTask], verdicts: Sequence[Verdict]) -> Table:
    table = Table(title=f"{len(verdicts)} verdicts")
    table.add_column("request", no_wrap=True)
    for col in ("workspace", "benchmark", "decision", "validation", "base model", "difference"):
        table.add_column(col, overflow="fold")
    for task, verdict in zip(tasks, verdicts, strict=True):
        b = verdict.result.baseline
        table.add_row(
            verdict.request_id, escape(str(task.workspace)), escape(task.benchmark), decision_text(verdict, True),
            _num(b.candidate_value if b else None), _num(b.baseline_value if b else None),
            f"{b.difference:+.4f}" if b and b.difference is not None else "",
        )
    return table


SUMMARY_COLUMNS = ("request", "workspace", "benchmark", "decision", "validation", "base model", "difference")


def summary_rows(tasks: Sequence[EvalTask], verdicts: Sequence[Verdict]) -> list[list[str]]:
    """:func:`summary_table` as plain cells, for a pipe."""
    rows = []
    for task, verdict in zip(tasks, verdicts, strict=True):
        b = verdict.result.baseline
        rows.append([verdict.request_id, str(task.workspace), task.benchmark, decision_text(verdict),
                     _num(b.candidate_value if b else None), _num(b.baseline_value if b else None),
                     f"{b.difference:+.4f}" if b and b.difference is not None else ""])
    return rows


def batch_exit_code(verdicts: Sequence[Verdict]) -> int:
    """2 if any verdict is an error (or cancelled), else 1 if any final_decision is false, else 0."""
    if any(v.status != "completed" for v in verdicts):
        return 2
    return 0 if all(v.final_decision for v in verdicts) else 1


def age(view: RequestStatusView, now: datetime | None = None) -> float | None:
    """Seconds since the request was submitted."""
    if view.submitted_at is None:
        return None
    return ((now or datetime.now(UTC)) - view.submitted_at).total_seconds()


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def requests_table(views: Sequence[RequestStatusView], now: datetime | None = None) -> Table:
    table = Table(title=f"{len(views)} requests")
    for col in ("request", "status", "stage", "age"):  # never shortened: ids are for copying
        table.add_column(col, no_wrap=True)
    for col in ("decision", "benchmark", "base model"):
        table.add_column(col, overflow="fold")
    for view in views:
        decision = "" if view.final_decision is None else str(view.final_decision)
        if view.failed_stage:
            decision += f" ({view.failed_stage})"
        table.add_row(
            # A finished request's last stage says nothing: where it failed is in the decision.
            view.request_id, view.status, "" if view.terminal else (view.stage or ""), human_age(age(view, now)),
            decision.strip(),
            escape(view.task.benchmark) if view.task else "", escape(view.task.base_model) if view.task else "",
        )
    return table


REQUEST_COLUMNS = ("request", "status", "stage", "age", "decision", "benchmark", "base model")
WIDE_COLUMNS = (*REQUEST_COLUMNS, "submitted", "failed stage", "datasets", "runs", "description")


def request_rows(views: Sequence[RequestStatusView], now: datetime | None = None, *, wide: bool = False
                 ) -> list[list[str]]:
    """``ftbus ls`` as plain cells (no markup): :data:`REQUEST_COLUMNS`, or :data:`WIDE_COLUMNS`."""
    rows = []
    for view in views:
        decision = "" if view.final_decision is None else str(view.final_decision)
        if view.failed_stage:
            decision += f" ({view.failed_stage})"
        row = [view.request_id, view.status, "" if view.terminal else (view.stage or ""), human_age(age(view, now)),
               decision.strip(), view.task.benchmark if view.task else "", view.task.base_model if view.task else ""]
        if wide:
            task = view.task
            row += [view.submitted_at.isoformat(timespec="seconds") if view.submitted_at else "",
                    view.failed_stage or "", ",".join(task.involving_datasets) if task else "",
                    str(task.num_runs or "") if task else "", task.description if task else ""]
        rows.append(row)
    return rows


def requests_json(views: Sequence[RequestStatusView], now: datetime | None = None) -> str:
    return json.dumps([
        {"request_id": v.request_id, "status": v.status, "stage": v.stage, "age_s": age(v, now),
         "final_decision": v.final_decision, "failed_stage": v.failed_stage,
         "submitted_at": v.submitted_at.isoformat() if v.submitted_at else None,
         "task": v.task.model_dump(mode="json") if v.task else None}
        for v in views
    ])


def progress_line(event: ProgressEvent) -> str:
    step = f" step {event.step}/{event.total}" if event.step is not None else ""
    loss = f" loss {event.loss:.4f}" if event.loss is not None else ""
    return f"[{event.stage}] {event.state}{step}{loss} {event.message}".rstrip()


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


# ---------------------------------------------------------------------- the commands' bodies


async def submit_batch(settings: Any, tasks: Sequence[EvalTask], *, wait: bool, as_json: bool,
                       out: Console, err: Console) -> int:
    """`ftbus submit` with several workspaces or --tasks: submit all, then (with wait) one progress
    view until every verdict is in, and a summary. Exit code: see batch_exit_code."""
    from ftbus.client import Client
    from shared.artifacts import ArtifactError
    from shared.paths import UnsafePath
    from shared.taskcheck import UnknownAsset

    async with Client(settings=settings) as client:
        rids: list[str] = []
        for task in tasks:
            try:
                rids.append(await client.submit_task(task))
            except (FileNotFoundError, UnsafePath, ArtifactError, UnknownAsset) as exc:
                err.print(f"[red]error:[/] {escape(str(task.workspace))}: {escape(str(exc))}")
                if rids:
                    err.print(f"already submitted: {' '.join(rids)}")
                return 2
        if not wait:
            if as_json:
                print(json.dumps([{"request_id": r, "workspace": str(t.workspace)} for r, t in zip(rids, tasks,
                                                                                                  strict=True)]))
            else:
                for rid in rids:
                    out.print(rid)
            return 0
        err.print(f"submitted {len(rids)} requests")
        with BatchView(err) as view:
            for rid, task in zip(rids, tasks, strict=True):
                view.add(rid, task.workspace.name)

            async def one(rid: str) -> Verdict:
                verdict = await client.wait(rid, on_progress=view.update)
                view.done(verdict)
                return verdict

            verdicts = list(await asyncio.gather(*(one(rid) for rid in rids)))
        if as_json:
            print(json.dumps([v.model_dump(mode="json") for v in verdicts]))
        elif out.is_terminal:
            out.print(summary_table(tasks, verdicts))
        else:
            from ftbus.cli_common import plain_columns

            print(f"{len(verdicts)} verdicts")
            sys.stdout.write(plain_columns(SUMMARY_COLUMNS, summary_rows(tasks, verdicts)))
        return batch_exit_code(verdicts)


async def ls_main(settings: Any, statuses: Sequence[str], limit: int | None, output: str, out: Console,
                  err: Console | None = None) -> int:
    """``output``: table (rich on a terminal, plain columns in a pipe), plain, wide or json (ftbus/cli_common.py)."""
    from ftbus.cli_common import plain_columns
    from ftbus.client import Client

    async with Client(settings=settings) as client:
        views = await client.requests(list(statuses) if statuses else None)
    if limit:
        views = views[-limit:]
    now = datetime.now(UTC)
    if output == "json":
        print(requests_json(views, now))
        return 0
    if not views:
        if err is not None:
            err.print(f"no requests with status {', '.join(statuses)} (`ftbus ls` lists them all)" if statuses else
                      "no requests yet: submit one with `ftbus submit WORKSPACE --base-model MODEL --benchmark "
                      "BENCHMARK` (`ftbus benchmarks ls` lists the benchmarks)")
        return 0
    if output == "table" and out.is_terminal:
        out.print(requests_table(views, now))
        return 0
    wide = output == "wide"
    sys.stdout.write(plain_columns(WIDE_COLUMNS if wide else REQUEST_COLUMNS, request_rows(views, now, wide=wide)))
    sys.stdout.flush()
    return 0


async def logs_main(settings: Any, request_id: str, stage: str | None, follow: bool,
                    out: Console, err: Console, *, as_json: bool = False) -> int:
    """Print a stage's log (every stage's without --stage); --follow waits for stages still
    running, printing their progress on stderr meanwhile. Exit 2 when no log was printed.
    ``as_json``: one object on stdout at the end, ``{"request_id", "logs": {stage: text or null}}``."""
    from ftbus.client import LOG_FILES, Client

    # Without --stage: every pipeline stage that leaves a log, in the table's order (ftbus/stages.py).
    stages = [stage] if stage else [name for name in STAGE_LABELS if name in LOG_FILES]
    printed = 0
    found: dict[str, str | None] = {}
    async with Client(settings=settings) as client:
        if await client.status(request_id) is None:
            err.print(f"[red]error:[/] unknown request {escape(request_id)}")
            return 2
        for name in stages:
            header = f"==> {request_id} {name}: {LOG_FILES[name]} <=="
            text: str | None = None
            if follow:
                async for item in client.follow_log(request_id, name):
                    if isinstance(item, str):
                        text = item
                    else:
                        err.print(escape(progress_line(item)), highlight=False)
            else:
                text = await client.log(request_id, name)
            found[name] = text
            if text is None:
                err.print(f"no {name} log for {escape(request_id)}"
                          + ("" if follow else " (yet: stages upload their log when they finish; try --follow)"))
                continue
            if as_json:
                printed += 1
                continue
            if len(stages) > 1:
                print(header, flush=True)
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
            sys.stdout.flush()
            printed += 1
    if as_json:
        print(json.dumps({"request_id": request_id, "logs": found}))
    return 0 if printed else 2
