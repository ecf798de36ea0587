"""The stages' results: what each stage that runs candidate code publishes, and what it carries on.

Every result is a :class:`StageResult`: success or where and why the candidate failed, with the
request and the data stage's summary carried along, and every stage's run so far (``runs``, under
the pipeline table's record names). A stage's own result type adds what it found.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from shared.events.base import ArtifactRef, Event, Model, StageName, StageOutcome, WorkspaceFile
from shared.events.request import RequestContext
from shared.statistics import PairedComparison

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
    #: LLM calls made through the gateway (docs/sandbox.md); None when no LLM was configured.
    llm_usage: LlmUsage | None = None


class StageRun(Model):
    """One stage's run of a request: which handling made its result, when it started, and how its
    candidate code ended. The worker's runtime stamps every result it publishes with it, under the
    stage's record name (shared/runtime.py). Progress travels at most once, and the aggregator
    writes only a stage's own progress: the result is where its start and attempt are sure to be
    told."""

    started_at: datetime
    attempt: int = Field(ge=1)
    #: How its candidate code ended (the result's ``outcome``); None: it ran none (a cache hit, a
    #: refused config, a stage that runs no code).
    outcome: StageOutcome | None = None


class StageResult(Event):
    """What every stage before the judge publishes: success or where and why it failed, with the
    request and the data stage's summary carried along. The stage's worker publishes it on
    ``<stage>.completed`` or ``<stage>.failed`` by ``ok``, sets ``failed_stage`` to the stage's record
    name when the handler named no other, and files the run under ``runs``. A stage's own result
    type adds what it found."""

    ok: bool
    context: RequestContext
    data: DataSummary
    failed_stage: StageName | None = None
    error: str | None = None
    #: How this stage's candidate code ended, when it ran some (the handler's report).
    outcome: StageOutcome | None = None
    #: Every stage's run so far, in pipeline order, by record name (the worker carries the earlier
    #: stages' on and adds its own): what the judge and the record's timeline read.
    runs: dict[StageName, StageRun] = Field(default_factory=dict)

    def run_of(self, record_name: str) -> StageRun | None:
        return self.runs.get(record_name)


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
    model_kind: Literal["lora", "full"] | None = None
    model_files: list[str] = Field(default_factory=list)
    outputs: list[WorkspaceFile] = Field(default_factory=list)
    base_model_path: str | None = None
    training_metrics: TrainingMetrics = Field(default_factory=TrainingMetrics)
    train_yaml: str = ""
    #: The checkpoint step a redelivered training resumed from (services/trainer/checkpoints.py).
    resumed_from_step: int | None = None
    #: Why a redelivered training started again from step 0 although a checkpoint was saved.
    resume_note: str | None = None


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


class DecisionView(Model):
    """The decision (shared/decision.py) as the owner sees it: better than, not distinguishable from,
    or worse than the reference, with what the owner may know. A candidate the pool did not confirm
    shows no pool number: that is what keeps the owner's error control formal (docs/benchmarks.md,
    "The decision"); the operator's full record is ``<request id>/decision.json`` in the private store."""

    answer: Literal["better", "indistinguishable", "worse"]
    #: The words a verdict shows.
    summary: str
    #: What the candidate was compared with ("the base model", or "the incumbent <id>" in a campaign).
    reference: str
    #: The campaign incumbent it was compared with (request id); None: the base model.
    incumbent: str | None = None
    #: Whose error budget the confirmation spent (the submitting identity).
    owner: str
    validation_items: int
    validation_difference: float
    #: Whether validation screened it in, so that it was tested on the hidden pool.
    screened: bool
    #: The confirmation's level (the owner's next one); None: not screened in, no budget spent.
    level: float | None = None
    #: A confirmed candidate's gain on fresh pool items (95% interval) and the pool items it used.
    estimate: float | None = None
    estimate_low: float | None = None
    estimate_high: float | None = None
    pool_items: int | None = None
    #: Why the pool could not confirm it (none, or too few items left), which then bounds the power to 0.
    pool_note: str | None = None

    @property
    def better(self) -> bool:
        return self.answer == "better"


class BenchResult(StageResult):
    split: Literal["validation", "test"]
    train: TrainSummary
    benchmark: BenchmarkScores | None = None
    baseline: BaselineComparison | None = None
    #: The validation split's decision: screened on validation, confirmed on the hidden pool.
    decision: DecisionView | None = None
    #: How many of the split's items an interrupted earlier attempt of this request had finished, so
    #: that this one took their answers from its journal (docs/benchmarks.md, "Resuming an interrupted
    #: run"); None: nothing was resumed.
    resumed_items: int | None = None

