"""The judge's result, the verdict and report the aggregator publishes, progress and dead letters."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from shared.events.base import SCHEMA_VERSION, CampaignName, Event, Model, StageName, WorkspaceFile, utcnow
from shared.events.request import RequestContext
from shared.events.results import (
    BaselineComparison,
    BenchmarkScores,
    DataStats,
    DecisionView,
    LlmUsage,
    StageRun,
    TrainingMetrics,
)
from shared.statistics import PairedComparison

# ---------------------------------------------------------------- judge and verdict


class Feedback(Model):
    """The reference's CoSTEERSingleFeedback text fields and decision."""

    execution: str
    return_checking: str
    code: str
    final_decision: bool


class JudgeInfo(Model):
    kind: Literal["rules", "llm"]
    model: str | None = None
    reason: str | None = None
    rules_decision: bool
    llm_decision: bool | None = None
    attempts: int = 0
    #: The judge_policy that made the final decision: under ``better`` (the default) true means better
    #: than the base model, confirmed; under the others it means less, which every view says.
    policy: str | None = None


class CampaignCheck(Model):
    """A candidate against its campaign's incumbent on the same validation items (docs/judge.md,
    "Campaigns"): the test at the online procedure's level, and whether it became the incumbent."""

    campaign: CampaignName
    #: Its position among the campaign's tested candidates (1-based); None: no test was made (nothing
    #: to pair, or another benchmark than the campaign's), so no level was spent.
    index: int | None = None
    #: The one-sided level of its test (alpha_i), the campaign's alpha and the procedure's name.
    level: float | None = None
    alpha: float
    procedure: str
    #: The incumbent's request id; None: none accepted yet, so the candidate is compared with the base model.
    incumbent: str | None = None
    #: The paired comparison with the incumbent (or the base model), at the two-sided level 1 - 2 alpha_i.
    paired: PairedComparison | None = None
    #: Better than the incumbent beyond noise at alpha_i.
    better: bool = False
    #: The comparison in words: "better than the incumbent (ID) by ...", or why none was made.
    summary: str
    #: Whether the candidate was accepted, so became the incumbent.
    accepted: bool = False


class VerdictResult(Model):
    benchmark: BenchmarkScores | None = None
    training_metrics: TrainingMetrics = Field(default_factory=TrainingMetrics)
    baseline: BaselineComparison | None = None
    #: Better than, not distinguishable from, or worse than the base model (the benchmark stage's decision).
    decision: DecisionView | None = None
    data_stats: DataStats | None = None
    data_cached: bool = False
    #: The candidate against its campaign's incumbent, when the request named a campaign.
    campaign: CampaignCheck | None = None


class JudgeResult(Event):
    context: RequestContext
    feedback: Feedback
    raw_execution: str = ""
    failed_stage: StageName | None = None
    judge: JudgeInfo
    result: VerdictResult
    artifacts: list[WorkspaceFile] = Field(default_factory=list)
    expects_test: bool = False
    #: The isolation the candidate's code ran under, from the stages' outcomes (docs/sandbox.md).
    sandbox: str | None = None
    #: What process_data.py spent on LLM calls through the gateway.
    llm_usage: LlmUsage | None = None
    #: Every stage's run, the judge's own included, by record name (shared/runtime.py stamps it).
    runs: dict[StageName, StageRun] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _recorded_before_runs(cls, data: Any) -> Any:
        """A request's record (14 days in the requests bucket) may hold a judge's result written
        before results carried ``runs``: its ``run`` was the judge's own."""
        if isinstance(data, dict) and "run" in data:
            data = dict(data)
            run = data.pop("run")
            if run is not None and "runs" not in data:
                data["runs"] = {"judge": run}
        return data


VerdictStatus = Literal["completed", "error", "cancelled"]


class Verdict(Event):
    """What the agent sees: the reference's feedback fields. Never holds test-split results."""

    status: VerdictStatus
    execution: str
    return_checking: str
    code: str
    final_decision: bool
    raw_execution: str = ""
    failed_stage: StageName | None = None
    result: VerdictResult = Field(default_factory=VerdictResult)
    judge: JudgeInfo | None = None
    artifacts: list[WorkspaceFile] = Field(default_factory=list)
    #: ``docker:<image>`` or ``local`` (no isolation); None when no stage ran candidate code.
    sandbox: str | None = None
    #: What process_data.py spent on LLM calls (calls, tokens, latency), when an LLM was configured.
    llm_usage: LlmUsage | None = None


class Report(Verdict):
    """The full record for dashboards: the verdict plus the hidden test split's results."""

    benchmark_test: BenchmarkScores | None = None
    #: The test split against the base model on the same test items: the paired comparison, in words.
    benchmark_test_baseline: BaselineComparison | None = None
    benchmark_test_error: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)


class Progress(Event):
    stage: StageName
    state: Literal["started", "running", "finished", "failed", "retrying"] = "running"
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    eta_s: float | None = None
    message: str = ""
    #: Which delivery of the stage's message this is (1: the first).
    attempt: int | None = None


class DeadLetter(Model):
    """A message that could not be processed. ``request_id`` is set when it could be read."""

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str | None = None
    emitted_at: datetime = Field(default_factory=utcnow)
    original_subject: str
    stage: StageName | None = None
    reason: str
    payload: bytes = b""
    deliveries: int | None = None

