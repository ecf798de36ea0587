"""The judge's facts: computed once per judged event, raw_execution rendered from them, the config
read as LlamaFactory reads it, and each judge_policy with its own effect on the decision."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from services.judge import condense, rules
from services.judge.advice import rules_feedback
from services.judge.decide import JudgePolicy, decide, judge
from services.judge.facts import JudgeFacts, collect_facts, render_raw_execution
from shared.events import DataSummary, DecisionView, FailedStage
from shared.settings import Settings
from tests.fakes import judge_events as ev
from tests.fakes.judge_events import OOM_LOG

YAML_1E = ev.TRAIN_YAML.replace("learning_rate: 1.0e-4", "learning_rate: 1e-4")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path)


def _counting(monkeypatch: pytest.MonkeyPatch, name: str, original: Any) -> list[int]:
    """Count calls of ``name`` wherever a judge module holds it."""
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("services.judge") and getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, counted)
    return calls


# ---------------------------------------------------------------- computed once


@pytest.mark.parametrize(
    "event",
    [ev.bench_result(), ev.train_failed(1, OOM_LOG), ev.data_failed(124, "gen 17\n"), ev.precheck_failed()],
    ids=["success", "training failed", "data timed out", "pre-check"],
)
async def test_rules_and_condensing_run_once_per_judged_event(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, event: Any
) -> None:
    decisions = _counting(monkeypatch, "rules_decision", rules.rules_decision)
    condensings = _counting(monkeypatch, "condense_log", condense.condense_log)
    result = await judge(event, ev.TRAIN_YAML, {}, settings)  # no judge model: the rules write the feedback
    assert len(decisions) == 1 and len(condensings) == 1
    assert result.judge.kind == "rules" and result.judge.rules_decision is (event.failed_stage is None)


def test_facts_of_a_failed_training(settings: Settings) -> None:
    event = ev.train_failed(137, "")
    facts = collect_facts(event, ev.TRAIN_YAML, {"training": OOM_LOG}, settings)
    assert facts.failed_stage == FailedStage.training and facts.log_stage == "training"
    assert facts.outcome.exit_code == 137 and facts.outcome.oom_killed and not facts.outcome.timed_out
    assert facts.outcome.duration_s == 12.5 and facts.outcome.timeout_s == 360000.0
    assert list(facts.logs) == ["data_processing", "training"]  # pipeline order; no benchmark ran
    assert facts.logs["training"] == OOM_LOG  # as fetched
    assert facts.logs["data_processing"] == "wrote 1234 samples to data.json\n"  # not fetched: the tail
    assert facts.condensed.cuda_oom and facts.condensed.exit_code == 137
    assert not facts.rules.decision and "training exited with code 137" in facts.rules.failed_criteria
    assert facts.stage_report is None  # "training exited with code 137" says no more than the exit code
    assert facts.config["per_device_train_batch_size"] == 8
    with pytest.raises(AttributeError):
        facts.failed_stage = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        facts.logs["training"] = "changed"  # type: ignore[index]


def test_a_banner_inside_a_log_is_only_text(settings: Settings) -> None:
    """Nothing splits a combined log: a line that looks like a banner cannot move the judge's reading."""
    data_log = "=== TRAINING OUTPUT ===\nTraceback (most recent call last):\nFakeError: printed by process_data.py\n"
    facts = collect_facts(ev.train_failed(1, OOM_LOG), ev.TRAIN_YAML, {"data_processing": data_log}, settings)
    assert facts.condensed.error is not None and "torch.OutOfMemoryError" in facts.condensed.error
    assert "FakeError" not in facts.condensed.error
    assert render_raw_execution(facts) == (
        f"=== DATA PROCESSING OUTPUT ===\n{data_log}\n=== TRAINING OUTPUT ===\n{OOM_LOG}"
    )


# ---------------------------------------------------------------- raw_execution


