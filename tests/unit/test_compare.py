"""`ftbus compare`'s logic without a server: the words, the numbers, and every refusal saying why."""

from __future__ import annotations

import json
import math
import re

import pytest
from typer.testing import CliRunner

from ftbus.cli import app
from ftbus.compare import NotComparable, RequestComparison, compare_verdicts, describe_details
from shared.events import BenchmarkScores, TaskSpec, Verdict, VerdictResult
from shared.records import RequestStatusView

TASK = TaskSpec(base_model="tiny-llama", benchmark="tiny-arith")


def _scores(values: list[float] | None, *, runs: int = 1, ids: list[str] | None = None,
            metric: str = "exact_match") -> BenchmarkScores:
    ids = ids or [str(i) for i in range(len(values or []))]
    items = {} if values is None else {"test": {i: [v] * runs for i, v in zip(ids, values, strict=True)}}
    mean = sum(values) / len(values) if values else None
    return BenchmarkScores(accuracy_summary={"test": {metric: mean or 0.0}}, primary_metric=metric,
                           primary_value=mean, num_runs=runs, item_scores=items)


def _side(rid: str, scores: BenchmarkScores | None, *, task: TaskSpec | None = TASK, status: str = "completed",
          failed: str | None = None) -> tuple[str, Verdict, RequestStatusView]:
    verdict = Verdict(request_id=rid, status=status, execution="", return_checking="", code="", final_decision=False,
                      failed_stage=failed, result=VerdictResult(benchmark=scores))
    return rid, verdict, RequestStatusView(request_id=rid, status=status, task=task)


def _refused(first: tuple, second: tuple, **kw: float) -> str:
    with pytest.raises(NotComparable) as info:
        compare_verdicts(first, second, **kw)
    return str(info.value)


def test_better_beyond_noise_in_words_with_mcnemars_exact_p() -> None:
    # 20 items: A right on all, B right on the first 10. The 10 discordant items all favour A:
    # McNemar's exact p = 2 * 0.5**10, computed here independently of the module.
    a = _side("A", _scores([1.0] * 20))
    b = _side("B", _scores([1.0] * 10 + [0.0] * 10))
    result = compare_verdicts(a, b)
    p = result.paired
    assert p.items == 20 and p.difference == pytest.approx(0.5) and p.test == "mcnemar"
    assert p.p_value == pytest.approx(2 * 0.5**10)
    assert p.candidate_only == 10 and p.baseline_only == 0
    assert 0 < p.ci_low <= 0.5 <= p.ci_high <= 1
    assert result.summary == (f"A is better than B by +0.50 (95% CI {p.ci_low:+.2f} to {p.ci_high:+.2f}, "
                              "two-sided p = 0.002, threshold 0.05, 20 items); with 20 items and 10 of them differing, "
                              "the smallest "
                              f"improvement detectable at 80% power is {p.detectable:+.2f}")
    assert result.benchmark == "tiny-arith" and result.base_models == ("tiny-llama", "tiny-llama")
    # The other way round: worse, by the same amount.
    back = compare_verdicts(b, a)
    assert back.summary.startswith("B is worse than A by -0.50 (95% CI ")
    assert back.paired.ci_high < 0
    details = describe_details(result)
    assert "A 1.0000, B 0.5000 over 20 shared items, 1 run per item" in details
    assert ("McNemar's exact test, with the exact interval built on the same binomial test, on 10 items only A "
            "got right, 0 only B") in details
    # Reproducible: the same comparison twice gives the same interval.
    assert compare_verdicts(a, b).paired == p
    # The decision function's validation answer, as the benchmark stage would give it: A screens in
    # (McNemar's one-sided p = 0.5**10), and B is worse than A (beyond noise on the worse side).
    assert result.decision == "screened" and result.decision_summary.startswith(
        f"decision: screened in against B on validation (+0.500, one-sided p = {0.5**10:.2g}, below the screen's 0.3)")
    assert back.decision == "worse" and back.decision_summary.startswith("decision: worse than A on validation")


def test_a_difference_inside_the_noise_is_not_distinguishable() -> None:
    # One item of 30 differs: p = 1 (McNemar), the interval covers 0.
    a = _side("A", _scores([1.0] * 16 + [0.0] * 14))
    b = _side("B", _scores([1.0] * 15 + [0.0] * 15))
    result = compare_verdicts(a, b)
    assert result.paired.ci_low <= 0 <= result.paired.ci_high
    assert re.fullmatch(r"A is not distinguishable from B \(difference \+0\.03, 95% CI -?\+?0\.\d\d to \+0\.\d\d, "
                        r"two-sided p = 1, threshold 0\.05, 30 items\); with 30 items and 1 of them differing, "
                        r"no improvement is "
                        r"detectable at 80% power", result.summary), result.summary
    assert result.decision == "indistinguishable" and "not below the screen's 0.3" in result.decision_summary


