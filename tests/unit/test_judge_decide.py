"""The policy's bound: no LLM answer accepts what the measurements refuse (services/judge/decide.py)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import get_args

import pytest

from services.judge.decide import JudgePolicy, decide, measured_refusal
from services.judge.facts import JudgeFacts, collect_facts
from services.judge.rules import RulesOutcome
from shared.settings import Settings
from tests.fakes import judge_events as ev

POLICIES: tuple[JudgePolicy, ...] = get_args(JudgePolicy)


@pytest.fixture
def base_facts(tmp_path: Path) -> JudgeFacts:
    return collect_facts(ev.bench_result(), ev.TRAIN_YAML, {}, Settings(home=tmp_path))


def _facts(base: JudgeFacts, rules_pass: bool, below: bool, noise: bool, not_better: bool = True) -> JudgeFacts:
    rules = RulesOutcome(decision=rules_pass, failed_criteria=[] if rules_pass else ["training exited with code 1"],
                         failed_stage=None, exit_code=0, timed_out=False)
    return dataclasses.replace(base, rules=rules, below_baseline="below the base model" if below else None,
                               not_beyond_noise="not distinguishable from the base model" if noise else None,
                               not_better="not confirmed on the hidden pool" if not_better else None)


def test_no_llm_answer_accepts_what_the_measurements_refuse(base_facts: JudgeFacts) -> None:
    seen = 0
    for rules_pass, below, noise, not_better in itertools.product([True, False], repeat=4):
        facts = _facts(base_facts, rules_pass, below, noise, not_better)
        for policy, vote in itertools.product(POLICIES, [True, False, None]):
            decided = decide(facts, vote, policy)
            # Under every policy the rules bound the decision ("llm" included: the reference's meaning).
            if not rules_pass:
                assert decided.final is False and decided.overrides is not None
                assert decided.overrides.startswith("deterministic checks failed: training exited with code 1")
            # Under "both" and "significant" the measured check does too, whatever the LLM said.
            if policy == "both" and below:
                assert decided.final is False
            if policy == "significant" and noise:
                assert decided.final is False
            # Under "better" (the default) the decision does.
            if policy == "better" and not_better:
                assert decided.final is False
            refused = measured_refusal(facts, policy)
            if refused is not None:
                assert decided.final is False and decided.overrides == refused
            else:
                # Where nothing is refused, the LLM's vote is a veto at most (rules: not even that).
                assert decided.final is (vote is not False or policy == "rules")
            seen += 1
    assert seen == 16 * len(POLICIES) * 3


def test_the_measured_refusal_names_its_check(base_facts: JudgeFacts) -> None:
    assert measured_refusal(_facts(base_facts, True, True, True), "llm") is None  # llm: the rules only
    assert measured_refusal(_facts(base_facts, True, True, True), "rules") is None
    assert measured_refusal(_facts(base_facts, True, True, False), "both") == (
        "judge_policy=both requires the candidate not to score below the base model: below the base model")
    assert measured_refusal(_facts(base_facts, True, False, True), "significant") == (
        "judge_policy=significant requires the candidate to beat the base model beyond noise: "
        "not distinguishable from the base model")
    assert measured_refusal(_facts(base_facts, True, True, False), "significant") is None
    assert measured_refusal(_facts(base_facts, True, False, False), "better") == (
        "judge_policy=better accepts only a candidate better than the base model: not confirmed on the hidden pool")
    assert measured_refusal(_facts(base_facts, True, True, True, not_better=False), "better") is None
