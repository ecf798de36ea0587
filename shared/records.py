"""The aggregator's per-request record, and the public view of it that `ftbus status` reads.

Two KV buckets hold them: the full record (with the hidden test split's results and the report)
is the aggregator's alone; the public view, written beside it on every update, is what workers
and agents may read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from shared.events import (
    BaselineComparison,
    BenchmarkScores,
    JudgeResult,
    Model,
    Progress,
    Report,
    StageName,
    TaskSpec,
    Verdict,
    utcnow,
)

RequestStatus = Literal["queued", "running", "completed", "error", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "error", "cancelled"})


class StageTiming(Model):
    started_at: datetime | None = None
    finished_at: datetime | None = None
    ok: bool | None = None
    attempts: int = 0
    #: Training only: the checkpoint step a redelivered training resumed from.
    resumed_from_step: int | None = None
    #: Training only: why a redelivered training restarted from step 0 although a checkpoint was saved.
    resume_note: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class RequestStatusView(Model):
    """What anyone may read about a request: where it is, never what the hidden test split said."""

    request_id: str
    status: RequestStatus = "queued"
    stage: str | None = None
    task: TaskSpec | None = None
    submitted_at: datetime | None = None
    updated_at: datetime = Field(default_factory=utcnow)
    stages: dict[str, StageTiming] = Field(default_factory=dict)
    progress: Progress | None = None
    failed_stage: StageName | None = None
    final_decision: bool | None = None
    cancel_requested: bool = False
    #: The requests bucket's revision of the record this view shows: a view only ever replaces
    #: one of a lower revision (aggregators may write one request's views out of order). Not
    #: stored in the record itself, whose own KV entry says its revision.
    revision: int = 0

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class RequestRecord(RequestStatusView):
    """The full record: the public fields plus what the report needs."""

    # Kept here because the aggregator alone holds state.
    judge: JudgeResult | None = None
    benchmark_test: BenchmarkScores | None = None
    #: The test split against the base model on the same test items (paired), report only.
    benchmark_test_baseline: BaselineComparison | None = None
    benchmark_test_error: str | None = None
    test_received: bool = False
    # Claimed before publishing, so a crash between claim and publish is repaired by redelivery.
    verdict: Verdict | None = None
    verdict_published: bool = False
    report: Report | None = None
    report_published: bool = False

    def public_view(self) -> RequestStatusView:
        return RequestStatusView.model_validate(self.model_dump(include=_PUBLIC_FIELDS))

    def public_view_json(self) -> bytes:
        """:meth:`public_view` as the JSON the status bucket holds, without building the view (the
        aggregator writes it on every update: a third of the time)."""
        return self.model_dump_json(include=_PUBLIC_FIELDS).encode()

    def stored_json(self) -> bytes:
        """The record as the requests bucket holds it (its revision is the entry's own)."""
        return self.model_dump_json(exclude=_NOT_STORED).encode()


#: The record's fields that anyone may read: RequestStatusView's, never the private ones below it.
_PUBLIC_FIELDS: frozenset[str] = frozenset(RequestStatusView.model_fields)
_NOT_STORED: frozenset[str] = frozenset({"revision"})
