"""The judge stage: consumes ``bench.completed`` and every ``*.failed``; returns a ``JudgeResult``
(published on ``judge.completed``: it has no failures of its own).

It gathers what the judge reads — the config, each stage's log — from the artifact store, and
hands them to ``decide.judge``, which turns them into the facts it decides from
(``services/judge/facts.py``). It never sees the hidden test split: no event it consumes
carries one, and NATS permissions can deny it the test stream.
"""

from __future__ import annotations

from services.judge.decide import judge
from services.judge.facts import stage_runs
from shared.artifacts import ArtifactError
from shared.campaigns import CampaignStore
from shared.events import ArtifactRef, FailedStage, JudgeResult, Stage, StageResult, TrainSummary
from shared.logs import get_logger
from shared.runtime import StageContext
from shared.stagespec import Grant, Grants, StageSpec

log = get_logger("ftbus.judge")

MAX_LOG_BYTES = 16 * 2**20  # a larger log is read from its end: the root cause is usually late


async def handle(event: StageResult, ctx: StageContext) -> list[JudgeResult]:
    train_yaml = await _train_yaml(event, ctx)
    logs = await stage_logs(event, ctx)
    # The campaigns bucket only for a request that names a campaign: the others never touch it.
    campaigns = CampaignStore(ctx.bus) if event.context.task.campaign is not None else None
    result = await judge(event, train_yaml, logs, ctx.settings, campaigns)
    result = result.model_copy(update={"sandbox": sandboxes_of(event), "llm_usage": event.data.llm_usage})
    # The decision, on this handling's `stage finished` line.
    ctx.tell(final_decision=result.feedback.final_decision, rules_decision=result.judge.rules_decision,
             judge_kind=result.judge.kind, judge_policy=ctx.settings.judge_policy,
             failed_stage=result.failed_stage,
             campaign=result.result.campaign.campaign if result.result.campaign else None,
             campaign_accepted=result.result.campaign.accepted if result.result.campaign else None)
    return [result]


def sandboxes_of(event: StageResult) -> str | None:
    """Which isolation the candidate's code ran under, as the stages recorded it."""
    names = sorted({outcome.sandbox for _, outcome in stage_runs(event) if outcome.sandbox})
    return ", ".join(names) or None


async def _train_yaml(event: StageResult, ctx: StageContext) -> str:
    # The trainer's rewritten config is what really ran; before training, the candidate's own.
    train = getattr(event, "train", None)
    if isinstance(train, TrainSummary) and train.train_yaml:
        return train.train_yaml
    item = event.context.file("train.yaml")
    if item is None:
        return ""
    try:
        return (await ctx.artifacts.get_bytes(item.ref)).decode(errors="replace")
    except ArtifactError as exc:
        log.warning("train.yaml unavailable", error=str(exc))
        return ""


async def stage_logs(event: StageResult, ctx: StageContext) -> dict[str, str]:
    """Each stage's whole log, by record name; one that cannot be read is left out (its tail stands in)."""
    logs: dict[str, str] = {}
    for stage, outcome in stage_runs(event):
        text = await _log_text(outcome.log, ctx) if outcome.log else None
        if text is not None:
            logs[stage] = text
    return logs


async def _log_text(ref: ArtifactRef, ctx: StageContext) -> str | None:
    try:
        data = await ctx.artifacts.get_bytes(ref)
    except ArtifactError as exc:
        log.warning("stage log unavailable, using its tail", error=str(exc))
        return None
    return data[-MAX_LOG_BYTES:].decode(errors="replace")


SPEC = StageSpec(
    stage=Stage.judge,
    label="judge",
    # The validation result, or the failure of any stage before it: never the test split.
    judges_failures=True,
    handler=handle,
    # Reading logs and waiting on an LLM: many at once.
    concurrency=16,
    result=JudgeResult,
    fails=False,  # it judges failures; it has none of its own
    record_name=FailedStage.judge,
    words="judge",
    grants=Grants(
        note="`ftbus worker judge`: its consumer reads the validation benchmark's results and every stage's\n"
             "failures on {s.stream_events} (never {s.bench_test}, which is not in that stream); it publishes\n"
             "its result. It must NOT read {s.bench_test}, {s.stream_test}, {s.prefix}.report.>,\n"
             "{s.stream_reports}, the full records, the bench stage's results or the private store, nor read or\n"
             "write the cache store.",
        artifacts=Grant("artifacts, read only: train.yaml and the stage logs it judges", write=False),
        campaigns=Grant("the campaigns ({s.kv_campaigns}: validation data only): read a candidate's campaign, "
                        "write it back by compare-and-set (services/judge/decide.py)"),
    ),
    timeout=lambda settings: settings.judge_time_budget_s + settings.judge_request_timeout_s,
    next=Stage.aggregate,
)
