"""`ftbus get ID --format lm-eval`: a verdict's validation results in lm-eval's results-file schema,
read back by lm-eval's own table printer (the toolchain's lm-eval, as scripts built on it would)."""

from __future__ import annotations

import json
import subprocess

import pytest

from ftbus.lmeval_format import NoResults, lm_eval_results
from shared.events import BenchmarkScores, RunStats, TaskSpec, Verdict, VerdictResult
from shared.records import RequestStatusView
from shared.settings import Settings

SCORES = BenchmarkScores(
    accuracy_summary={"food": {"exact_match": 0.95}, "films": {"exact_match": 0.9}},
    primary_metric="exact_match", primary_value=0.925, scorer="exact", seed=1234,
    item_ids={"food": [f"f{i}" for i in range(20)], "films": [f"m{i}" for i in range(20)]},
    run_stats={"food": RunStats(items=20, num_runs=1, mean=0.95, stderr=0.05),
               "films": RunStats(items=20, num_runs=1, mean=0.9, stderr=0.0688)},
    overall=RunStats(items=40, num_runs=1, mean=0.925, stderr=0.0422),
)
VERDICT = Verdict(request_id="r1", status="completed", execution="", return_checking="", code="",
                  final_decision=True, result=VerdictResult(benchmark=SCORES))
VIEW = RequestStatusView(request_id="r1", status="completed",
                         task=TaskSpec(base_model="tiny-llama", benchmark="tiny-sentiment"))


def test_the_file_has_lm_evals_keys_and_shapes() -> None:
    out = lm_eval_results(VERDICT, VIEW, version=1)
    food = "ftbus_tiny_sentiment_food"
    assert {"results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
            "n-samples", "config", "date", "model_name"} <= set(out)
    assert out["results"][food] == {"name": food, "alias": "food", "sample_len": 20, "exact_match,none": 0.95,
                                    "exact_match_stderr,none": 0.05}
    assert out["versions"] == {food: 1, "ftbus_tiny_sentiment_films": 1}
    assert out["n-shot"][food] == 0 and out["higher_is_better"][food] == {"exact_match": True}
    assert out["n-samples"][food] == {"original": 20, "effective": 20}
    assert out["groups"]["ftbus_tiny_sentiment"]["exact_match,none"] == 0.925
    assert sorted(out["group_subtasks"]["ftbus_tiny_sentiment"]) == sorted(out["results"])
    assert out["config"]["model_args"] == "request_id=r1,base_model=tiny-llama"
    assert out["config"]["random_seed"] == 1234
    json.dumps(out)  # plain JSON


def test_a_verdict_without_validation_results_is_refused() -> None:
    failed = VERDICT.model_copy(update={"result": VerdictResult(), "final_decision": False,
                                        "failed_stage": "training"})
    with pytest.raises(NoResults, match=r"r1 has no validation results .*failed at training"):
        lm_eval_results(failed, VIEW)


def test_lm_evals_own_table_reads_it() -> None:
    toolchain = Settings().toolchain_path()
    if toolchain is None or not (toolchain / "lm_eval").exists():
        pytest.skip("the toolchain (lm-eval) is not installed: run `make toolchain`")
    script = ("import json, sys; from lm_eval.utils import make_table; r = json.load(sys.stdin); "
              "print(make_table(r)); print(make_table(r, 'groups'))")
    results = json.dumps(lm_eval_results(VERDICT, VIEW, 1))
    proc = subprocess.run([str(toolchain / "python"), "-c", script], input=results, capture_output=True, text=True,
                          timeout=120, check=False)  # a hang guard
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if "exact_match" in line]
    assert any("food" in r and "0.95" in r and "0.05" in r for r in rows), proc.stdout
    assert any("films" in r and "0.9" in r for r in rows), proc.stdout
    assert any("tiny-sentiment" in r and "0.925" in r for r in rows), proc.stdout
