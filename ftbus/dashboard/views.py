"""What the dashboard's pages show, computed from request records and consumer state.

Pure functions (no I/O): the NATS side (``state.py``) feeds them, the HTTP side (``app.py``)
serialises what they return. Every number on a page comes from one of these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ftbus.stages import LABELS
from shared.campaigns import CampaignRecord
from shared.events import (
    BenchmarkScores,
    CampaignCheck,
    JudgeResult,
    Progress,
    Report,
    Stage,
    Verdict,
    VerdictResult,
)
from shared.lanes import Lane
from shared.records import RequestRecord
from shared.statistics import PairedComparison

# The order of the stage cards and of the timeline: the pipeline's (ftbus/stages.py).
STAGE_ORDER: tuple[str, ...] = tuple(LABELS)

# Logs a request may have, and which store holds them ("private" = the hidden test split's store).
LOG_FILES: tuple[tuple[str, str], ...] = (
    ("data_processing.log", "artifacts"),
    ("training.log", "artifacts"),
    ("benchmark-validation.log", "artifacts"),
    ("benchmark-baseline-validation.log", "artifacts"),
    ("benchmark-test.log", "private"),
    ("benchmark-baseline-test.log", "private"),
)


# ---------------------------------------------------------------------- stage cards


@dataclass
class StageStats:
    """One stage's durable consumer, as the server reports it (``$JS.API.CONSUMER.INFO``)."""

    stage: str
    consumer: str
    pending: int = 0  # matching messages not yet delivered to any worker
    in_flight: int = 0  # delivered, not yet acked (being worked on)
    redeliveries: int = 0  # messages delivered more than once
    waiting: int = 0  # pull requests parked on the server: idle workers asking for work
    error: str | None = None

    @property
    def label(self) -> str:
        """The stage's name on the page: the pipeline table's label."""
        return LABELS.get(self.stage, self.stage)

    @property
    def workers(self) -> int:
        """Worker loops bound to the consumer: the idle ones wait in a pull request, the busy ones
        hold an unacked message. (A pull consumer has no subscription the server could count.)"""
        return self.waiting + self.in_flight

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "label": self.label,
            "consumer": self.consumer,
            "pending": self.pending,
            "in_flight": self.in_flight,
            "redeliveries": self.redeliveries,
            "waiting": self.waiting,
            "workers": self.workers,
            "error": self.error,
        }


def stage_stats_from_info(stage: str, consumer: str, info: Any, lanes: Sequence[Lane] | None = None) -> StageStats:
    """From nats-py's ``ConsumerInfo``, and a fair-share stage's ``lanes``: its requests wait there
    (the stage's consumer only hands them to its lanes, shared/lanes.py), so they count too."""
    lanes = lanes or ()
    return StageStats(
        stage=stage,
        consumer=consumer,
        pending=int(info.num_pending or 0) + sum(lane.waiting for lane in lanes),
        in_flight=int(info.num_ack_pending or 0) + sum(lane.working for lane in lanes),
        redeliveries=int(info.num_redelivered or 0),
        waiting=int(info.num_waiting or 0),
    )


# ---------------------------------------------------------------------- helpers on a record


def verdict_result(record: RequestRecord) -> VerdictResult | None:
    """The verdict's result once claimed, else the judge's (same content, a little earlier)."""
    if record.verdict is not None:
        return record.verdict.result
    if record.judge is not None:
        return record.judge.result
    return None


def hidden_test_scores(record: RequestRecord, report: Report | None = None) -> BenchmarkScores | None:
    if report is not None and report.benchmark_test is not None:
        return report.benchmark_test
    if record.report is not None and record.report.benchmark_test is not None:
        return record.report.benchmark_test
    return record.benchmark_test


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _task_fields(record: RequestRecord) -> dict[str, Any]:
    task = record.task
    return {
        "base_model": task.base_model if task else None,
        "benchmark": task.benchmark if task else None,
        "description": task.description if task else "",
        **decision_fields(record),
    }


