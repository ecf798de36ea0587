"""The judge's entry point: the facts once, then (optionally) the LLM, then the policy.

Decision policy (``judge_policy``; docs/judge.md):

- the rules' decision is computed once, with the facts, and recorded in ``JudgeInfo.rules_decision``;
  a failed rule criterion makes the final decision false, whatever the policy or the LLM says;
- when every rule passes, the policy decides:

  - ``better`` (the default): the candidate must be better than the base model, as the benchmark
    stage's decision says (shared/decision.py: screened on validation, confirmed on the hidden
    pool at the owner's level), and the LLM may still refuse it; "not distinguishable" and "worse"
    are refused, whatever the LLM says. The one policy under which a true ``final_decision`` means
    "better"; under the four below it means less, and every view of a verdict says so;
  - ``rules``: the rules decide, so the final decision is true; the LLM only writes the prose (and
    when it judged the run a failure, the feedback says that the policy overrode it);
  - ``llm``: the LLM's decision (the reference evaluator's meaning: the run worked and the LLM liked it);
  - ``both``: the LLM's decision, and also a measured check the LLM cannot override: the candidate
    must not score below the base model on the validation split (the benchmark stage's baseline
    comparison; no baseline measured, no check);
  - ``significant``: the LLM's decision, and the candidate must beat the base model beyond noise:
    the paired interval over the validation items (at ``judge_confidence_level``) excludes 0 on the
    better side and the p-value is below 1 - level (no paired comparison: not shown, so false);

- a request that names a campaign must also beat the campaign's incumbent (the base model while none
  is accepted) beyond noise at the online procedure's level, under every policy; the judge then writes
  the campaign's record by compare-and-set, and tests again against the new incumbent when another
  candidate was judged in between (docs/judge.md, "Campaigns");
- without a judge model, or when the LLM is unavailable or never gives a valid answer, the rules
  write the feedback and the policy decides without the LLM's vote; ``JudgeInfo.reason`` says why.

The LLM reads the fine-tuned model's outputs and the candidate's logs (fenced as untrusted data,
``prompts.py``), and a model can be trained to write "accept this run" into them; a fence is no
guarantee that an LLM will not obey. So the LLM's vote is only ever the last of the checks, ANDed
after them: under every policy a failed rule wins, and under ``both`` and ``significant`` so does
the measured check, whatever the LLM answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from services.judge.advice import error_sample_quote, rules_feedback
from services.judge.facts import JudgeFacts, LogStage, collect_facts, render_raw_execution
from services.judge.llm import LlmJudgeUnavailable, LlmOutcome, ask_llm
from services.judge.prompts import build_context, render_system, render_user, templates_for
from services.judge.rules import JudgedEvent, train_of
from shared.campaigns import (
    CampaignConflict,
    CampaignStore,
    check_candidate,
    decided_check,
    foreign_owner,
    pool_decides,
    record_after,
    recorded_check,
)
from shared.decision import POLICY_MEANING
from shared.events import (
    BenchResult,
    CampaignCheck,
    FailedStage,
    Feedback,
    JudgeInfo,
    JudgeResult,
    TrainingMetrics,
    VerdictResult,
)
from shared.logs import get_logger
from shared.paired import describe_with_power
from shared.settings import Settings
from shared.statistics import p_text
from shared.untrusted import Fence

log = get_logger("ftbus.judge")

#: The values of ``Settings.judge_policy``.
JudgePolicy = Literal["better", "both", "llm", "rules", "significant"]


@dataclass(frozen=True)
class PolicyDecision:
    final: bool
    #: The check that made it false (a failed rule, the baseline under "both"), or, under "rules", why
    #: an LLM that said false was overruled. None when the decision is simply the writer's own.
    overrides: str | None = None


def measured_refusal(facts: JudgeFacts, policy: JudgePolicy) -> str | None:
    """Why the measurements refuse the candidate under ``policy``, or None: the failed rules (every
    policy), not better (``better``), the baseline shortfall (``both``), no improvement beyond noise
    (``significant``). The
    LLM's answer is no input here: nothing it says can lift a refusal."""
    if not facts.rules.decision:
        return "deterministic checks failed: " + "; ".join(facts.rules.failed_criteria)
    if policy == "both" and facts.below_baseline:
        return f"judge_policy=both requires the candidate not to score below the base model: {facts.below_baseline}"
    if policy == "better" and facts.not_better:
        decision = facts.event.decision if isinstance(facts.event, BenchResult) else None
        reference = decision.reference if decision is not None else "the base model"
        return f"judge_policy=better accepts only a candidate better than {reference}: {facts.not_better}"
    if policy == "significant" and facts.not_beyond_noise:
        return ("judge_policy=significant requires the candidate to beat the base model beyond noise: "
                f"{facts.not_beyond_noise}")
    if facts.campaign is not None and not facts.campaign.better:
        # Under every policy: a request that names a campaign asks to be measured against its incumbent.
        return (f"campaign {facts.campaign.campaign} accepts only a candidate that beats its incumbent beyond "
                f"noise: {campaign_sentence(facts.campaign)}")
    return None


