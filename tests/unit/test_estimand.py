"""Issue 36, items 1, 2 and 5: one estimand, intervals that never contradict their test, and power.

Every number checked here is computed a second time in the test itself, by exact enumeration (binomial
tails as integer sums, every sign pattern, every outcome of a small experiment) or by simulation.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from evaluation.runs import run_stats
from shared.events import BenchmarkScores
from shared.paired import compare_scores
from shared.paired_tests import mcnemar_interval
from shared.power import detectable_difference
from shared.statistics import MIN_ITEMS, compare_paired, mean_stderr, stratum_weights

# ---------------------------------------------------------------- independent pieces


def binomial_p(b: int, c: int) -> Fraction:
    """McNemar's exact two-sided p: twice the smaller binomial tail at 1/2, capped at 1."""
    m = b + c
    if m == 0:
        return Fraction(1)
    return min(Fraction(1), Fraction(2 * sum(math.comb(m, i) for i in range(min(b, c) + 1)), 2**m))


def subset_scores(outcomes: dict[str, list[float]]) -> BenchmarkScores:
    """Scores as a benchmark reports them: one run per item, ``primary_value`` the mean of subset means."""
    items = {subset: {f"{subset}-{i:03d}": [v] for i, v in enumerate(values)} for subset, values in outcomes.items()}
    summary = {subset: {"acc": sum(values) / len(values)} for subset, values in outcomes.items()}
    per_subset, overall = run_stats("exact", items)
    return BenchmarkScores(accuracy_summary=summary, primary_metric="acc", item_scores=items, run_stats=per_subset,
                           overall=overall, primary_value=sum(m["acc"] for m in summary.values()) / len(summary))


# ---------------------------------------------------------------- item 1: one estimand


def constructed_case() -> tuple[BenchmarkScores, BenchmarkScores]:
    """Subsets of 10 and 190 items: the candidate loses all 10 of the small one and wins 28 more of the large."""
    base = {"small": [1.0] * 10, "large": [1.0] * 50 + [0.0] * 140}
    cand = {"small": [0.0] * 10, "large": [1.0] * 78 + [0.0] * 112}
    return subset_scores(cand), subset_scores(base)


def test_the_constructed_case_headline_and_test_measure_one_thing_and_it_is_not_accepted() -> None:
    candidate, baseline = constructed_case()
    headline = candidate.primary_value - baseline.primary_value
    assert headline == pytest.approx((-1.0 + 28 / 190) / 2)  # -0.43: the mean of the subsets' differences
    paired, words = compare_scores(candidate, baseline)
    assert paired is not None
    # The paired difference is the headline's, and so is the overall mean the leaderboard's interval uses.
    assert paired.difference == pytest.approx(headline, abs=1e-12)
    assert paired.weighting == "subsets" and paired.subsets == 2 and paired.test == "betting"
    assert candidate.overall is not None and candidate.overall.mean == pytest.approx(candidate.primary_value)
    assert paired.p_value < 0.05
    # The verdict: worse than the base model, so never accepted; interval, test and headline agree.
    assert paired.direction == "worse" and not paired.improves()
    assert paired.ci_low < headline < paired.ci_high < 0
    assert words.startswith("worse than the base model by -0.43 (95% CI -")
    # Pooling the items instead (every item weighing the same) would call it better: +18 items of 200.
    pooled = compare_paired(candidate.item_means(), baseline.item_means())
    assert pooled.difference == pytest.approx(18 / 200) and pooled.improves()


def test_the_significant_policy_refuses_the_constructed_case() -> None:
    from services.judge.rules import noise_shortfall, paired_at
    from shared.events import BaselineComparison
    from tests.fakes.judge_events import bench_result

    candidate, baseline = constructed_case()
    paired, words = compare_scores(candidate, baseline)
    event = bench_result(benchmark=candidate).model_copy(update={"baseline": BaselineComparison(
        baseline=baseline, primary_metric="acc", candidate_value=candidate.primary_value,
        baseline_value=baseline.primary_value, difference=candidate.primary_value - baseline.primary_value,
        paired=paired, summary=words)})
    at = paired_at(event, 0.95)
    reason = noise_shortfall(event, at, 0.95)
    assert reason is not None and reason.startswith("worse than the base model by -0.43")
    assert "detectable at 80% power" in reason