def test_graded_items_from_repeated_runs_use_the_betting_test_at_the_level_asked() -> None:
    def pair(items: int) -> tuple[BenchmarkScores, BenchmarkScores]:
        a_scores, b_scores = _scores([1.0] * items, runs=4), _scores([0.0] * items, runs=4)
        # Item means of 0.75 and 0.25: graded, so the betting test of the mean difference.
        for item in a_scores.item_scores["test"]:
            a_scores.item_scores["test"][item] = [1.0, 1.0, 1.0, 0.0]
            b_scores.item_scores["test"][item] = [0.0, 1.0, 0.0, 0.0]
        return a_scores, b_scores

    small = compare_verdicts(*(_side(name, s) for name, s in zip("AB", pair(12), strict=True)), level=0.99)
    assert small.paired.test == "betting" and small.paired.level == 0.99 and small.num_runs == 4
    # +0.50 on all 12 items, yet a difference of mean 0 gives that with probability (2/3)**12 = 0.0077 (+0.50
    # twice as often as -1.00): no valid test of the means can go below it, so at 99% it is not distinguishable.
    assert small.paired.p_value >= (2 / 3) ** 12
    assert small.summary.startswith("A is not distinguishable from B (difference +0.50, 99% CI ")
    large = compare_verdicts(*(_side(name, s) for name, s in zip("AB", pair(60), strict=True)), level=0.99)
    assert large.paired.p_value < 0.01
    assert large.summary.startswith("A is better than B by +0.50 (99% CI +")


def test_refused_without_a_verdict_saying_whether_the_request_is_unknown_or_still_running() -> None:
    good = _side("A", _scores([1.0, 0.0]))
    said = _refused(good, ("B", None, None))
    assert "unknown request B" in said
    said = _refused(good, ("B", None, RequestStatusView(request_id="B", status="running", task=TASK)))
    assert "B has no verdict yet (it is running)" in said and "ftbus status B" in said


def test_refused_without_validation_scores_or_per_item_outcomes() -> None:
    good = _side("A", _scores([1.0, 0.0]))
    said = _refused(good, _side("B", None, status="error", failed="train"))
    assert "B has no validation scores: its verdict is error (it failed at train)" in said
    said = _refused(_side("A", _scores(None)), _side("B", _scores([1.0, 0.0])))
    assert "A's verdict has no per-item outcomes" in said and "resubmit" in said


def test_refused_on_different_benchmarks_metrics_runs_or_items() -> None:
    a = _side("A", _scores([1.0, 0.0, 1.0]))
    other = TaskSpec(base_model="tiny-llama", benchmark="tiny-sentiment")
    said = _refused(a, _side("B", _scores([1.0, 0.0, 1.0]), task=other))
    assert "A ran benchmark tiny-arith, B ran tiny-sentiment" in said
    said = _refused(a, _side("B", _scores([1.0, 0.0, 1.0], metric="acc")))
    assert "A was scored by exact_match, B by acc" in said
    said = _refused(a, _side("B", _scores([1.0, 0.0, 1.0], runs=4)))
    assert "A ran 1 runs per item, B ran 4" in said and "--num-runs 4" in said
    said = _refused(a, _side("B", _scores([1.0, 0.0, 1.0], ids=["0", "1", "7"])))
    assert "A and B cannot be paired" in said
    assert "2 shared, 1 only in the candidate (e.g. test/2), 1 only in the baseline (e.g. test/7)" in said
    said = _refused(a, _side("B", _scores([1.0, 0.0, 1.0]), task=None))
    assert "which benchmark B ran is no longer known" in said


def test_refused_on_the_same_request_twice_or_a_level_outside_0_1() -> None:
    a = _side("A", _scores([1.0, 0.0]))
    assert "compare two different requests" in _refused(a, a)
    for level in (0.0, 1.0, 95.0):
        assert "a confidence level between 0 and 1" in _refused(a, _side("B", _scores([0.0, 1.0])), level=level)


def test_the_json_form_round_trips() -> None:
    result = compare_verdicts(_side("A", _scores([1.0] * 8)), _side("B", _scores([0.0] * 8)))
    again = RequestComparison.model_validate_json(result.model_dump_json())
    assert again == result
    data = json.loads(result.model_dump_json())
    assert {"first", "second", "benchmark", "paired", "summary", "num_runs"} <= set(data)
    assert math.isclose(data["paired"]["difference"], 1.0)


def test_cli_help_explains_and_a_bad_level_is_a_usage_error() -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["compare", "--help"], terminal_width=200)
    assert shown.exit_code == 0
    text = " ".join(shown.output.split())
    assert "shared validation items" in text and "never the hidden test split" in text
    assert "Exit 0 when compared" in text and "2 when refused" in text and "--level" in text and "--json" in text
    bad = runner.invoke(app, ["compare", "A", "B", "--level", "1.5"])
    assert bad.exit_code == 2
    assert "--level 1.5 is not a confidence level: a number below 1, at least 0.9" in " ".join(bad.output.split())
    # Below the floor: refused before anything connects, saying why.
    low = runner.invoke(app, ["compare", "A", "B", "--level", "0.5"])
    assert low.exit_code == 2
    assert "--level 0.5 is below the floor of 0.9: at such a level noise passes" in " ".join(low.output.split())
    missing = runner.invoke(app, ["compare", "A"])
    assert missing.exit_code == 2