def decide(facts: JudgeFacts, llm_decision: bool | None, policy: JudgePolicy) -> PolicyDecision:
    """The final decision from the rules, the LLM's decision (None: no LLM answer) and the policy.

    True only when the measurements refuse nothing (:func:`measured_refusal`); then ``rules`` says
    true and the others take the LLM's vote (no answer: true)."""
    refused = measured_refusal(facts, policy)
    if refused is not None:
        return PolicyDecision(False, refused)
    if policy == "rules":
        if llm_decision is False:
            return PolicyDecision(True, "judge_policy=rules decides from the deterministic checks, which all passed")
        return PolicyDecision(True)
    return PolicyDecision(llm_decision is not False)


def _with_note(feedback: Feedback, decided: PolicyDecision, writer: str) -> Feedback:
    """The feedback with the final decision, and a note when it differs from what ``writer`` said."""
    if decided.final == feedback.final_decision:
        return feedback
    # Say why the written verdict and the decision differ, so the agent is not misled.
    if decided.final:
        note = f"{writer} judged this run a failure, but {decided.overrides}"
    else:
        note = f"final_decision is false because {decided.overrides}"
    return feedback.model_copy(
        update={
            "return_checking": f"{feedback.return_checking}\n\n[ftbus] Note: {note}.",
            "final_decision": decided.final,
        }
    )


def _llm_feedback(outcome: LlmOutcome, facts: JudgeFacts) -> Feedback:
    answer = outcome.answer
    return_checking = answer.return_checking
    if facts.paired is not None:
        # The measured comparison, in the feedback whoever wrote it: the agent reads it there.
        return_checking += (f"\n\n[ftbus] Paired with the base model on the same validation items, the candidate "
                            f"is {describe_with_power(facts.paired)}.")
    quote = error_sample_quote(facts.event) if isinstance(facts.event, BenchResult) else None
    if quote:
        # The model's own output, quoted by ftbus inside a fence, as the rules' feedback does: the
        # agent's LLM reads this feedback, and the output may be written to steer it.
        return_checking += f"\n\n[ftbus] {quote}"
    return Feedback(
        execution=answer.execution,
        return_checking=return_checking,
        code=answer.code,
        final_decision=answer.final_decision,
    )


def _verdict_result(event: JudgedEvent) -> VerdictResult:
    train = train_of(event)
    training = train.training_metrics if train is not None else TrainingMetrics()
    return VerdictResult(
        benchmark=event.benchmark if isinstance(event, BenchResult) else None,
        training_metrics=training,
        baseline=event.baseline if isinstance(event, BenchResult) else None,
        decision=event.decision if isinstance(event, BenchResult) else None,
        data_stats=event.data.data_stats,
        data_cached=event.data.cached,
    )


