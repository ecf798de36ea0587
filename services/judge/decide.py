"""The judge's entry point: rules first, then (optionally) the LLM, then the policy.

Decision policy (REFERENCE §10.4 fixed):
- the rules' decision is always computed and recorded in ``JudgeInfo.rules_decision``;
- a failed rule criterion makes the final decision false, whatever the LLM says;
- when every rule passes, ``judge_policy`` decides: "both" (rules and LLM must agree), "llm" (the
  LLM's decision) or "rules" (the rules' decision; the LLM only writes the prose). Because of the
  rule above, "both" and "llm" give the same decision; they are kept apart so that the record says
  which one the operator asked for.
- without a judge model, or when the LLM is unavailable or never gives a valid answer, the rules
  write the feedback and decide, and ``JudgeInfo.reason`` says why.
"""

from __future__ import annotations

import asyncio
import re
from typing import Literal

from services.judge.condense import CondensedLog, condense_log
from services.judge.llm import LlmJudgeUnavailable, LlmOutcome, ask_llm
from services.judge.prompts import build_context, render_system, render_user, stage_timeout, templates_for
from services.judge.rules import JudgedEvent, RulesOutcome, outcome_of, rules_decision, rules_feedback
from shared.events import (
    BenchResult,
    DataResult,
    FailedStage,
    Feedback,
    JudgeInfo,
    JudgeResult,
    TrainingMetrics,
    TrainResult,
    VerdictResult,
)
from shared.logs import get_logger
from shared.settings import Settings

LogStage = Literal["data_processing", "training", "benchmark"]
_SECTION_TITLES: dict[LogStage, str] = {
    "data_processing": "=== DATA PROCESSING OUTPUT ===",
    "training": "=== TRAINING OUTPUT ===",
    "benchmark": "=== BENCHMARK OUTPUT ===",
}


def default_log_stage(event: JudgedEvent, failed: FailedStage | None) -> LogStage | None:
    """Which stage's log the judge reads: the failed stage's, or training's for a success."""
    if failed == FailedStage.precheck:
        return None
    if failed in (FailedStage.data_processing, FailedStage.training, FailedStage.benchmark):
        return failed.value  # type: ignore[return-value]
    if isinstance(event, DataResult):
        return "data_processing"
    return "training"


def _tail_of(event: JudgedEvent, stage: LogStage) -> str:
    outcome = outcome_of(event, FailedStage(stage))
    return outcome.log_tail if outcome is not None else ""


_BANNER = re.compile(r"^=== (DATA PROCESSING|TRAINING|BENCHMARK) OUTPUT ===[ \t]*$", re.MULTILINE)
_BANNER_STAGES: dict[str, LogStage] = {
    "DATA PROCESSING": "data_processing",
    "TRAINING": "training",
    "BENCHMARK": "benchmark",
}
_ORDER: list[LogStage] = ["data_processing", "training", "benchmark"]


def split_sections(text: str) -> dict[LogStage, str] | None:
    """Split a combined log (banners as in raw_execution) into its stages; None if it has no banner.

    Banners are taken in pipeline order only, so a line that merely looks like an earlier banner
    inside a later stage's output does not cut it. (The decision never depends on logs anyway.)
    """
    taken: list[tuple[LogStage, re.Match[str]]] = []
    for match in _BANNER.finditer(text):
        stage = _BANNER_STAGES[match.group(1)]
        if taken and _ORDER.index(stage) <= _ORDER.index(taken[-1][0]):
            continue
        taken.append((stage, match))
    if not taken:
        return None
    sections: dict[LogStage, str] = {}
    for i, (stage, match) in enumerate(taken):
        end = taken[i + 1][1].start() if i + 1 < len(taken) else len(text)
        sections[stage] = text[match.end() : end].strip("\n")
    return sections


def combined_log(event: JudgedEvent, log_text: str, log_stage: LogStage | None) -> str:
    """The reference's raw_execution: every stage's output under its banner, in pipeline order."""
    if event.failed_stage == FailedStage.precheck:
        return f"=== PRE-CHECK ===\n{event.error or 'workspace rejected'}"
    stages: list[LogStage] = ["data_processing"]
    if not isinstance(event, DataResult):
        stages.append("training")
    if isinstance(event, BenchResult):
        stages.append("benchmark")
    parts = []
    for stage in stages:
        text = log_text if stage == log_stage and log_text else _tail_of(event, stage)
        if stage == "data_processing" and event.data.cached and not text:
            text = f"(skipped: data.json reused from the cache, key {event.data.cache_key or 'unknown'})"
        parts.append(f"{_SECTION_TITLES[stage]}\n{text.rstrip()}")
    return "\n".join(parts)


def decide(rules_ok: bool, llm_decision: bool | None, policy: str) -> bool:
    """The final decision: never true when a rule fails; otherwise as the policy says."""
    if not rules_ok:
        return False
    if llm_decision is None or policy == "rules":
        return True
    return llm_decision  # "both": rules passed, so agreement = the LLM's decision; "llm": the same


