"""The facts the judge decides and writes from, computed once for each judged event.

The handler fetches each stage's log; :func:`collect_facts` turns the event, those logs and the
config into one :class:`JudgeFacts`: where the request stopped and how that run ended, every
stage's log, the condensed log of the stage that matters, the rules' decision and the config as
LlamaFactory reads it. Everything downstream reads this value: the policy (``decide.py``), the
prompt (``prompts.py``), the rules' prose (``advice.py``), and ``raw_execution``, which is
rendered from it and never parsed back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from services.judge.condense import CondensedLog, condense_log
from services.judge.rules import (
    JudgedEvent,
    RulesOutcome,
    baseline_shortfall,
    model_files_of,
    noise_shortfall,
    not_better,
    outcome_of,
    own_stage,
    paired_at,
    rules_decision,
)
from shared.events import CampaignCheck, FailedStage, StageOutcome
from shared.settings import Settings
from shared.statistics import PairedComparison
from shared.train_yaml import TrainYamlError, load_yaml

#: A stage, by its record name (the key of its run in a result's ``runs``).
LogStage = str
_RESTATES_EXIT = re.compile(r"exit(?:ed)?(?: with)? (?:code|status)|timed out", re.IGNORECASE)


@dataclass(frozen=True)
class RunFacts:
    """How the run that decided the outcome ended: the failed stage's, or the last one for a success."""

    exit_code: int | None  # None: nothing ran (pre-check)
    timed_out: bool
    oom_killed: bool
    duration_s: float | None
    timeout_s: float | None  # the limit it ran under: the runner's record, else the request's


@dataclass(frozen=True)
class JudgeFacts:
    """Everything the judge knows about one finished request; built once, by :func:`collect_facts`."""

    event: JudgedEvent
    failed_stage: str | None  # a FailedStage, or another pipeline row's record_name
    outcome: RunFacts
    #: Each stage that ran, in pipeline order: its whole log as fetched, else the event's log tail.
    logs: Mapping[LogStage, str]
    #: The stage whose log was condensed: the failed stage's, or training's (else the last stage's)
    #: for a success.
    log_stage: LogStage | None
    condensed: CondensedLog
    rules: RulesOutcome
    #: Set when the candidate scores below the base model on validation (a criterion only for
    #: ``judge_policy=both``).
    below_baseline: str | None
    #: The paired comparison with the base model on the validation items, at judge_confidence_level.
    paired: PairedComparison | None
    #: Set when the candidate is not better than the base model beyond noise (a criterion only for
    #: ``judge_policy=significant``).
    not_beyond_noise: str | None
    #: Set when the benchmark stage's decision does not call it better than the base model (a criterion
    #: for ``judge_policy=better``, the default).
    not_better: str | None
    train_yaml: str
    #: train.yaml as LlamaFactory reads it (``1e-4`` is a float), empty when it cannot be read.
    config: Mapping[str, Any]
    config_problem: str | None
    #: The stage's own error message, when it says more than its exit code or timeout.
    stage_report: str | None
    #: The candidate against its campaign's incumbent, when the request names a campaign and the rules
    #: pass (set by ``decide.judge`` after reading the campaign: not a fact of the event alone).
    campaign: CampaignCheck | None = None

    @property
    def model_files(self) -> list[str]:
        return model_files_of(self.event)


# ---------------------------------------------------------------- the stages' runs and logs


def stage_runs(event: JudgedEvent) -> list[tuple[LogStage, StageOutcome]]:
    """The stages whose candidate code ran for this event, in pipeline order, each with its outcome."""
    return [(stage, run.outcome) for stage, run in event.runs.items() if run.outcome is not None]


def banner(stage: LogStage) -> str:
    """A stage's banner in ``raw_execution``, as the reference evaluator writes them
    (``=== DATA PROCESSING OUTPUT ===``)."""
    return f"=== {stage.replace('_', ' ').upper()} OUTPUT ==="


def default_log_stage(event: JudgedEvent, failed: str | None) -> LogStage | None:
    """Which stage's log the judge reads: the failed stage's, or for a success training's (what it
    says of the model that passed), else the last stage's."""
    if failed == FailedStage.precheck:
        return None
    if failed is not None:
        return failed
    return FailedStage.training if FailedStage.training in event.runs else own_stage(event)


