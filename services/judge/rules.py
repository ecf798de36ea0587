"""The judge's decision: deterministic criteria checked on facts (exit codes, files, results).

The reference let the LLM decide facts that a program can check. Here the rules' decision is
always computed, once per judged event (``services/judge/facts.py``), and the final decision can
never be true when one of the criteria fails (docs/judge.md). The prose written from these facts
lives in ``services/judge/advice.py``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from runners.base import EXIT_TIMEOUT
from shared.events import BenchResult, FailedStage, StageOutcome, StageResult, TrainSummary
from shared.paired import compare_scores, describe_with_power
from shared.statistics import PairedComparison

#: What the judge judges: the validation benchmark's result, or any stage's failure (another
#: pipeline's stage's own result type included).
JudgedEvent = StageResult
#: How the criteria name a stage, by record name, where its record name alone says less.
_CRITERIA_WORDS = {FailedStage.data_processing: "data processing (process_data.py)",
                   FailedStage.benchmark: "the validation benchmark"}


class RulesOutcome(BaseModel):
    """The deterministic decision and why."""

    model_config = ConfigDict(extra="forbid")

    decision: bool
    failed_criteria: list[str]
    failed_stage: str | None  # a FailedStage, or another pipeline row's record_name
    exit_code: int | None
    timed_out: bool


# ---------------------------------------------------------------- where the request stopped


def own_stage(event: JudgedEvent) -> str | None:
    """The record name of the stage that published ``event``: the last of its runs."""
    return next(reversed(event.runs), None)


def failed_stage_of(event: JudgedEvent) -> str | None:
    """Where the request stopped: the event's ``failed_stage`` (its worker sets it on every failure),
    else, for a failure or a benchmark without results, the stage that published it."""
    if event.failed_stage is not None:
        return event.failed_stage
    if not event.ok or (isinstance(event, BenchResult) and not _has_results(event)):
        return own_stage(event) or FailedStage.benchmark
    return None


def outcome_of(event: JudgedEvent, stage: str | None = None) -> StageOutcome | None:
    """The run of the stage that failed, or of the event's own stage."""
    stage = stage or failed_stage_of(event) or own_stage(event)
    run = event.runs.get(stage) if stage is not None else None
    return run.outcome if run is not None else None


def exit_code_of(event: JudgedEvent) -> int | None:
    """The failing stage's exit code (0 for a success); None when nothing ran (pre-check)."""
    stage = failed_stage_of(event)
    if stage == FailedStage.precheck:
        return None
    outcome = outcome_of(event, stage)
    if outcome is not None:
        return outcome.exit_code
    return 0 if stage is None else 1


def train_of(event: JudgedEvent) -> TrainSummary | None:
    """What training left, when the event carries it (the results of training and the stages after it)."""
    train = getattr(event, "train", None)
    return train if isinstance(train, TrainSummary) else None


def model_files_of(event: JudgedEvent) -> list[str]:
    train = train_of(event)
    return list(train.model_files) if train is not None else []


def _has_results(event: BenchResult) -> bool:
    summary = event.benchmark.accuracy_summary if event.benchmark else {}
    return any(metrics for metrics in summary.values())


def timed_out(outcome: StageOutcome | None) -> bool:
    return bool(outcome and (outcome.timed_out or outcome.exit_code == EXIT_TIMEOUT))


# ---------------------------------------------------------------- decision


def _stage_failure(name: str, outcome: StageOutcome | None, error: str | None) -> str:
    name = _CRITERIA_WORDS.get(name, name.replace("_", " "))
    if outcome is not None and timed_out(outcome):
        limit = f" after {outcome.timeout_s:g} s" if outcome.timeout_s else ""
        return f"{name} timed out{limit} (exit code {outcome.exit_code})"
    if outcome is not None and outcome.exit_code != 0:
        return f"{name} exited with code {outcome.exit_code}"
    return f"{name} failed: {error}" if error else f"{name} failed"