def decision_fields(record: RequestRecord) -> dict[str, Any]:
    """What the decision pill says beside final_decision: the policy that made it (under any other
    than ``better`` an accepted candidate is not thereby better, and the pill says so) and the
    decision's answer (better, indistinguishable, worse)."""
    result = verdict_result(record)
    judge = record.verdict.judge if record.verdict is not None else (record.judge.judge if record.judge else None)
    decision = result.decision if result is not None else None
    return {"policy": judge.policy if judge is not None else None,
            "answer": decision.answer if decision is not None else None,
            "answer_summary": decision.summary if decision is not None else None}


def _progress_json(progress: Progress | None) -> dict[str, Any] | None:
    if progress is None:
        return None
    return {
        "stage": progress.stage,
        "state": progress.state,
        "step": progress.step,
        "total": progress.total,
        "loss": progress.loss,
        "eta_s": progress.eta_s,
        "message": progress.message,
        "at": iso(progress.emitted_at),
    }


# ---------------------------------------------------------------------- overview


def latest_progress(record: RequestRecord, seen: Progress | None) -> Progress | None:
    """The newer of the record's last progress (as the aggregator wrote it) and the last one
    the dashboard received itself."""
    if record.terminal:
        return None
    candidates = [p for p in (record.progress, seen) if p is not None]
    return max(candidates, key=lambda p: p.emitted_at) if candidates else None


def request_row(record: RequestRecord, seen: Progress | None = None) -> dict[str, Any]:
    """One line of the overview's request list (no test-split data)."""
    return {
        "request_id": record.request_id,
        "status": record.status,
        "stage": record.stage,
        **_task_fields(record),
        "submitted_at": iso(record.submitted_at),
        "updated_at": iso(record.updated_at),
        "final_decision": record.final_decision,
        "failed_stage": record.failed_stage,
        "progress": _progress_json(latest_progress(record, seen)),
    }


def _submitted_key(record: RequestRecord) -> tuple[str, str]:
    return (iso(record.submitted_at) or iso(record.updated_at) or "", record.request_id)


def overview(
    records: Iterable[RequestRecord],
    stages: Iterable[StageStats],
    dead_letters: int | None,
    connection: Mapping[str, Any],
    now: datetime,
    limit: int = 200,
    seen: Mapping[str, Progress] | None = None,
) -> dict[str, Any]:
    ordered = sorted(records, key=_submitted_key, reverse=True)
    counts: dict[str, int] = {}
    for record in ordered:
        counts[record.status] = counts.get(record.status, 0) + 1
    return {
        "now": now.isoformat(),
        "connection": dict(connection),
        "stages": [s.to_json() for s in stages],
        "dead_letters": dead_letters,
        "counts": counts,
        "total": len(ordered),
        "requests": [request_row(r, (seen or {}).get(r.request_id)) for r in ordered[:limit]],
    }


# ---------------------------------------------------------------------- request page


@dataclass
class LossBuffer:
    """Training loss points seen in progress events (the live curve), one per step."""

    points: dict[int, float] = field(default_factory=dict)
    total: int | None = None

    def add(self, progress: Progress) -> bool:
        if progress.stage != Stage.train or progress.step is None or progress.loss is None:
            return False
        if progress.total is not None:
            self.total = progress.total
        if self.points.get(progress.step) == progress.loss:
            return False
        self.points[progress.step] = progress.loss
        return True


def loss_curve(record: RequestRecord, live: LossBuffer | None) -> dict[str, Any]:
    """The complete loss history once training is over, else the points of the progress events."""
    result = verdict_result(record)
    history = result.training_metrics.loss_history if result else None
    if history is not None and history.train:
        return {
            "source": "history",
            "train": [{"step": p.step, "loss": p.loss} for p in history.train],
            "eval": [{"step": p.step, "loss": p.eval_loss} for p in history.eval],
            "total": None,
        }
    points = dict(live.points) if live else {}
    progress = record.progress
    if progress is not None and progress.stage == Stage.train and progress.step is not None \
            and progress.loss is not None:
        points.setdefault(progress.step, progress.loss)  # the record's last progress, if the dashboard missed it
    return {
        "source": "live" if points else "none",
        "train": [{"step": step, "loss": points[step]} for step in sorted(points)],
        "eval": [],
        "total": live.total if live and live.total else (progress.total if progress else None),
    }