def _llm_feedback(answer_outcome: LlmOutcome, final: bool, rules: RulesOutcome, policy: str) -> Feedback:
    answer = answer_outcome.answer
    return_checking = answer.return_checking
    if final != answer.final_decision:
        # Say why the written verdict and the decision differ, so the agent is not misled.
        if not rules.decision:
            note = "final_decision is false because deterministic checks failed: " + "; ".join(rules.failed_criteria)
        else:
            note = (
                f"the LLM judged this run a failure, but judge_policy={policy} decides from the "
                "deterministic checks, which all passed"
            )
        return_checking = f"{return_checking}\n\n[ftbus] Note: {note}."
    return Feedback(execution=answer.execution, return_checking=return_checking, code=answer.code, final_decision=final)


def _verdict_result(event: JudgedEvent) -> VerdictResult:
    training = TrainingMetrics() if isinstance(event, DataResult) else event.train.training_metrics
    return VerdictResult(
        benchmark=event.benchmark if isinstance(event, BenchResult) else None,
        training_metrics=training,
        baseline=event.baseline if isinstance(event, BenchResult) else None,
        data_stats=event.data.data_stats,
        data_cached=event.data.cached,
    )


async def judge(
    event: DataResult | TrainResult | BenchResult,
    train_yaml: str,
    log_text: str,
    settings: Settings,
    *,
    log_stage: LogStage | None = None,
) -> JudgeResult:
    """Judge one finished request.

    ``log_text`` is what the handler fetched: either the combined log of every stage under
    "=== ... OUTPUT ===" banners (then it is ``raw_execution`` as is, and the judge reads the
    section of the failed stage, or of training for a success), or one stage's log (by default the
    failed stage's, or training's for a success; ``log_stage`` names it otherwise). Empty: the
    events' log tails are used.
    """
    if isinstance(event, BenchResult) and event.split != "validation":
        raise ValueError("the judge only accepts validation benchmark results")
    rules = rules_decision(event)
    stage = rules.failed_stage
    log_stage = log_stage or default_log_stage(event, stage)
    # The handler may pass one stage's log or the combined log of every stage (with banners).
    sections = split_sections(log_text) if log_text else None
    if sections is not None:
        stage_log = (sections.get(log_stage, "") if log_stage else "") or (
            _tail_of(event, log_stage) if log_stage else ""
        )
        raw_execution = log_text
    else:
        stage_log = log_text or (_tail_of(event, log_stage) if log_stage else "")
        raw_execution = combined_log(event, log_text, log_stage)
    exit_code = rules.exit_code if rules.exit_code is not None else 1
    # Parsing a multi-megabyte log takes a moment: keep the event loop (heartbeats) responsive.
    condensed: CondensedLog = await asyncio.to_thread(condense_log, stage_log, exit_code, str(stage) if stage else None)
    timeout_s = stage_timeout(event, stage, settings)
    policy = settings.judge_policy

    feedback: Feedback
    if stage == FailedStage.precheck:
        feedback = rules_feedback(event, condensed, train_yaml=train_yaml, timeout_s=timeout_s)
        info = JudgeInfo(kind="rules", reason="pre-check failed: nothing ran", rules_decision=False)
    else:
        try:
            if not settings.judge_model:
                raise LlmJudgeUnavailable("no judge model configured")
            context = build_context(event, train_yaml, condensed, settings)
            templates = templates_for(settings)
            answer = await ask_llm(
                render_system(templates), render_user(context, templates), settings, templates=templates
            )
        except LlmJudgeUnavailable as exc:
            get_logger("ftbus.judge").info("judge_rules_fallback", reason=exc.reason)
            feedback = rules_feedback(event, condensed, train_yaml=train_yaml, timeout_s=timeout_s)
            info = JudgeInfo(kind="rules", reason=exc.reason, rules_decision=rules.decision)
        else:
            final = decide(rules.decision, answer.answer.final_decision, policy)
            feedback = _llm_feedback(answer, final, rules, policy)
            failed = "; ".join(rules.failed_criteria)
            info = JudgeInfo(
                kind="llm",
                model=settings.judge_model,
                reason=None if rules.decision else f"deterministic checks failed: {failed}",
                rules_decision=rules.decision,
                llm_decision=answer.answer.final_decision,
                attempts=answer.attempts,
            )

    get_logger("ftbus.judge").info(
        "judge_decided",
        final_decision=feedback.final_decision,
        rules_decision=rules.decision,
        judge_kind=info.kind,
        failed_stage=str(stage) if stage else None,
    )
    return JudgeResult(
        request_id=event.request_id,
        context=event.context,
        feedback=feedback,
        raw_execution=raw_execution,
        failed_stage=stage,
        judge=info,
        result=_verdict_result(event),
        artifacts=[] if isinstance(event, DataResult) else list(event.train.outputs),
        expects_test=isinstance(event, BenchResult),
    )