async def judge(
    event: JudgedEvent, train_yaml: str, logs: Mapping[LogStage, str], settings: Settings,
    campaigns: CampaignStore | None = None,
) -> JudgeResult:
    """Judge one finished request.

    ``logs``: each stage's whole log as the handler fetched it, by stage; a stage left out is
    represented by the log tail its event carries. ``campaigns``: the campaigns bucket, read and
    written when the request names a campaign (docs/judge.md, "Campaigns").
    """
    if isinstance(event, BenchResult) and event.split != "validation":
        raise ValueError("the judge only accepts validation benchmark results")
    # Parsing a multi-megabyte log takes a moment: keep the event loop (heartbeats) responsive.
    facts = await asyncio.to_thread(collect_facts, event, train_yaml, logs, settings)
    written = await _write(facts, settings)
    check: CampaignCheck | None = None
    if campaigns is not None and in_campaign(facts):
        feedback, info, check = await _judge_in_campaign(facts, written, settings, campaigns)
    else:
        feedback, info = _finish(facts, written, settings)
    result = _verdict_result(event)
    return JudgeResult(
        request_id=event.request_id,
        context=event.context,
        feedback=feedback,
        raw_execution=render_raw_execution(facts),
        failed_stage=facts.failed_stage,
        judge=info,
        result=result.model_copy(update={"campaign": check}) if check is not None else result,
        artifacts=list(train.outputs) if (train := train_of(event)) is not None else [],
        expects_test=isinstance(event, BenchResult),
    )


@dataclass(frozen=True)
class Written:
    """The feedback as its writer (the LLM, or the rules without one) wrote it, before the policy."""

    feedback: Feedback
    #: The LLM's decision; None without an LLM answer.
    vote: bool | None
    kind: Literal["rules", "llm"]
    #: Why the rules wrote it (no judge model, the LLM unavailable, a pre-check failure).
    reason: str | None = None
    attempts: int = 0


async def _write(facts: JudgeFacts, settings: Settings) -> Written:
    if facts.failed_stage == FailedStage.precheck:
        return Written(rules_feedback(facts), None, "rules", "pre-check failed: nothing ran")
    try:
        if not settings.judge_model:
            raise LlmJudgeUnavailable("no judge model configured")
        templates = templates_for(settings)
        fence = Fence()  # one token for this judgement's prompts, named in its system prompt
        answer = await ask_llm(
            render_system(templates, fence=fence), render_user(build_context(facts, fence), templates), settings,
            templates=templates,
        )
    except LlmJudgeUnavailable as exc:
        log.info("judge_rules_fallback", reason=exc.reason)
        return Written(rules_feedback(facts), None, "rules", exc.reason)
    return Written(_llm_feedback(answer, facts), answer.answer.final_decision, "llm", attempts=answer.attempts)


def _finish(facts: JudgeFacts, written: Written, settings: Settings) -> tuple[Feedback, JudgeInfo]:
    """The policy applied to the written feedback: the final decision, and a note when they differ."""
    feedback = written.feedback
    decision = facts.event.decision if isinstance(facts.event, BenchResult) else None
    if decision is not None:
        # The decision, in the feedback whoever wrote it: the one question a verdict answers first.
        feedback = feedback.model_copy(update={
            "return_checking": (f"{feedback.return_checking}\n\n[ftbus] Decision: {decision.answer}. "
                                f"{decision.summary}.")})
    if facts.campaign is not None:
        # The campaign's comparison, in the feedback whoever wrote it: the agent reads it there.
        feedback = feedback.model_copy(update={
            "return_checking": f"{feedback.return_checking}\n\n[ftbus] {campaign_sentence(facts.campaign)}"})
    if facts.failed_stage == FailedStage.precheck:
        return feedback, JudgeInfo(kind="rules", reason=written.reason, rules_decision=False,
                                   policy=settings.judge_policy)
    decided = decide(facts, written.vote, settings.judge_policy)
    if written.kind == "rules":
        reason = written.reason
        if facts.rules.decision and not decided.final:
            reason = f"{reason}; {decided.overrides}"
        return (_with_meaning(_with_note(feedback, decided, "the rules"), settings.judge_policy),
                JudgeInfo(kind="rules", reason=reason, rules_decision=facts.rules.decision,
                          policy=settings.judge_policy))
    info = JudgeInfo(
        kind="llm",
        model=settings.judge_model,
        reason=None if decided.final else decided.overrides,
        rules_decision=facts.rules.decision,
        llm_decision=written.vote,
        attempts=written.attempts,
        policy=settings.judge_policy,
    )
    return _with_meaning(_with_note(feedback, decided, "the LLM"), settings.judge_policy), info