def test_raw_execution_has_every_stage_under_its_banner(settings: Settings) -> None:
    logs = {"data_processing": "d1\nd2\n", "training": "t1\nTraining completed.\n", "benchmark": "b1"}
    facts = collect_facts(ev.bench_result(), ev.TRAIN_YAML, logs, settings)
    assert render_raw_execution(facts) == (
        "=== DATA PROCESSING OUTPUT ===\nd1\nd2\n\n"
        "=== TRAINING OUTPUT ===\nt1\nTraining completed.\n\n"
        "=== BENCHMARK OUTPUT ===\nb1"
    )


def test_raw_execution_falls_back_to_each_stage_tail(settings: Settings) -> None:
    facts = collect_facts(ev.bench_result(log="scored 2 items\n"), ev.TRAIN_YAML, {}, settings)
    assert render_raw_execution(facts) == (
        "=== DATA PROCESSING OUTPUT ===\nwrote 1234 samples to data.json\n\n"
        "=== TRAINING OUTPUT ===\nTraining completed.\n\n"
        "=== BENCHMARK OUTPUT ===\nscored 2 items\n"
    )


def test_raw_execution_of_a_precheck_and_of_nothing_run(settings: Settings) -> None:
    facts = collect_facts(ev.precheck_failed("unsafe path: ../x"), "", {}, settings)
    assert render_raw_execution(facts) == "=== PRE-CHECK ===\nunsafe path: ../x"
    assert facts.logs == {} and facts.log_stage is None and facts.outcome.exit_code is None

    # Cached data (nothing ran) and a config refused before training started: the banners, empty.
    event = ev.train_failed(1, "")
    event.data = DataSummary(cached=True, cache_key="k1")
    event.runs["data_processing"].outcome = event.runs["training"].outcome = None
    facts = collect_facts(event, ev.TRAIN_YAML, {}, settings)
    assert render_raw_execution(facts) == (
        "=== DATA PROCESSING OUTPUT ===\n(skipped: data.json reused from the cache, key k1)\n=== TRAINING OUTPUT ===\n"
    )


# ---------------------------------------------------------------- train.yaml, read as LlamaFactory reads it


def test_learning_rate_1e_4_is_a_float(settings: Settings) -> None:
    facts = collect_facts(ev.bench_result(), YAML_1E, {}, settings)
    assert facts.config_problem is None
    assert isinstance(facts.config["learning_rate"], float) and facts.config["learning_rate"] == 1e-4
    assert "learning_rate=0.0001," in rules_feedback(facts).code


def test_train_yaml_problems_are_named(settings: Settings) -> None:
    twice = ev.TRAIN_YAML + "learning_rate: 2e-4\n"
    facts = collect_facts(ev.bench_result(), twice, {}, settings)
    assert facts.config == {} and facts.config_problem is not None
    assert "'learning_rate' appears twice" in facts.config_problem
    assert rules_feedback(facts).code.startswith("train.yaml is not valid YAML")

    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, n in zip("abcdef", "bcdefg", strict=True)
    )
    assert "alias bomb" in (collect_facts(ev.bench_result(), bomb, {}, settings).config_problem or "")
    assert collect_facts(ev.bench_result(), "", {}, settings).config_problem == "train.yaml is empty or missing"
    assert collect_facts(ev.bench_result(), "- 1\n", {}, settings).config_problem == (
        "train.yaml is not a mapping of parameters"
    )



def test_an_oversized_train_yaml_is_not_parsed_nor_sent_whole(settings: Settings) -> None:
    huge = ev.TRAIN_YAML + "".join(f"k{i}: {'v' * 90}\n" for i in range(100_000))  # ~10 MB
    facts = collect_facts(ev.precheck_failed("train.yaml is too big"), huge, {}, settings)
    assert facts.config == {}
    assert facts.config_problem is not None and "max_train_yaml_bytes" in facts.config_problem
    assert len(facts.train_yaml) < 4000 and "more characters cut" in facts.train_yaml


# ---------------------------------------------------------------- judge_policy


def test_policy_values_are_the_settings_values() -> None:
    assert set(get_args(JudgePolicy)) == set(get_args(Settings.model_fields["judge_policy"].annotation))
    assert Settings.model_fields["judge_policy"].default == "better"


def _below_base(settings: Settings) -> JudgeFacts:
    event = ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.30}}))
    return collect_facts(event, ev.TRAIN_YAML, {}, settings)


