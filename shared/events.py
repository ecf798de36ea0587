"""Event models: every message on the bus is one of these, msgpack-encoded (see codec.py).

Field names follow the reference evaluator where it has them (``execution``, ``return_checking``,
``code``, ``final_decision``, ``raw_execution``, ``failed_stage``, ``accuracy_summary`` ...), so that
its users can map one to one. Every stage event carries what later stages need, so stage services
stay stateless: a ``RequestContext`` travels with the request from start to verdict.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from shared.statistics import PairedComparison

SCHEMA_VERSION = 1
#: The most samples per benchmark item a benchmark or a request may ask for: each run's outcome of
#: every item travels in the events (NATS messages are at most 1 MB by default).
MAX_RUNS = 16

RequestId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
#: A stage's name or record name: a :class:`Stage` or :class:`FailedStage` for ftbus's own stages, a
#: short lowercase name for a stage another pipeline adds (shared/stagespec.py). Events name stages
#: in plain strings so that such a stage validates; the pattern keeps a forged event from writing
#: anything else into a record.
StageName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
#: A campaign's name: the key of its record in the campaigns bucket (shared/campaigns.py).
CAMPAIGN_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
CAMPAIGN_NAME_RULE = "a campaign name is letters, digits, '_' and '-', at most 64, starting with a letter or digit"
CampaignName = Annotated[str, StringConstraints(pattern=rf"^{CAMPAIGN_NAME}$")]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class Stage(StrEnum):
    """The worker stages, as named on the command line (`ftbus worker STAGE`)."""

    data = "data"
    train = "train"
    bench = "bench"
    judge = "judge"
    aggregate = "aggregate"


class FailedStage(StrEnum):
    """Where a request stopped. The first two are the reference evaluator's names."""

    precheck = "precheck"
    data_processing = "data_processing"
    training = "training"
    benchmark = "benchmark"
    judge = "judge"
    aggregate = "aggregate"
    cancelled = "cancelled"


#: The stages that run candidate code, by their record names: their timeouts, their logs.
RunStage = Literal["data_processing", "training", "benchmark"]


class ArtifactRef(Model):
    """A file in the artifact store. Events carry these, never the file itself."""

    name: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class WorkspaceFile(Model):
    """One file of the candidate's workspace: its path inside the workspace and where it is stored.

    The path is a plain string on purpose: a path that escapes the workspace must reach the
    data stage's pre-check, which turns it into a clear verdict instead of an undecodable message.
    """

    path: str
    ref: ArtifactRef


class TaskSpec(Model):
    base_model: str = Field(min_length=1)
    benchmark: str = Field(min_length=1)
    description: str = ""
    involving_datasets: list[str] = Field(default_factory=list)
    name: str = "LLM-Fine-Tuning"
    #: Samples per benchmark item (repeated runs); None: the benchmark's own ``num_runs`` (docs/benchmarks.md).
    num_runs: int | None = Field(default=None, ge=1, le=MAX_RUNS)
    #: The campaign this candidate belongs to: it must beat the campaign's incumbent beyond noise
    #: (docs/judge.md, "Campaigns"). None: judged on its own.
    campaign: CampaignName | None = None


class Timeouts(Model):
    """Per-request stage timeouts in seconds. ``None`` = the worker's setting; a request may only lower it."""

    data_processing: float | None = Field(default=None, gt=0)
    training: float | None = Field(default=None, gt=0)
    benchmark: float | None = Field(default=None, gt=0)


class RequestContext(Model):
    task: TaskSpec
    workspace: list[WorkspaceFile]
    timeouts: Timeouts = Field(default_factory=Timeouts)
    submitted_at: datetime = Field(default_factory=utcnow)

    def file(self, path: str) -> WorkspaceFile | None:
        return next((f for f in self.workspace if f.path == path), None)