def rules_decision(event: JudgedEvent) -> RulesOutcome:
    """True iff every stage exited 0, the model files exist and the benchmark produced results."""
    if isinstance(event, BenchResult) and event.split != "validation":
        # The judge must never see the hidden test split; refuse rather than leak it.
        raise ValueError("the judge only accepts validation benchmark results")
    failed: list[str] = []
    stage = failed_stage_of(event)

    if stage == FailedStage.precheck:
        failed.append(f"pre-check failed: {event.error or 'workspace rejected'}")
        failed.append("nothing was run")
        return RulesOutcome(decision=False, failed_criteria=failed, failed_stage=stage, exit_code=None, timed_out=False)

    # Every stage that ran, in pipeline order: the failed one with its error, any other that exited non-zero.
    for name, run in event.runs.items():
        if name == stage and event.ok:
            continue  # a benchmark without results: said below
        if name == stage:
            failed.append(_stage_failure(name, run.outcome, event.error))
        elif run.outcome is not None and run.outcome.exit_code != 0:
            failed.append(_stage_failure(name, run.outcome, None))
    if stage is not None and stage not in event.runs:
        failed.append(_stage_failure(stage, None, event.error))

    train = train_of(event)
    if train is None or (FailedStage.training not in event.runs and not train.model_files):
        failed.append("training did not run")

    if not model_files_of(event):
        failed.append("no model files in the training output")

    if not isinstance(event, BenchResult):
        failed.append("the validation benchmark did not run")
    elif event.ok and not _has_results(event):
        failed.append("the validation benchmark produced no results (empty accuracy_summary)")

    return RulesOutcome(
        decision=not failed,
        failed_criteria=failed,
        failed_stage=stage,
        exit_code=exit_code_of(event),
        timed_out=timed_out(outcome_of(event, stage)),
    )


# ---------------------------------------------------------------- the baseline, as a measured fact


def baseline_shortfall(event: JudgedEvent) -> str | None:
    """How the candidate scores below the base model on the validation split, or None.

    None too when there is nothing to compare (no benchmark, or the baseline run failed: the
    benchmark stage reports it missing and never fails a candidate for it). A tie is no shortfall.
    Only ``judge_policy=both`` makes this a criterion; otherwise it shapes the advice only.
    """
    if not isinstance(event, BenchResult) or event.baseline is None or event.baseline.difference is None:
        return None
    base = event.baseline
    higher_is_better = event.benchmark is None or event.benchmark.higher_is_better
    worse = base.difference < 0 if higher_is_better else base.difference > 0
    if not worse:
        return None
    metric = base.primary_metric or "the primary metric"
    side, better = ("below", "higher") if higher_is_better else ("above", "lower")
    return (
        f"validation {metric} = {_num(base.candidate_value)} is {side} the base model's "
        f"{_num(base.baseline_value)} ({better} is better)"
    )


def paired_at(event: JudgedEvent, level: float) -> PairedComparison | None:
    """The paired comparison with the base model on the validation items, at ``level``: the
    benchmark stage's, or recomputed from the same per-item outcomes (and seed) at another level."""
    if not isinstance(event, BenchResult) or event.baseline is None or event.baseline.paired is None:
        return None
    paired = event.baseline.paired
    if paired.level == level or event.benchmark is None:
        return paired
    again, _ = compare_scores(event.benchmark, event.baseline.baseline, level=level, seed=paired.seed)
    return again or paired


def noise_shortfall(event: JudgedEvent, paired: PairedComparison | None, level: float) -> str | None:
    """Why the candidate is not shown better than the base model beyond noise, or None when it is.

    Only ``judge_policy=significant`` makes this a criterion. With no paired comparison (no baseline
    measured, no per-item outcomes), an improvement cannot be shown, and that is the reason."""
    if not isinstance(event, BenchResult):
        return None  # the rules fail such a request already
    if event.baseline is None:
        return "no baseline of the base model was measured, so no improvement can be shown"
    if paired is None:
        return event.baseline.summary or "no paired comparison with the base model"
    if paired.improves(level):
        return None
    return describe_with_power(paired)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def not_better(event: JudgedEvent) -> str | None:
    """Why the benchmark stage's decision does not call the candidate better than the base model, or
    None when it does. ``judge_policy=better`` (the default) makes this a criterion."""
    if not isinstance(event, BenchResult):
        return None  # the rules fail such a request already
    if event.decision is None:
        if event.baseline is None:
            return "no baseline of the base model was measured, so no improvement can be shown"
        return "the candidate and the base model could not be paired item by item, so no improvement can be shown"
    if event.decision.better:
        return None
    return event.decision.summary
