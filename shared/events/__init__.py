"""Event models: every message on the bus is one of these, msgpack-encoded (shared/codec.py).

Split by job: ``base`` (names, file references, a run's outcome), ``request`` (what a user
submits), ``results`` (what the stages publish), ``verdict`` (the judge's result, the verdict and
report, progress, dead letters). Everything is importable from here, as before the split.
"""

from __future__ import annotations

from pydantic import BaseModel

from shared.events.base import (
    CAMPAIGN_NAME,
    CAMPAIGN_NAME_RULE,
    MAX_RUNS,
    SCHEMA_VERSION,
    STAGE_NAME,
    ArtifactRef,
    CampaignName,
    Event,
    FailedStage,
    Model,
    RequestId,
    Stage,
    StageName,
    StageOutcome,
    WorkspaceFile,
    utcnow,
)
from shared.events.request import (
    CancelRequested,
    EvalRequested,
    RequestContext,
    TaskSpec,
    Timeouts,
)
from shared.events.results import (
    AnswerCheckUsage,
    BaselineComparison,
    BenchmarkScores,
    BenchResult,
    ColumnStats,
    DataResult,
    DataStats,
    DataSummary,
    DecisionView,
    ErrorSample,
    EvalLossPoint,
    LlmCall,
    LlmUsage,
    LossHistory,
    RunStats,
    StageResult,
    StageRun,
    TrainingMetrics,
    TrainLossPoint,
    TrainResult,
    TrainSummary,
)
from shared.events.verdict import (
    CampaignCheck,
    DeadLetter,
    Feedback,
    JudgeInfo,
    JudgeResult,
    Progress,
    Report,
    Verdict,
    VerdictResult,
    VerdictStatus,
)

#: The events ftbus's own code decodes by name. A stage another pipeline adds decodes its own result
#: type too: a worker looks up the types it accepts first (shared/codec.py).
EVENT_TYPES: dict[str, type[BaseModel]] = {
    cls.__name__: cls
    for cls in (
        EvalRequested,
        CancelRequested,
        DataResult,
        TrainResult,
        BenchResult,
        JudgeResult,
        Verdict,
        Report,
        Progress,
        DeadLetter,
    )
}

__all__ = [
    "CAMPAIGN_NAME",
    "CAMPAIGN_NAME_RULE",
    "EVENT_TYPES",
    "MAX_RUNS",
    "SCHEMA_VERSION",
    "STAGE_NAME",
    "AnswerCheckUsage",
    "ArtifactRef",
    "BaselineComparison",
    "BenchResult",
    "BenchmarkScores",
    "CampaignCheck",
    "CampaignName",
    "CancelRequested",
    "ColumnStats",
    "DataResult",
    "DataStats",
    "DataSummary",
    "DeadLetter",
    "DecisionView",
    "ErrorSample",
    "EvalLossPoint",
    "EvalRequested",
    "Event",
    "FailedStage",
    "Feedback",
    "JudgeInfo",
    "JudgeResult",
    "LlmCall",
    "LlmUsage",
    "LossHistory",
    "Model",
    "Progress",
    "Report",
    "RequestContext",
    "RequestId",
    "RunStats",
    "Stage",
    "StageName",
    "StageOutcome",
    "StageResult",
    "StageRun",
    "TaskSpec",
    "Timeouts",
    "TrainLossPoint",
    "TrainResult",
    "TrainSummary",
    "TrainingMetrics",
    "Verdict",
    "VerdictResult",
    "VerdictStatus",
    "WorkspaceFile",
    "utcnow",
]