class Event(Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: RequestId
    emitted_at: datetime = Field(default_factory=utcnow)


class StageOutcome(Model):
    """How one run of candidate code ended (the reference's EnvResult, made explicit)."""

    exit_code: int
    timed_out: bool = False
    duration_s: float = 0.0
    timeout_s: float | None = None
    log: ArtifactRef | None = None
    log_tail: str = ""
    #: The kernel killed it for exceeding the sandbox's memory limit (exit code 137).
    oom_killed: bool = False
    #: The isolation it ran under: ``local`` (none) or ``docker:<image>`` (docs/sandbox.md).
    sandbox: str | None = None


# ---------------------------------------------------------------- request


class EvalRequested(Event):
    context: RequestContext


class CancelRequested(Event):
    reason: str = "cancelled by user"


# ---------------------------------------------------------------- data


class ColumnStats(Model):
    empty_count: int
    min_tokens: int
    max_tokens: int
    p50_tokens: int
    p99_tokens: int


class DataStats(Model):
    total_samples: int
    token_stats: dict[str, ColumnStats]
    tokenizer: str
    stdout_summary: str = ""


class LlmCall(Model):
    """One call that process_data.py made through the LLM gateway."""

    model: str = ""
    path: str = ""
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class LlmUsage(Model):
    """What data processing spent on LLM calls, and the budget it ran under."""

    calls: list[LlmCall] = Field(default_factory=list)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Calls the gateway refused because the budget was spent.
    refused: int = 0
    budget_requests: int = 0
    budget_tokens: int = 0
    budget_wall_s: float = 0.0


class DataSummary(Model):
    """What the data stage produced, carried by every later event."""

    data: ArtifactRef | None = None
    data_stats: DataStats | None = None
    data_stats_ref: ArtifactRef | None = None
    cached: bool = False
    cache_key: str | None = None
    outcome: StageOutcome | None = None
    #: LLM calls made through the gateway (docs/sandbox.md); None when no LLM was configured.
    llm_usage: LlmUsage | None = None


class StageRun(Model):
    """Which handling of a message made a stage's result, and when it started: the worker's
    runtime stamps every result it publishes with it. Progress travels at most once, and the
    aggregator writes only a stage's own progress: the result is where its start and attempt are
    sure to be told."""

    started_at: datetime
    attempt: int = Field(ge=1)


class StageResult(Event):
    """What every stage that runs candidate code publishes: success or where and why it failed,
    with the request and the data stage's summary carried along."""

    ok: bool
    context: RequestContext
    data: DataSummary
    failed_stage: StageName | None = None
    error: str | None = None
    run: StageRun | None = None


class DataResult(StageResult):
    pass


# ---------------------------------------------------------------- training


class TrainLossPoint(Model):
    step: int
    epoch: float | None = None
    loss: float


class EvalLossPoint(Model):
    step: int
    epoch: float | None = None
    eval_loss: float


class LossHistory(Model):
    train: list[TrainLossPoint] = Field(default_factory=list)
    eval: list[EvalLossPoint] = Field(default_factory=list)


class TrainingMetrics(Model):
    loss_history: LossHistory = Field(default_factory=LossHistory)
    final_loss: float | None = None
    initial_loss: float | None = None

    @classmethod
    def from_history(cls, history: LossHistory) -> TrainingMetrics:
        return cls(
            loss_history=history,
            final_loss=history.train[-1].loss if history.train else None,
            initial_loss=history.train[0].loss if history.train else None,
        )


class TrainSummary(Model):
    outcome: StageOutcome | None = None
    model_kind: Literal["lora", "full"] | None = None
    model_files: list[str] = Field(default_factory=list)
    outputs: list[WorkspaceFile] = Field(default_factory=list)
    base_model_path: str | None = None
    training_metrics: TrainingMetrics = Field(default_factory=TrainingMetrics)
    train_yaml: str = ""


class TrainResult(StageResult):
    train: TrainSummary


# ---------------------------------------------------------------- benchmark


class ErrorSample(Model):
    question: str
    gold: str
    model_output: str
    #: The answer the scorer read from the output (e.g. the number after ####), when it reads one.
    extracted: str | None = None


class AnswerCheckUsage(Model):
    """What the LLM answer check of one split asked, and the budget it ran under."""

    model: str | None = None
    items_asked: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    budget_requests: int = 0
    rescued: int = 0


class RunStats(Model):
    """The primary metric of a subset's items (or of all items) over repeated runs.

    ``mean`` is over items of each item's mean over runs (avg@n), ``stderr`` its standard error over
    items (the item is the unit of sampling; None for a single item, whose spread is unknown).
    ``pass_at_k`` (code: the unbiased estimator, k <= n) is keyed ``pass@k``; ``maj_at_n`` (math:
    whether the most frequent extracted answer is right). Over all subsets (``overall``), each
    number is the mean of the subsets' numbers, as ``primary_value`` is."""

    items: int
    num_runs: int
    mean: float
    stderr: float | None
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    avg_at_n: float | None = None
    maj_at_n: float | None = None


class BenchmarkScores(Model):
    """The reference's ``{accuracy_summary, error_samples}``, plus what makes it comparable."""

    accuracy_summary: dict[str, dict[str, float]] = Field(default_factory=dict)
    error_samples: list[ErrorSample] = Field(default_factory=list)
    primary_metric: str | None = None
    higher_is_better: bool = True
    primary_value: float | None = None
    item_ids: dict[str, list[str]] = Field(default_factory=dict)
    #: How the outputs were scored (registry SCORER_METRICS: exact, loglik, gsm8k, math, choice, code, ...).
    scorer: str | None = None
    #: What a reader of the numbers must know: outputs that reached the token budget, the LLM check's
    #: absence or budget, the sampling used.
    notes: list[str] = Field(default_factory=list)
    #: The LLM answer check's calls (aime25's cascade, the llm scorer), as the judge records its own.
    answer_check: AnswerCheckUsage | None = None
    #: Samples per item; the metrics above are their mean (avg@n).
    num_runs: int = 1
    #: Each item's primary metric in each run: subset -> item id -> one value (0-1) per run. A
    #: validation split's are the agent's to see; a test split's travel only with the test results.
    item_scores: dict[str, dict[str, list[float]]] = Field(default_factory=dict)
    #: Per subset, and over all subsets each weighing the same (``overall``, the estimand of
    #: ``primary_value``): mean, standard error, pass@k, avg@n, maj@n.
    run_stats: dict[str, RunStats] = Field(default_factory=dict)
    overall: RunStats | None = None
    #: The seed the generation ran with (lm-eval's random, numpy and torch seeds).
    seed: int | None = None
    #: Which protocol produced these numbers (docs/benchmarks.md): ``validation`` (the pipeline's split,
    #: zero-shot, the model's own sampling) or ``reference`` (lm-eval's own task, its full test split).
    protocol: str = "validation"

    def item_means(self) -> dict[str, float]:
        """Each item's mean over its runs, keyed ``<subset>/<item id>``: what a paired comparison pairs."""
        return {f"{subset}/{item}": sum(runs) / len(runs)
                for subset, items in self.item_scores.items() for item, runs in items.items() if runs}


class BaselineComparison(Model):
    baseline: BenchmarkScores
    primary_metric: str | None = None
    candidate_value: float | None = None
    baseline_value: float | None = None
    difference: float | None = None
    #: The paired comparison on the same items (each item's mean over runs): the difference of the
    #: item means, its bootstrap interval, McNemar's or the permutation test's p-value, the seed.
    paired: PairedComparison | None = None
    #: It in words ("better than the base model by +0.12 (95% CI ...)"), or why there is none.
    summary: str | None = None


class BenchResult(StageResult):
    split: Literal["validation", "test"]
    train: TrainSummary
    benchmark: BenchmarkScores | None = None
    baseline: BaselineComparison | None = None
    outcome: StageOutcome | None = None
    #: How many of the split's items an interrupted earlier attempt of this request had finished, so
    #: that this one took their answers from its journal (docs/benchmarks.md, "Resuming an interrupted
    #: run"); None: nothing was resumed.
    resumed_items: int | None = None


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
    run: StageRun | None = None


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

