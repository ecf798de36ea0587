"""Live progress for `ftbus submit --wait`: one line per stage, a bar for training steps."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ftbus.stages import LABELS
from shared.events import Progress as ProgressEvent
from shared.events import Stage

# The stages that show a bar, in pipeline order (the aggregator's work is the verdict itself).
STAGE_LABELS = {stage: label for stage, label in LABELS.items() if stage != Stage.aggregate}


class ProgressView:
    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.fields[label]:<10}"),
            BarColumn(),
            TextColumn("{task.completed:>5.0f}/{task.total:<5.0f}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressView:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def update(self, event: ProgressEvent) -> None:
        stage = event.stage
        if stage not in STAGE_LABELS:
            return
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task("", total=1, label=STAGE_LABELS[stage], status="")
        task = self.tasks[stage]
        status = event.state
        if event.loss is not None:
            # The trainer's own ETA (from trainer_log.jsonl), not a guess from bar speed.
            eta = f"  eta {_clock(event.eta_s)}" if event.eta_s is not None else ""
            status = f"loss {event.loss:.4f}{eta}"
        elif event.message:
            status = f"{event.state}: {event.message}"[:60]
        if event.step is not None and event.total:
            self.progress.update(task, total=event.total, completed=event.step, status=status)
        elif event.state in ("finished", "failed"):
            total = self.progress.tasks[self.tasks[stage]].total or 1
            self.progress.update(task, completed=total, status=event.state)
        else:
            self.progress.update(task, status=status)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