def timeline(record: RequestRecord) -> list[dict[str, Any]]:
    start = record.submitted_at
    names = sorted(record.stages, key=lambda s: (STAGE_ORDER.index(s) if s in STAGE_ORDER else 99, s))
    rows = []
    for name in names:
        t = record.stages[name]
        offset = (t.started_at - start).total_seconds() if (start and t.started_at) else None
        end = t.finished_at or (None if record.terminal else record.updated_at)
        running_s = (end - t.started_at).total_seconds() if (t.started_at and end) else None
        rows.append({
            "stage": name,
            "attempts": t.attempts,
            "started_at": iso(t.started_at),
            "finished_at": iso(t.finished_at),
            "duration_s": t.duration_s,
            "elapsed_s": t.duration_s if t.duration_s is not None else running_s,
            "offset_s": offset,
            "ok": t.ok,
            "running": t.finished_at is None and not record.terminal and record.stage == name,
        })
    return rows


def _score_rows(candidate: BenchmarkScores, baseline: BenchmarkScores | None) -> list[dict[str, Any]]:
    rows = []
    for subset, metrics in candidate.accuracy_summary.items():
        for metric, value in metrics.items():
            base = baseline.accuracy_summary.get(subset, {}).get(metric) if baseline else None
            rows.append({
                "subset": subset,
                "metric": metric,
                "candidate": value,
                "baseline": base,
                "difference": (value - base) if base is not None else None,
            })
    return rows


def validation(result: VerdictResult | None) -> dict[str, Any] | None:
    if result is None or result.benchmark is None:
        return None
    bench, comparison = result.benchmark, result.baseline
    return {
        "primary_metric": bench.primary_metric,
        "scorer": bench.scorer,
        # Which protocol produced the numbers (docs/benchmarks.md, "Protocols").
        "protocol": bench.protocol,
        "notes": list(bench.notes),
        "higher_is_better": bench.higher_is_better,
        "candidate_value": bench.primary_value,
        "baseline_value": comparison.baseline_value if comparison else None,
        "difference": comparison.difference if comparison else None,
        "rows": _score_rows(bench, comparison.baseline if comparison else None),
        # The paired comparison with the base model on the same items, and its words (or why there is none).
        "paired": paired_json(comparison.paired) if comparison and comparison.paired else None,
        "summary": comparison.summary if comparison else None,
        # The decision (better / not distinguishable / worse than the base model, confirmed on the pool).
        "decision": result.decision.model_dump(mode="json") if result.decision is not None else None,
    }


def paired_json(paired: PairedComparison) -> dict[str, Any]:
    return {**paired.model_dump(mode="json"), "direction": paired.direction, "method": paired.method}


def hidden_test_view(scores: BenchmarkScores | None, error: str | None) -> dict[str, Any] | None:
    if scores is None and not error:
        return None
    rows = []
    if scores is not None:
        rows = [
            {"subset": subset, "metric": metric, "value": value}
            for subset, metrics in scores.accuracy_summary.items()
            for metric, value in metrics.items()
        ]
    return {
        "primary_metric": scores.primary_metric if scores else None,
        "primary_value": scores.primary_value if scores else None,
        "protocol": scores.protocol if scores else None,
        "rows": rows,
        "error": error,
    }