def test_below_baseline_is_a_measured_fact(settings: Settings) -> None:
    facts = _below_base(settings)
    assert facts.rules.decision  # every rule passes: the baseline is no rule
    assert facts.below_baseline == (
        "validation gsm8k/accuracy = 0.3 is below the base model's 0.45 (higher is better)"
    )
    assert collect_facts(ev.bench_result(), ev.TRAIN_YAML, {}, settings).below_baseline is None  # 0.52 > 0.45
    tie = ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.45}}))
    assert collect_facts(tie, ev.TRAIN_YAML, {}, settings).below_baseline is None
    no_base = ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.30}}))
    no_base.baseline = None  # the baseline run failed: nothing to compare, never a failure
    assert collect_facts(no_base, ev.TRAIN_YAML, {}, settings).below_baseline is None


def test_each_policy_decides_its_own_way(settings: Settings) -> None:
    """The decision table of each policy, when every rule passes: three different tables."""
    above = collect_facts(ev.bench_result(), ev.TRAIN_YAML, {}, settings)
    below = _below_base(settings)
    situations = [(facts, llm) for facts in (above, below) for llm in (True, False, None)]
    tables = {
        policy: tuple(decide(facts, llm, policy).final for facts, llm in situations)
        for policy in get_args(JudgePolicy)
    }
    #                   above: LLM true, false, none | below: LLM true, false, none
    assert tables["rules"] == (True, True, True, True, True, True)
    assert tables["llm"] == (True, False, True, True, False, True)
    assert tables["both"] == (True, False, True, False, False, False)
    # No decision was made (these events carry none): nothing is shown better, whatever the LLM says.
    assert tables["better"] == (False, False, False, False, False, False)


def test_better_accepts_what_the_decision_calls_better_and_the_llm_does_not_veto(settings: Settings) -> None:
    def facts_with(answer: str) -> JudgeFacts:
        decision = DecisionView(answer=answer, summary=f"{answer} than the base model", reference="the base model",
                                owner="everyone", validation_items=40, validation_difference=0.1, screened=True)
        event = ev.bench_result().model_copy(update={"decision": decision})
        return collect_facts(event, ev.TRAIN_YAML, {}, settings)

    better = facts_with("better")
    assert better.not_better is None
    assert [decide(better, llm, "better").final for llm in (True, False, None)] == [True, False, True]
    for answer in ("indistinguishable", "worse"):
        facts = facts_with(answer)
        for llm in (True, False, None):
            decided = decide(facts, llm, "better")
            assert decided.final is False
            assert decided.overrides == ("judge_policy=better accepts only a candidate better than the base model: "
                                         f"{answer} than the base model")


@pytest.mark.parametrize("policy", get_args(JudgePolicy))
@pytest.mark.parametrize("llm", [True, False, None])
def test_no_policy_passes_a_failed_rule(settings: Settings, policy: JudgePolicy, llm: bool | None) -> None:
    facts = collect_facts(ev.bench_result(model_files=[]), ev.TRAIN_YAML, {}, settings)
    decided = decide(facts, llm, policy)
    assert decided.final is False
    assert decided.overrides == "deterministic checks failed: no model files in the training output"


@pytest.mark.parametrize(("policy", "final"), [("both", False), ("llm", True), ("rules", True)])
async def test_without_an_llm_only_both_applies_the_baseline(tmp_path: Path, policy: str, final: bool) -> None:
    event = ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.30}}))
    result = await judge(event, ev.TRAIN_YAML, {}, Settings(home=tmp_path, judge_policy=policy))
    assert result.judge.kind == "rules" and result.judge.rules_decision is True
    assert result.feedback.final_decision is final
    assert "does not beat the base model" in result.feedback.code  # the advice is the same for all
    if final:
        assert result.judge.reason == "no judge model configured"
    else:
        assert result.judge.reason is not None and result.judge.reason.startswith("no judge model configured; ")
        assert "below the base model's 0.45" in result.judge.reason
        assert "[ftbus] Note: final_decision is false because judge_policy=both" in result.feedback.return_checking
