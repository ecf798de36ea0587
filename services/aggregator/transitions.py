"""The record's transitions: what each event does to a request's record. Pure functions, no I/O.

Each takes the record (read from the requests bucket) and an event, and changes the record in
place; the store writes it (services/aggregator/store.py). A transition that returns False changed
nothing, and nothing is written. The first verdict claimed wins, whatever comes later.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.aggregator.verdicts import (
    build_report,
    cancelled_verdict,
    error_verdict,
    report_ready,
    verdict_from_judge,
)
from shared.events import (
    BenchResult,
    CancelRequested,
    DeadLetter,
    EvalRequested,
    JudgeResult,
    Progress,
    StageResult,
    StageRun,
    TrainResult,
    Verdict,
)
from shared.records import RequestRecord, StageTiming
from shared.stagespec import StageSpec

Transition = Callable[[RequestRecord], "bool | None"]


def claim(record: RequestRecord, verdict: Verdict) -> None:
    """Set the verdict unless one is already claimed: the first writer wins, forever."""
    if record.verdict is not None:
        return
    record.verdict = verdict
    record.status = verdict.status
    record.final_decision = verdict.final_decision
    record.failed_stage = verdict.failed_stage


def complete_report(record: RequestRecord) -> None:
    """Build the report once the verdict is claimed and the hidden test split is in (or not awaited)."""
    if report_ready(record):
        record.report = build_report(record)


def owed(record: RequestRecord) -> list[str]:
    """The flags of what the record holds but has not published yet: ``verdict_published``,
    ``report_published`` (the outbox publishes them, then sets them)."""
    return [flag for flag, held in (("verdict_published", record.verdict), ("report_published", record.report))
            if held is not None and not getattr(record, flag)]


def _timing(record: RequestRecord, stage: str) -> StageTiming:
    return record.stages.setdefault(stage, StageTiming())


def _ran(timing: StageTiming, run: StageRun | None) -> None:
    """A stage's start and attempt as its result tells them (its progress messages may be lost).
    The earliest start stands: a retry's start is not the stage's."""
    if run is None:
        return
    timing.attempts = max(timing.attempts, run.attempt)
    if timing.started_at is None or run.started_at < timing.started_at:
        timing.started_at = run.started_at


def on_request(record: RequestRecord, event: EvalRequested) -> None:
    record.task = event.context.task
    record.submitted_at = event.context.submitted_at


def on_stage_result(record: RequestRecord, event: StageResult, row: StageSpec, judge: str) -> None:
    """A stage's result (``row``'s): its timing, and the stage the request is in now: the next one,
    or ``judge`` (who judges every failure)."""
    timing = _timing(record, row.stage)
    _ran(timing, event.runs.get(row.record_name))
    timing.finished_at = event.emitted_at
    timing.ok = event.ok
    if isinstance(event, TrainResult):
        timing.resumed_from_step = event.train.resumed_from_step
        timing.resume_note = event.train.resume_note
    if record.verdict is None:
        record.status = "running"
        following = row.next if event.ok else judge
        record.stage = str(following) if following is not None else str(row.stage)


def on_test(record: RequestRecord, event: BenchResult) -> None:
    record.test_received = True
    record.benchmark_test = event.benchmark
    record.benchmark_test_baseline = event.baseline
    record.benchmark_test_error = None if event.ok else (event.error or "the test split failed")


def on_judge(record: RequestRecord, event: JudgeResult, row: StageSpec) -> None:
    timing = _timing(record, row.stage)
    _ran(timing, event.runs.get(row.record_name))
    timing.finished_at = event.emitted_at
    timing.ok = True
    record.judge = event
    claim(record, verdict_from_judge(event, record.stages.get("train")))


def on_cancel(record: RequestRecord, event: CancelRequested, row: StageSpec | None) -> None:
    """``row``: the stage the request is in, if any."""
    record.cancel_requested = True
    claim(record, cancelled_verdict(record, event.reason, row))


def on_dead_letter(record: RequestRecord, event: DeadLetter, row: StageSpec | None) -> None:
    """``row``: the stage the letter names, else the one the request is in."""
    if row is not None and event.deliveries:  # how often the stage tried: its progress may not all be written
        timing = _timing(record, row.stage)
        timing.attempts = max(timing.attempts, event.deliveries)
    claim(record, error_verdict(record, row, event.reason))


def on_progress(record: RequestRecord, event: Progress) -> bool:
    if record.terminal:
        return False  # nothing to write
    stage = event.stage
    timing = _timing(record, stage)
    if event.attempt is not None:
        timing.attempts = max(timing.attempts, event.attempt)
    timing.started_at = timing.started_at or event.emitted_at  # the first progress written tells it
    record.status = "running"
    record.stage = stage
    record.progress = event
    return True


def on_stuck(record: RequestRecord, row: StageSpec | None, silent_s: int) -> None:
    claim(record, error_verdict(record, row, f"no progress for {silent_s} s: the request was stuck"))


def give_up_on_test(record: RequestRecord) -> bool:
    if record.report is not None or record.test_received:
        return False
    record.test_received = True
    record.benchmark_test_error = "the hidden test split's result never arrived"
    return True


def unchanged(record: RequestRecord) -> bool:
    """No change of its own: what the record owes is published (a redelivery, the sweeper)."""
    return False


def stage_of_consumer(prefix: str, consumer: str) -> str | None:
    """The stage whose durable consumer is named ``consumer`` (``<prefix>-<stage>[-...]``); None
    for a consumer that is not a stage's."""
    if not consumer.startswith(f"{prefix}-"):
        return None
    name = consumer.removeprefix(f"{prefix}-").split("-")[0]
    return name if re.fullmatch(r"[a-z][a-z0-9_]{0,31}", name) else None
