"""Repeated runs: each item's outcome per run, read from lm-eval's repeats, and what is reported over
them (mean and standard error, pass@k for code, avg@n and maj@n for math), and the paired comparison
with the base model that the verdict states in words."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from evaluation.grading import grade_split
from evaluation.inference import InferenceConfig, InferenceError, inference_for
from evaluation.lmeval import parse_lm_eval_output, prepare_lm_eval_run, render_task_config, task_name
from evaluation.models import select_model
from evaluation.registry import BenchmarkError, load_benchmark
from evaluation.runs import effective_runs, run_stats
from evaluation.splits import make_split
from services.benchmark.service import baseline_key
from shared.events import BenchmarkScores
from shared.paired import compare_scores
from shared.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lmeval"
STAMP = "2026-12-02T10-00-00.000000"


def _benchmark(assets: Path, name: str, descriptor: dict[str, Any], items: list[dict[str, Any]]) -> None:
    folder = assets / "benchmarks" / name
    folder.mkdir(parents=True)
    (folder / "benchmark.yaml").write_text(yaml.safe_dump(
        {"name": name, "version": 1, "subsets": [{"name": "main", "file": "main.jsonl"}], **descriptor}))
    (folder / "main.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))


def _output(out: Path, task: str, rows: list[dict[str, Any]], value: float = 0.0) -> None:
    """lm-eval 0.4.13's layout; a repeated request logs ``resps`` as [[run 1, run 2, ...]]."""
    model_dir = out / "model"
    model_dir.mkdir(parents=True)
    (model_dir / f"results_{STAMP}.json").write_text(json.dumps(
        {"results": {task: {"alias": task, "exact_match,none": value}}}))
    (model_dir / f"samples_{task}_{STAMP}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(i: int, doc: dict[str, Any], runs: list[str]) -> dict[str, Any]:
    # lm-eval applies take_first: its filtered response and metric are the first run's.
    return {"doc_id": i, "doc": doc, "resps": [runs], "filtered_resps": [runs[0]], "exact_match": 0.0}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", assets_dir=tmp_path / "assets")


# ------------------------------------------------------------------ what is reported over runs


def test_pass_at_k_over_runs_is_the_unbiased_estimator() -> None:
    # Two items, 4 runs: 1 and 4 correct. pass@k = mean over items of 1 - C(n-c, k) / C(n, k).
    per_subset, overall = run_stats("code", {"s": {"a": [1.0, 0.0, 0.0, 0.0], "b": [1.0] * 4}})
    assert overall is not None and overall.num_runs == 4 and overall.items == 2
    expected = {k: (1 - math.comb(3, k) / math.comb(4, k) + 1.0) / 2 for k in (1, 2, 4)}
    assert overall.pass_at_k == pytest.approx({f"pass@{k}": v for k, v in expected.items()})
    assert overall.mean == pytest.approx((0.25 + 1.0) / 2)
    # Standard error over the two item means (0.25, 1.0): sd / sqrt(2).
    assert overall.stderr == pytest.approx(math.sqrt(((0.25 - 0.625) ** 2 + (1 - 0.625) ** 2) / 1 / 2))
    assert per_subset["s"] == overall


async def test_math_runs_give_avg_and_majority_vote(settings: Settings, tmp_path: Path) -> None:
    items = [{"id": f"q{i}", "question": f"{i} + {i}?", "answer": f"#### {2 * i}"} for i in range(4)]
    _benchmark(settings.assets, "g", {"kind": "generate_until", "scorer": "gsm8k", "primary_metric": "strict_match",
                                      "num_runs": 3}, items)
    spec = load_benchmark(settings.assets, "g")
    manifest = make_split(spec, "validation", 100)
    runs = {"q0": ["#### 0", "#### 0", "#### 7"],   # majority right, 2 of 3
            "q1": ["#### 2", "#### 9", "#### 9"]}   # majority wrong, 1 of 3
    rows = [_row(i, items[i], runs[f"q{i}"]) for i in range(2)]
    _output(tmp_path / "out", task_name("g", "main"), rows)
    scores = await grade_split(spec, manifest, tmp_path / "out", settings=settings,
                               inference=InferenceConfig(num_runs=3), tokenizer_dir=None)
    assert scores.num_runs == 3
    assert scores.item_scores == {"main": {"q0": [1.0, 1.0, 0.0], "q1": [1.0, 0.0, 0.0]}}
    # The summary is the mean over items and runs (avg@n), not the first run's.
    assert scores.accuracy_summary["main"]["strict_match"] == pytest.approx(0.5)
    overall = scores.overall
    assert overall is not None
    assert (overall.avg_at_n, overall.maj_at_n) == (pytest.approx(0.5), 0.5)
    # The judge is shown the first run's errors only: q0 and q1 were right in run 1.
    assert scores.error_samples == []


def test_lm_eval_scored_runs_are_all_scored(tmp_path: Path) -> None:
    """lm-eval's exact match takes only the first of repeated samples; every run is scored here."""
    spec = load_benchmark(FIXTURES / "assets", "tiny-arith")
    manifest = make_split(spec, "validation", 100)
    rows = []
    for i, item_id in enumerate(manifest.item_ids["addition"]):
        item = next(x for x in spec.items("addition") if x.id == item_id)
        rows.append(_row(i, item.model_dump(), [item.answer, " wrong", f" {item.answer} "]))
    out = tmp_path / "out"
    _output(out, task_name("tiny-arith", "addition"), rows, value=1.0)
    # A second subset answered right once in three runs: its own task and samples in the same folder.
    sub_rows = []
    for i, item_id in enumerate(manifest.item_ids["subtraction"]):
        item = next(x for x in spec.items("subtraction") if x.id == item_id)
        sub_rows.append(_row(i, item.model_dump(), ["no", "no", item.answer.upper()]))
    task = task_name("tiny-arith", "subtraction")
    results = json.loads((out / "model" / f"results_{STAMP}.json").read_text())
    results["results"][task] = {"alias": task, "exact_match,none": 0.0}
    (out / "model" / f"results_{STAMP}.json").write_text(json.dumps(results))
    (out / "model" / f"samples_{task}_{STAMP}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sub_rows))

    scores = parse_lm_eval_output(out, spec, manifest)
    assert scores.num_runs == 3
    assert all(v == [1.0, 0.0, 1.0] for v in scores.item_scores["addition"].values())
    assert all(v == [0.0, 0.0, 1.0] for v in scores.item_scores["subtraction"].values())
    assert scores.accuracy_summary["addition"]["exact_match"] == pytest.approx(2 / 3)
    assert scores.accuracy_summary["subtraction"]["exact_match"] == pytest.approx(1 / 3)
    assert any("over 3 runs" in note for note in scores.notes)


def test_one_run_keeps_lm_eval_s_own_per_item_scores() -> None:
    spec = load_benchmark(FIXTURES / "assets", "tiny-arith-mc")
    run = FIXTURES / "tiny-arith-mc-validation-base"
    manifest = make_split(spec, "validation", 100)
    scores = parse_lm_eval_output(run / "output", spec, manifest)
    assert scores.num_runs == 1
    for subset, metrics in scores.accuracy_summary.items():
        values = [v[0] for v in scores.item_scores[subset].values()]
        assert list(scores.item_scores[subset]) == manifest.item_ids[subset]
        assert sum(values) / len(values) == pytest.approx(metrics["acc"])
        assert scores.run_stats[subset].mean == pytest.approx(metrics["acc"])


# ------------------------------------------------------------------ how many runs, and how they are asked


def test_num_runs_from_the_request_then_the_benchmark(settings: Settings) -> None:
    _benchmark(settings.assets, "g", {"kind": "generate_until", "primary_metric": "exact_match", "num_runs": 4},
               [{"id": "a", "question": "q", "answer": "a"}, {"id": "b", "question": "q", "answer": "b"}])
    spec = load_benchmark(settings.assets, "g")
    assert effective_runs(spec, None) == (4, None)
    assert effective_runs(spec, 2) == (2, None)
    task = render_task_config(spec, "main", Path("/x.jsonl"), InferenceConfig(num_runs=4))
    assert task["repeats"] == 4
    assert "repeats" not in render_task_config(spec, "main", Path("/x.jsonl"), InferenceConfig())


def test_the_cold_path_batches_an_item_s_runs_too(tmp_path: Path) -> None:
    spec = load_benchmark(FIXTURES / "assets", "tiny-arith")
    manifest = make_split(spec, "validation", 100)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    model = select_model(model_dir, None)
    run = prepare_lm_eval_run(spec, manifest, tmp_path / "run", lm_eval="lm_eval", model=model,
                              inference=InferenceConfig(num_runs=4))
    assert run.argv[run.argv.index("--batch_size") + 1] == "4"
    task = yaml.safe_load((tmp_path / "run" / "tasks" / f"{run.tasks[0]}.yaml").read_text())
    assert task["repeats"] == 4


def test_log_likelihood_benchmarks_run_once(settings: Settings) -> None:
    spec = load_benchmark(FIXTURES / "assets", "tiny-arith-mc")
    runs, note = effective_runs(spec, 4)
    assert runs == 1 and note is not None and "log-likelihood" in note


def test_a_bad_num_runs_is_refused_with_what_to_do(settings: Settings) -> None:
    _benchmark(settings.assets, "g", {"kind": "generate_until", "primary_metric": "exact_match", "num_runs": 0},
               [{"id": "a", "question": "q", "answer": "a"}])
    with pytest.raises(BenchmarkError, match="num_runs"):
        load_benchmark(settings.assets, "g")
    model = settings.assets / "models" / "m"
    model.mkdir(parents=True)
    (model / "ftbus_inference.yaml").write_text("num_runs: 4\n")
    with pytest.raises(InferenceError, match=r"per benchmark .* or per request"):
        inference_for(settings, model)


def test_the_baseline_cache_keys_on_runs_and_sampling(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = load_benchmark(FIXTURES / "assets", "tiny-arith")
    manifest = make_split(spec, "validation", 100)
    greedy = baseline_key(model, manifest, "cpu", inference=InferenceConfig(greedy=True))
    keys = {
        greedy,
        baseline_key(model, manifest, "cpu", inference=InferenceConfig(greedy=True, num_runs=4)),
        baseline_key(model, manifest, "cpu", inference=InferenceConfig(num_runs=4)),
        baseline_key(model, manifest, "cpu", inference=InferenceConfig(num_runs=4, temperature=0.7)),
    }
    assert len(keys) == 4
    assert baseline_key(model, manifest, "cpu", inference=InferenceConfig(greedy=True)) == greedy


# ------------------------------------------------------------------ the paired comparison, in words


def _scores(items: dict[str, list[float]]) -> BenchmarkScores:
    return BenchmarkScores(primary_metric="m", num_runs=len(next(iter(items.values()))),
                           item_scores={"s": items})


def test_a_clear_improvement_is_called_better_with_its_interval() -> None:
    n = 60
    candidate = _scores({f"i{k}": [1.0 if k < 45 else 0.0] for k in range(n)})
    baseline = _scores({f"i{k}": [1.0 if k < 20 else 0.0] for k in range(n)})
    paired, words = compare_scores(candidate, baseline)
    assert paired is not None and paired.test == "mcnemar" and paired.items == n
    assert paired.difference == pytest.approx(25 / 60)
    assert paired.ci_low > 0 and paired.improves()
    assert words.startswith("better than the base model by +0.42 (95% CI +")
    assert words.endswith("two-sided p = 6e-08, threshold 0.05, 60 items); with 60 items and 25 of them differing, "
                          "the smallest "
                          f"improvement detectable at 80% power is {paired.detectable:+.2f}")


def test_noise_is_called_not_distinguishable() -> None:
    # Graded (3 runs per item), one item's worth of difference in 20: the betting test.
    candidate = _scores({f"i{k}": [1.0, 0.0, 1.0] if k == 0 else [0.0, 1.0, 0.0] for k in range(20)})
    baseline = _scores({f"i{k}": [0.0, 1.0, 0.0] for k in range(20)})
    paired, words = compare_scores(candidate, baseline)
    assert paired is not None and paired.test == "betting" and not paired.improves()
    assert words.startswith("not distinguishable from the base model (difference +0.02, 95% CI ")


def test_what_cannot_be_paired_says_why() -> None:
    a = _scores({"i0": [1.0], "i1": [0.0]})
    assert compare_scores(a, _scores({"i0": [1.0], "i2": [0.0]}))[0] is None
    assert "only in the candidate" in compare_scores(a, _scores({"i0": [1.0], "i2": [0.0]}))[1]
    assert "runs per item" in compare_scores(a, _scores({"i0": [1.0, 1.0], "i1": [0.0, 0.0]}))[1]
    assert "no per-item outcomes" in compare_scores(a, BenchmarkScores())[1]



def test_the_demo_and_the_verdict_view_print_the_comparison_in_words() -> None:
    from rich.console import Console

    from ftbus.demo import improvement_lines
    from ftbus.verdict_view import render_verdict
    from shared.events import BaselineComparison, Verdict, VerdictResult

    candidate = _scores({f"i{k}": [1.0 if k < 38 else 0.0] for k in range(40)})
    candidate = candidate.model_copy(update={"accuracy_summary": {"s": {"m": 0.95}}, "primary_value": 0.95})
    base = _scores({f"i{k}": [0.0] for k in range(40)}).model_copy(update={"accuracy_summary": {"s": {"m": 0.0}}})
    paired, words = compare_scores(candidate, base)
    verdict = Verdict(request_id="r1", status="completed", execution="", return_checking="", code="",
                      final_decision=True, result=VerdictResult(benchmark=candidate, baseline=BaselineComparison(
                          baseline=base, primary_metric="m", candidate_value=0.95, baseline_value=0.0,
                          difference=0.95, paired=paired, summary=words)))
    assert improvement_lines(verdict)[-1] == (
        "paired over the same items: better than the base model by +0.95 (95% CI +0.63 to +1.00, "
        "two-sided p = 7.3e-12, threshold 0.05, 40 items); with 40 items and 38 of them differing, "
        "the smallest improvement detectable at 80% power is +0.44")
    console = Console(record=True, width=300)
    render_verdict(console, verdict)
    assert f"paired: {words}" in console.export_text()


def test_a_request_asks_its_own_num_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ftbus.batch import TaskFileError, load_tasks
    from ftbus.cli import app

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"workspace": "a", "num_runs": 4}\n{"workspace": "b"}\n')
    loaded = load_tasks(tasks, {"base_model": "m", "benchmark": "b", "num_runs": 2})
    assert [t.task_spec().num_runs for t in loaded] == [4, 2]
    assert load_tasks(tasks, {"base_model": "m", "benchmark": "b", "num_runs": None})[1].task_spec().num_runs is None
    tasks.write_text('{"workspace": "a", "base_model": "m", "benchmark": "b", "num_runs": 17}\n')
    with pytest.raises(TaskFileError, match="num_runs"):
        load_tasks(tasks, {})
    refused = CliRunner().invoke(app, ["submit", str(tmp_path), "--base-model", "m", "--benchmark", "b",
                                       "--num-runs", "0"])
    assert refused.exit_code == 2 and "--num-runs" in refused.output
