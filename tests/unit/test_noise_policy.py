"""judge_policy=significant: a candidate passes only when it beats the base model beyond noise on the
same validation items; the rules' feedback and the LLM's prompt carry the interval and the p-value."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.judge.decide import judge
from services.judge.facts import collect_facts
from services.judge.prompts import build_context, render_user
from shared.events import BaselineComparison, BenchmarkScores, BenchResult
from shared.paired import compare_scores
from shared.settings import Settings
from shared.untrusted import Fence
from tests.fakes import judge_events as ev

N = 60


def _scores(right: int, n: int = N) -> BenchmarkScores:
    return BenchmarkScores(
        accuracy_summary={"gsm8k": {"accuracy": right / n}}, primary_metric="accuracy", primary_value=right / n,
        item_scores={"gsm8k": {f"i{k:02d}": [1.0 if k < right else 0.0] for k in range(n)}},
    )


def _event(candidate_right: int, baseline_right: int = 20) -> BenchResult:
    candidate, base = _scores(candidate_right), _scores(baseline_right)
    paired, words = compare_scores(candidate, base)
    event = ev.bench_result(benchmark=candidate)
    baseline = BaselineComparison(baseline=base, primary_metric="accuracy", candidate_value=candidate.primary_value,
                                  baseline_value=base.primary_value,
                                  difference=(candidate_right - baseline_right) / N, paired=paired, summary=words)
    return event.model_copy(update={"baseline": baseline})


def _settings(tmp_path: Path, **values: object) -> Settings:
    values = {"judge_policy": "significant", **values}
    return Settings(home=tmp_path / "home", assets_dir=tmp_path / "assets", **values)  # type: ignore[arg-type]


async def test_a_clear_improvement_passes(tmp_path: Path) -> None:
    result = await judge(_event(45), ev.TRAIN_YAML, {}, _settings(tmp_path))
    assert result.feedback.final_decision is True
    assert "Paired over the same items, the candidate is better than the base model by +0.42 (95% CI +" \
        in result.feedback.return_checking


async def test_noise_is_refused_and_the_verdict_says_why(tmp_path: Path) -> None:
    result = await judge(_event(21), ev.TRAIN_YAML, {}, _settings(tmp_path))
    assert result.feedback.final_decision is False
    assert result.judge.rules_decision is True  # every stage ran fine: the policy refused it
    assert result.judge.reason is not None
    assert "beat the base model beyond noise: not distinguishable from the base model (difference +0.02" \
        in result.judge.reason
    assert "final_decision is false because judge_policy=significant" in result.feedback.return_checking


async def test_other_policies_leave_noise_to_the_writer(tmp_path: Path) -> None:
    result = await judge(_event(21), ev.TRAIN_YAML, {}, _settings(tmp_path, judge_policy="rules"))
    assert result.feedback.final_decision is True


async def test_no_baseline_means_no_improvement_shown(tmp_path: Path) -> None:
    event = _event(45).model_copy(update={"baseline": None})
    result = await judge(event, ev.TRAIN_YAML, {}, _settings(tmp_path))
    assert result.feedback.final_decision is False
    assert result.judge.reason is not None and "no baseline of the base model was measured" in result.judge.reason


@pytest.mark.parametrize(("level", "passes"), [(0.95, True), (0.99, False)])
def test_the_level_is_a_setting(tmp_path: Path, level: float, passes: bool) -> None:
    # 6 items better, none worse: McNemar's p = 2 / 2**6 = 0.031, beyond noise at 95% but not at 99%.
    event = _event(26)
    assert event.baseline is not None and event.baseline.paired is not None
    assert event.baseline.paired.p_value == pytest.approx(2 / 2**6)
    facts = collect_facts(event, ev.TRAIN_YAML, {}, _settings(tmp_path, judge_confidence_level=level))
    assert facts.paired is not None and facts.paired.level == level
    assert (facts.not_beyond_noise is None) is passes
    if level == 0.99:
        # Recomputed from the same per-item outcomes and seed: a wider interval than the stage's 95% one.
        assert facts.paired.ci_low <= event.baseline.paired.ci_low


def test_the_llm_prompt_gets_the_interval_and_p_value(tmp_path: Path) -> None:
    facts = collect_facts(_event(45), ev.TRAIN_YAML, {}, _settings(tmp_path))
    prompt = render_user(build_context(facts, Fence()))
    assert "Paired over the same 60 items, the candidate is better than the base model by +0.42" in prompt
    assert "95% interval of the difference [+0." in prompt
    assert "(McNemar's exact test, with the exact interval built on the same binomial test)" in prompt