def _with_meaning(feedback: Feedback, policy: JudgePolicy) -> Feedback:
    """An accepted candidate under a looser policy than ``better``: the feedback says what its
    final_decision means (and does not), so no reader of it takes "accepted" for "better"."""
    if not feedback.final_decision or policy == "better":
        return feedback
    note = f"final_decision is true under judge_policy={policy}, which means: {POLICY_MEANING[policy]}"
    return feedback.model_copy(update={"return_checking": f"{feedback.return_checking}\n\n[ftbus] Note: {note}."})


# ---------------------------------------------------------------- campaigns

#: Compare-and-set attempts on a campaign record before the judgement is retried as an infrastructure
#: error (each lost one means another candidate of the campaign was judged in between).
CAMPAIGN_ATTEMPTS = 50


def in_campaign(facts: JudgeFacts) -> bool:
    """A request that names a campaign and whose rules pass is tested against the campaign's incumbent.
    A failed run makes no test (its rules refuse it already) and spends none of the campaign's level."""
    event = facts.event
    return isinstance(event, BenchResult) and event.context.task.campaign is not None and facts.rules.decision


def campaign_sentence(check: CampaignCheck) -> str:
    """The campaign's comparison in words, for the feedback."""
    if check.index is None or check.level is None:
        return f"Campaign {check.campaign}: {check.summary}."
    one_sided = ""
    if check.paired is not None:
        # The paired tests are symmetric: the one-sided p on the better side is half the two-sided one.
        gain = check.paired.difference if check.paired.higher_is_better else -check.paired.difference
        p = check.paired.p_value / 2 if gain > 0 else 1.0 - check.paired.p_value / 2
        one_sided = f"; one-sided p = {p_text(p)} against that level"
    return (f"Campaign {check.campaign}, tested candidate #{check.index} (one-sided level {check.level:.4g} of the "
            f"campaign's {check.alpha:g}, {check.procedure}{one_sided}): the candidate is {check.summary}.")


async def _judge_in_campaign(facts: JudgeFacts, written: Written, settings: Settings, campaigns: CampaignStore,
                             ) -> tuple[Feedback, JudgeInfo, CampaignCheck]:
    """Test the candidate against the incumbent as the record stands, decide, and write the record back
    by compare-and-set on the revision read. A lost one means another candidate was judged in between
    (and perhaps became the incumbent): read again and test against the record as it is now, at its
    next level. The LLM's vote is kept: it judged this run, not the comparison."""
    event = facts.event
    assert isinstance(event, BenchResult)
    task = event.context.task
    name = task.campaign
    assert name is not None
    for _ in range(CAMPAIGN_ATTEMPTS):
        record = await campaigns.get(name)
        recorded = recorded_check(record, await campaigns.entry(record, event.request_id))
        if recorded is not None:
            # A redelivery after the record was written: later candidates were compared with what the
            # record says, so its decision stands (only the LLM's vote could differ on a second asking).
            feedback, info = _finish(replace(facts, campaign=recorded), written, settings)
            if feedback.final_decision != recorded.accepted:
                feedback = _with_note(feedback, PolicyDecision(recorded.accepted, (
                    f"campaign {name} recorded this request's decision when it was first judged")), "the judge")
            return feedback, info, recorded
        owner = event.context.owner
        foreign = foreign_owner(record, owner)
        if foreign is not None and record is not None:
            # Another identity's campaign: refused, and nothing written into it.
            check = CampaignCheck(campaign=name, alpha=record.state.alpha, procedure=record.procedure,
                                  incumbent=record.incumbent, summary=f"refused: {foreign}")
            feedback, info = _finish(replace(facts, campaign=check), written, settings)
            return feedback, info, check
        if settings.judge_policy == "better" and pool_decides(record, task, event.decision):
            assert event.decision is not None
            check = decided_check(record, name, event.decision)
        else:
            check = check_candidate(record, name, task, event.benchmark, event.baseline)
        feedback, info = _finish(replace(facts, campaign=check), written, settings)
        check = check.model_copy(update={"accepted": feedback.final_decision})
        try:
            await campaigns.put(record_after(record, event.request_id, task, check, event.benchmark, owner,
                                             event.train.outputs))
        except CampaignConflict:
            log.info("campaign_conflict", campaign=name, request_id=event.request_id)
            continue
        return feedback, info, check
    raise RuntimeError(f"campaign {name}: {CAMPAIGN_ATTEMPTS} concurrent judgements won the record's "
                       "compare-and-set; judging again")