def stage_timeout(event: JudgedEvent, stage: str | None) -> float | None:
    """The limit the failed stage ran under: the one recorded by the runner, else the one the request set."""
    if stage is None or stage == FailedStage.precheck:
        return None
    outcome = outcome_of(event, stage)
    if outcome is not None and outcome.timeout_s:
        return outcome.timeout_s
    return event.context.timeouts.of(stage)


# ---------------------------------------------------------------- the config


def parse_train_yaml(train_yaml: str | None) -> tuple[dict[str, Any], str | None]:
    """The config as LlamaFactory reads it, or an empty dict and why it could not be read."""
    if not train_yaml or not train_yaml.strip():
        return {}, "train.yaml is empty or missing"
    try:
        config = load_yaml(train_yaml, "train.yaml")
    except TrainYamlError as exc:
        return {}, exc.message
    if not isinstance(config, dict):
        return {}, "train.yaml is not a mapping of parameters"
    return config, None


def restates_exit(error: str | None) -> bool:
    """True when a stage's error message says no more than its exit code or timeout."""
    return bool(error and _RESTATES_EXIT.search(error))


# ---------------------------------------------------------------- collecting


_OVERSIZED_SHOWN = 2000  # characters of an oversized train.yaml that the judge still shows


def collect_facts(
    event: JudgedEvent, train_yaml: str, logs: Mapping[LogStage, str], settings: Settings
) -> JudgeFacts:
    """The facts of one judged event. ``logs``: each stage's whole log as the handler fetched it;
    a stage that ran but is missing there is represented by the log tail its event carries.

    Parses a multi-megabyte log: call it in a thread from async code.
    """
    rules = rules_decision(event)  # refuses a test-split event
    stage = rules.failed_stage
    by_stage: dict[LogStage, str] = {}
    for name, outcome in stage_runs(event):
        by_stage[name] = logs[name] if name in logs else outcome.log_tail
    log_stage = default_log_stage(event, stage)
    exit_code = rules.exit_code if rules.exit_code is not None else 1
    condensed = condense_log(by_stage.get(log_stage, "") if log_stage else "", exit_code, str(stage) if stage else None)
    outcome = outcome_of(event, stage)
    paired = paired_at(event, settings.judge_confidence_level)
    if len(train_yaml) > settings.max_train_yaml_bytes:
        # Parsing megabytes of YAML takes seconds of CPU, and none of it belongs in a prompt: the
        # precheck refused this config already. The judge keeps its head and says why.
        config, problem = {}, (f"train.yaml is {len(train_yaml)} characters, over the limit of "
                               f"{settings.max_train_yaml_bytes} bytes (max_train_yaml_bytes)")
        cut = len(train_yaml) - _OVERSIZED_SHOWN
        train_yaml = f"{train_yaml[:_OVERSIZED_SHOWN]}\n[... {cut} more characters cut]\n"
    else:
        config, problem = parse_train_yaml(train_yaml)
    return JudgeFacts(
        event=event,
        failed_stage=stage,
        outcome=RunFacts(
            exit_code=rules.exit_code,
            timed_out=rules.timed_out,
            oom_killed=bool(outcome and outcome.oom_killed) or condensed.oom_killed,
            duration_s=outcome.duration_s if outcome else None,
            timeout_s=stage_timeout(event, stage),
        ),
        logs=MappingProxyType(by_stage),
        log_stage=log_stage,
        condensed=condensed,
        rules=rules,
        below_baseline=baseline_shortfall(event),
        paired=paired,
        not_beyond_noise=noise_shortfall(event, paired, settings.judge_confidence_level),
        not_better=not_better(event),
        train_yaml=train_yaml,
        config=MappingProxyType(config),
        config_problem=problem,
        stage_report=None if restates_exit(event.error) else event.error,
    )


# ---------------------------------------------------------------- raw_execution


def render_raw_execution(facts: JudgeFacts) -> str:
    """The reference's raw_execution: each stage's output under its banner, in pipeline order."""
    event = facts.event
    if facts.failed_stage == FailedStage.precheck:
        return f"=== PRE-CHECK ===\n{event.error or 'workspace rejected'}"
    if facts.logs:
        return "\n".join(f"{banner(stage)}\n{text}" for stage, text in facts.logs.items())
    # No stage's code ran (a config refused before training, after cached data): the banners, empty.
    parts = []
    for stage in event.runs:
        text = ""
        if stage == FailedStage.data_processing and event.data.cached:
            text = f"(skipped: data.json reused from the cache, key {event.data.cache_key or 'unknown'})"
        parts.append(f"{banner(stage)}\n{text}")
    return "\n".join(parts)