def request_detail(
    record: RequestRecord,
    *,
    live: LossBuffer | None = None,
    seen: Progress | None = None,
    verdict: Verdict | None = None,
    report: Report | None = None,
    logs: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Everything the request page draws. The only view with the hidden test split's scores."""
    verdict = report or verdict or record.report or record.verdict
    result = verdict.result if verdict is not None else verdict_result(record)
    judge_event = record.judge
    judge = verdict.judge if verdict is not None else (judge_event.judge if judge_event else None)
    feedback = None
    if verdict is not None:
        feedback = {"execution": verdict.execution, "return_checking": verdict.return_checking,
                    "code": verdict.code, "raw_execution": verdict.raw_execution}
    elif judge_event is not None:
        feedback = {**judge_event.feedback.model_dump(exclude={"final_decision"}),
                    "raw_execution": judge_event.raw_execution}
    test_error = (report.benchmark_test_error if report else None) or record.benchmark_test_error
    data_stats = result.data_stats if result else None
    # What the candidate's code ran under, and what its LLM calls spent: the verdict's, else the judge's.
    source: Verdict | JudgeResult | None = verdict if verdict is not None else judge_event
    llm_usage = source.llm_usage if source is not None else None
    return {
        "request_id": record.request_id,
        "status": record.status,
        "stage": record.stage,
        **_task_fields(record),
        "submitted_at": iso(record.submitted_at),
        "updated_at": iso(record.updated_at),
        "final_decision": record.final_decision,
        "failed_stage": record.failed_stage,
        "cancel_requested": record.cancel_requested,
        "terminal": record.terminal,
        "progress": _progress_json(latest_progress(record, seen)),
        "timeline": timeline(record),
        "loss": loss_curve(record, live),
        "validation": validation(result),
        "test": hidden_test_view(hidden_test_scores(record, report), test_error),
        "error_samples": [s.model_dump() for s in (result.benchmark.error_samples if result and result.benchmark
                                                    else [])],
        "feedback": feedback,
        "judge": judge.model_dump(mode="json") if judge else None,
        "data_stats": data_stats.model_dump(mode="json") if data_stats else None,
        "data_cached": bool(result and result.data_cached),
        "sandbox": source.sandbox if source is not None else None,
        "llm_usage": llm_usage.model_dump(mode="json", exclude={"calls"}) if llm_usage else None,
        "logs": list(logs),
        "campaign": _campaign_check_json(result.campaign if result else None),
    }


# ---------------------------------------------------------------------- campaigns


def _campaign_check_json(check: CampaignCheck | None) -> dict[str, Any] | None:
    """The request against its campaign's incumbent, as the judge decided it."""
    if check is None:
        return None
    return {"campaign": check.campaign, "index": check.index, "level": check.level, "incumbent": check.incumbent,
            "better": check.better, "accepted": check.accepted, "summary": check.summary,
            "paired": paired_json(check.paired) if check.paired else None}


def campaign_rows(campaigns: Iterable[CampaignRecord]) -> list[dict[str, Any]]:
    """The campaigns page: one row per campaign, the most recently judged first."""
    rows = [{"name": c.name, "benchmark": c.benchmark, "base_model": c.base_model, "incumbent": c.incumbent,
             "incumbents": c.accepted, "judged": c.judged, "tested": c.state.tests,
             "next_level": c.state.next_level(), "created_at": iso(c.created_at), "updated_at": iso(c.updated_at)}
            for c in campaigns]
    return sorted(rows, key=lambda r: (r["updated_at"] or "", r["name"]), reverse=True)


def campaign_detail(campaign: CampaignRecord) -> dict[str, Any]:
    """One campaign: its incumbent, the incumbents in order, and its last judged candidates (the record
    keeps RECENT_ENTRIES) with what each was compared with (the incumbent of its moment, or the base
    model), at which level, and the decision."""
    return {
        **campaign_rows([campaign])[0],
        "procedure": campaign.procedure,
        "alpha": campaign.state.alpha,
        "incumbent_history": [{"request_id": e.request_id, "judged_at": iso(e.judged_at), "index": e.index}
                              for e in campaign.incumbents],
        "history": [{"request_id": e.request_id, "judged_at": iso(e.judged_at), "index": e.index,
                     "level": e.level, "incumbent": e.incumbent, "better": e.better, "accepted": e.accepted,
                     "summary": e.summary, "paired": paired_json(e.paired) if e.paired else None}
                    for e in campaign.history],
    }