def test_equal_subsets_weigh_items_equally_and_keep_mcnemar() -> None:
    assert stratum_weights(["a", "a", "b", "b"]) == [0.25] * 4
    assert stratum_weights(["a", "b", "b", "b"]) == [0.5, 1 / 6, 1 / 6, 1 / 6]
    candidate = subset_scores({"x": [1.0] * 15 + [0.0] * 5, "y": [1.0] * 12 + [0.0] * 8})
    baseline = subset_scores({"x": [1.0] * 5 + [0.0] * 15, "y": [1.0] * 4 + [0.0] * 16})
    paired, _ = compare_scores(candidate, baseline)
    assert paired is not None and paired.test == "mcnemar" and paired.weighting == "items"
    assert paired.difference == pytest.approx(candidate.primary_value - baseline.primary_value)
    assert paired.p_value == pytest.approx(float(binomial_p(18, 0)))


# ---------------------------------------------------------------- item 2: consistent intervals


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_every_small_binary_dataset_has_an_interval_that_agrees_with_its_exact_test(level: float) -> None:
    # Every dataset of n <= 20 items, one run each, is (b, c): b items only the candidate got right, c only the
    # baseline. 0 is in the interval exactly when p >= 1 - level; the interval is never a point.
    checked = 0
    for n in range(1, 21):
        for b in range(n + 1):
            for c in range(n - b + 1):
                low, high = mcnemar_interval(b, c, n, level)
                p = binomial_p(b, c)
                assert (low <= 0.0 <= high) == (p >= Fraction(1) - Fraction(str(level))), (n, b, c, low, high, p)
                assert -1.0 <= low < high <= 1.0 and low <= (b - c) / n <= high
                checked += 1
    assert checked == sum((n + 1) * (n + 2) // 2 for n in range(1, 21))


def test_the_formerly_contradictory_and_zero_width_cases() -> None:
    # 6 of 6 better: no longer "95% CI +1.00 to +1.00", and flagged as too few items.
    six = compare_paired({str(i): 1.0 for i in range(6)}, {str(i): 0.0 for i in range(6)})
    assert six.ci_high - six.ci_low > 0.5 and six.too_few and not six.improves()
    assert six.describe().startswith("too few items to say against the base model (6 items, fewer than 10:")
    # Randomised small datasets through compare_paired (the bootstrap once excluded 0 here at p = 0.062).
    rng = random.Random(36)
    for _ in range(300):
        n = rng.randint(MIN_ITEMS, 40)
        cand = {str(i): float(rng.random() < 0.6) for i in range(n)}
        base = {str(i): float(rng.random() < 0.45) for i in range(n)}
        result = compare_paired(cand, base)
        assert (result.ci_low <= 0.0 <= result.ci_high) == (result.p_value >= 0.05)
        assert result.beyond_noise() == (result.p_value < 0.05)


def test_weighted_and_graded_intervals_agree_with_their_test() -> None:
    # Subsets of 2 and 4 items, every item's difference in {-1, 0, +1}: all 729 datasets (too few items to
    # call, but the interval and the p-value must still agree), then graded outcomes on 20 to 60 items.
    for diffs in itertools.product((-1.0, 0.0, 1.0), repeat=6):
        cand = {f"{'a' if i < 2 else 'b'}/{i}": max(d, 0.0) for i, d in enumerate(diffs)}
        base = {key: cand[key] - d for key, d in zip(cand, diffs, strict=True)}
        result = compare_paired(cand, base, strata={key: key[0] for key in cand})
        assert (result.ci_low <= 0.0 <= result.ci_high) == (result.p_value >= 0.05), diffs
        assert result.ci_low <= result.difference <= result.ci_high
    rng = random.Random(7)
    beyond = 0
    for _ in range(60):
        n = rng.randint(20, 60)
        base_values = [rng.randint(0, 4) / 4 for _ in range(n)]
        cand_values = [min(1.0, max(0.0, v + rng.choice((-0.25, 0.0, 0.25, 0.5)))) for v in base_values]
        result = compare_paired({str(i): v for i, v in enumerate(cand_values)},
                                {str(i): v for i, v in enumerate(base_values)})
        assert (result.ci_low <= 0.0 <= result.ci_high) == (result.p_value >= 0.05)
        beyond += result.p_value < 0.05
    assert 0 < beyond < 60  # both sides of the equivalence are exercised


@pytest.mark.parametrize(("n", "psi", "delta"), [(30, 0.3, 0.0), (30, 0.3, 0.15), (40, 0.1, 0.05), (25, 0.6, 0.3)])
def test_the_binary_interval_covers_at_least_its_level_exactly(n: int, psi: float, delta: float) -> None:
    # Exact coverage: every (b, c) an experiment of n items can give, weighed by its multinomial probability.
    p10, p01 = (psi + delta) / 2, (psi - delta) / 2
    coverage = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            prob = (math.comb(n, b) * math.comb(n - b, c) * p10**b * p01**c * (1 - psi) ** (n - b - c))
            low, high = mcnemar_interval(b, c, n, 0.95)
            coverage += prob * (low <= delta <= high)
    assert coverage >= 0.95, coverage


def test_a_standard_error_needs_two_values() -> None:
    assert mean_stderr([0.7]) == (0.7, None)
    per_subset, overall = run_stats("exact", {"a": {"x": [1.0]}, "b": {"y": [1.0], "z": [0.0]}})
    assert per_subset["a"].stderr is None and per_subset["b"].stderr == pytest.approx(0.5)
    assert overall is not None and overall.stderr is None and overall.mean == pytest.approx(0.75)
    _, both = run_stats("exact", {"a": {"x": [1.0], "w": [0.0]}, "b": {"y": [1.0], "z": [0.0], "v": [1.0]}})
    se_a, se_b = mean_stderr([1.0, 0.0])[1], mean_stderr([1.0, 0.0, 1.0])[1]
    assert both is not None and both.stderr == pytest.approx(math.sqrt(se_a**2 + se_b**2) / 2)


def test_the_confidence_level_has_a_floor_of_0_9() -> None:
    from pydantic import ValidationError

    from shared.settings import Settings

    with pytest.raises(ValidationError, match=r"judge_confidence_level 0\.5 is below the floor of 0\.9: at such a "
                       r"level noise passes for an improvement"):
        Settings(judge_confidence_level=0.5)
    with pytest.raises(ValidationError, match=r"judge_confidence_level 0\.89 is below the floor of 0\.9"):
        Settings(judge_confidence_level=0.89)
    with pytest.raises(ValidationError, match=r"judge_confidence_level 1\.0 is not a confidence level"):
        Settings(judge_confidence_level=1.0)
    assert Settings(judge_confidence_level=0.9).judge_confidence_level == 0.9
    # The same floor wherever a comparison is made: the case, 3 better items of 40 (p = 0.25).
    cand = {str(i): 1.0 if i < 3 else 0.0 for i in range(40)}
    base = {str(i): 0.0 for i in range(40)}
    with pytest.raises(ValueError, match=r"level 0\.5 is below the floor of 0\.9"):
        compare_paired(cand, base, level=0.5)
    assert compare_paired(cand, base, level=0.9).p_value == pytest.approx(float(binomial_p(3, 0)))
    assert not compare_paired(cand, base, level=0.9).improves()


# ---------------------------------------------------------------- item 5: power


def exact_power(m: int, pi: float, alpha: float = 0.05) -> float:
    """P(McNemar's p < alpha) when each of m disagreements favours the candidate with probability pi."""
    return sum(math.comb(m, b) * pi**b * (1 - pi) ** (m - b) for b in range(m + 1) if binomial_p(b, m - b) < alpha)


@pytest.mark.parametrize(("items", "share"), [(200, 0.2), (40, 0.3), (100, 0.5), (500, 0.1)])
def test_the_detectable_difference_has_80_percent_power_and_no_less_would(items: int, share: float) -> None:
    delta = detectable_difference(items, share)
    assert delta is not None and delta > 0
    m = round(items * share)
    pi = (1 + delta * items / m) / 2
    assert exact_power(m, pi) >= 0.8 - 1e-9
    assert exact_power(m, pi - 0.005) < 0.8
    # And by simulation: the m disagreements split at random, McNemar's test on each draw.
    wins = np.random.default_rng(5).binomial(m, pi, size=4000)
    rejected = float(np.mean([binomial_p(int(b), m - int(b)) < 0.05 for b in wins]))
    assert abs(rejected - exact_power(m, pi)) < 0.025 and rejected > 0.77, rejected


def test_with_40_items_and_few_disagreements_nothing_is_detectable() -> None:
    # The sentence: with 40 items, no improvement is detectable when they disagree on <= 10%.
    for share in (0.0, 0.05, 0.1):
        assert detectable_difference(40, share) is None
    result = compare_paired({str(i): 1.0 if i < 3 else 0.0 for i in range(40)}, {str(i): 0.0 for i in range(40)})
    assert result.detectable is None and result.disagreement == pytest.approx(3 / 40)
    assert result.describe_power() == (
        "with 40 items and 3 of them differing, no improvement is detectable at 80% power")


def test_the_graded_detectable_difference_matches_a_simulation() -> None:
    # What a graded comparison says it could detect at 80% power: simulate the test at that shift.
    rng = np.random.default_rng(11)
    n = 200
    base = rng.random(n) * 0.6 + 0.2
    first = compare_paired({str(i): float(base[i] + rng.normal(0, 0.2)) for i in range(n)},
                           {str(i): float(base[i]) for i in range(n)}, seed=0)
    delta = first.detectable
    assert delta is not None and 0 < delta < 0.5
    rejected = 0
    trials = 200
    for t in range(trials):
        cand = np.clip(base + delta + rng.normal(0, 0.2, n), 0, 1)
        result = compare_paired({str(i): float(cand[i]) for i in range(n)}, {str(i): float(base[i]) for i in range(n)},
                                seed=t)
        rejected += result.p_value < 0.05
    assert 0.65 < rejected / trials < 0.97, rejected / trials


def test_benchmarks_ls_states_the_detectable_improvement_of_the_default_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from ftbus.cli import app
    from shared.power import detectable_for_sizes, effective_items

    # The estimand's effective items are Kish's 1 / sum w^2 of its own weights, computed here from the weights.
    for sizes in ([100], [100, 100], [10, 6], [3, 100], [57] * 5):
        weights = stratum_weights([f"s{k}" for k, n in enumerate(sizes) for _ in range(n)])
        assert effective_items(sizes) == round(1 / sum(w * w for w in weights))
    # One subset, or subsets of one size: exactly McNemar's power on all the items.
    assert detectable_for_sizes([100, 100], 0.2) == detectable_difference(200, 0.2)
    assert detectable_for_sizes([10, 6], 0.3) is None  # 16 items: nothing detectable (the tiny benchmarks)

    bench = tmp_path / "assets" / "benchmarks" / "two"
    bench.mkdir(parents=True)
    (bench / "benchmark.yaml").write_text(
        "name: two\nversion: 1\nkind: generate_until\nprimary_metric: exact_match\nhigher_is_better: true\n"
        "subsets:\n- name: a\n  file: a.jsonl\n- name: b\n  file: b.jsonl\n")
    for subset in ("a", "b"):
        (bench / f"{subset}.jsonl").write_text(
            "".join(json.dumps({"id": f"{subset}{i}", "question": f"q{i}", "answer": "1"}) + "\n" for i in range(400)))
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    listed = CliRunner().invoke(app, ["benchmarks", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    power = row["power"]
    assert power["validation_items"] == 200 and power["effective_items"] == 200
    # Independently: the exact power of McNemar's test at the stated improvement is 80%, and no less would do.
    for share, delta in power["detectable"].items():
        m = round(200 * float(share))
        pi = (1 + delta * 200 / m) / 2
        assert exact_power(m, pi) >= 0.8 - 1e-9 and exact_power(m, pi - 0.005) < 0.8
    table = CliRunner().invoke(app, ["benchmarks", "ls", "-o", "plain"])
    assert table.exit_code == 0
    header, line = table.stdout.splitlines()[:2]
    start = header.index("detectable")  # plain columns: each cell starts where its header does
    assert line[start:].split()[0] == "/".join(f"+{d:.2f}" for d in power["detectable"].values())


def test_an_interval_that_holds_zero_has_no_negative_zero_end() -> None:
    # tiny-arith's shape: subsets of 10 and 6 items; the candidate right on every 2nd, the base on every 4th.
    cand = subset_scores({"d": [float(i % 2 == 0) for i in range(10)], "h": [float(i % 2 == 0) for i in range(6)]})
    base = subset_scores({"d": [float(i % 4 == 0) for i in range(10)], "h": [float(i % 4 == 0) for i in range(6)]})
    paired, _ = compare_scores(cand, base)
    assert paired is not None and paired.ci_low <= 0.0 <= paired.ci_high
    assert f"{paired.ci_low:+.4f}" != "-0.0000" and f"{paired.ci_high:+.4f}" != "-0.0000"
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(MIN_ITEMS, 30)
        result = compare_paired({str(i): float(rng.random() < 0.5) for i in range(n)},
                                {str(i): float(rng.random() < 0.5) for i in range(n)},
                                strata={str(i): "ab"[i % 3 == 0] for i in range(n)})
        for end in (result.ci_low, result.ci_high):
            assert not -1e-12 < end < 0.0 and not (end == 0.0 and math.copysign(1.0, end) < 0), end
