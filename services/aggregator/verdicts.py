"""Building verdicts and reports from the aggregator's record. Pure functions, no I/O."""

from __future__ import annotations

from shared.events import (
    FailedStage,
    JudgeResult,
    Report,
    Verdict,
    VerdictResult,
)
from shared.records import RequestRecord, StageTiming
from shared.stagespec import StageSpec


def resume_sentence(train: StageTiming | None) -> str | None:
    """What the verdict says of a training that a lost worker left behind, if any."""
    if train is None:
        return None
    if train.resumed_from_step is not None:
        return (f"Training was interrupted (attempt {train.attempts}) and resumed from step "
                f"{train.resumed_from_step}, its latest saved checkpoint.")
    if train.resume_note:
        return f"Training was interrupted and not resumed: {train.resume_note}."
    return None


def verdict_from_judge(judge: JudgeResult, train: StageTiming | None = None) -> Verdict:
    """``train``: the record's training timing, whose resume the execution text reports."""
    fb = judge.feedback
    resumed = resume_sentence(train)
    return Verdict(
        request_id=judge.request_id,
        status="completed",
        execution=f"{fb.execution}\n{resumed}" if resumed else fb.execution,
        return_checking=fb.return_checking,
        code=fb.code,
        final_decision=fb.final_decision,
        raw_execution=judge.raw_execution,
        failed_stage=judge.failed_stage,
        result=judge.result,
        judge=judge.judge,
        artifacts=judge.artifacts,
        sandbox=judge.sandbox,
        llm_usage=judge.llm_usage,
    )


def error_verdict(record: RequestRecord, row: StageSpec | None, reason: str) -> Verdict:
    """An infrastructure failure in ``row``'s stage (None: unknown): not the candidate's fault, and said so."""
    words = row.words if row is not None else "unknown"
    return Verdict(
        request_id=record.request_id,
        status="error",
        execution=f"ERROR in the {words} stage (infrastructure, not the candidate): {reason}",
        return_checking="No benchmark result: the evaluation could not finish.",
        code="Nothing to change in the candidate for this error. Resubmit it; if the error repeats, "
        "operators should inspect the dead-letter stream (ftbus.dlq) and the worker logs for this request.",
        final_decision=False,
        failed_stage=row.record_name if row is not None else FailedStage.aggregate,
        result=_partial_result(record),
    )


def cancelled_verdict(record: RequestRecord, reason: str, row: StageSpec | None) -> Verdict:
    """``row``: the stage the request was in, None before any started."""
    where = f"during {row.words}" if row is not None else "before any stage started"
    return Verdict(
        request_id=record.request_id,
        status="cancelled",
        execution=f"CANCELLED {where}: {reason}",
        return_checking="No benchmark result: the request was cancelled.",
        code="The candidate was not evaluated.",
        final_decision=False,
        failed_stage=row.record_name if row is not None else FailedStage.cancelled,
        result=_partial_result(record),
    )


def _partial_result(record: RequestRecord) -> VerdictResult:
    return record.judge.result if record.judge else VerdictResult()


def build_report(record: RequestRecord) -> Report:
    assert record.verdict is not None
    timings = {
        stage: timing.duration_s
        for stage, timing in record.stages.items()
        if timing.duration_s is not None
    }
    return Report(
        **record.verdict.model_dump(exclude={"emitted_at", "schema_version"}),
        benchmark_test=record.benchmark_test,
        benchmark_test_baseline=record.benchmark_test_baseline,
        benchmark_test_error=record.benchmark_test_error,
        timings=timings,  # type: ignore[arg-type]
    )


def report_ready(record: RequestRecord) -> bool:
    if record.verdict is None or record.report is not None:
        return False
    if record.verdict.status != "completed":
        return True
    expects_test = record.judge.expects_test if record.judge else False
    return record.test_received or not expects_test
