"""Repeated runs of a code benchmark: every run of every item runs in the code executor's containers,
each outcome is kept per run, and pass@k is the unbiased estimator over them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from evaluation.executor import CodeExecutor
from evaluation.grading import grade_split
from evaluation.inference import InferenceConfig
from evaluation.lmeval import task_name
from evaluation.registry import load_benchmark
from evaluation.splits import make_split
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

STAMP = "2026-12-02T10-00-00.000000"
ITEMS = [
    {"id": f"p{i}", "question": f"def f{i}(x):\n", "answer": "    return x + 1\n", "entry_point": f"f{i}",
     "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    for i in range(4)
]
RIGHT, WRONG = "    return x + 1\n", "    return x\n"


async def test_every_run_is_executed_and_pass_at_k_is_over_runs(tmp_path: Path) -> None:
    image = require_sandbox(Settings().code_exec_image or Settings().sandbox_image)
    assets = tmp_path / "assets"
    folder = assets / "benchmarks" / "code"
    folder.mkdir(parents=True)
    (folder / "benchmark.yaml").write_text(yaml.safe_dump({
        "name": "code", "version": 1, "kind": "generate_until", "scorer": "code", "code_style": "humaneval",
        "primary_metric": "pass@1", "num_runs": 3, "subsets": [{"name": "main", "file": "main.jsonl"}]}))
    (folder / "main.jsonl").write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    spec = load_benchmark(assets, "code")
    manifest = make_split(spec, "validation", 100)
    assert manifest.item_ids["main"] == ["p0", "p1"]
    # p0 passes in runs 1 and 3, p1 in none; lm-eval logs each item's repeats in one list.
    runs = {"p0": [RIGHT, WRONG, RIGHT], "p1": [WRONG, WRONG, WRONG]}
    out = tmp_path / "out" / "model"
    out.mkdir(parents=True)
    task = task_name("code", "main")
    (out / f"results_{STAMP}.json").write_text(json.dumps({"results": {task: {"alias": task}}}))
    rows = [{"doc_id": i, "doc": ITEMS[i], "resps": [runs[f"p{i}"]], "filtered_resps": [runs[f"p{i}"][0]]}
            for i in range(2)]
    (out / f"samples_{task}_{STAMP}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    # The limit is a hang guard: every sample ends at once (right or wrong), so no outcome depends on
    # how loaded the machine is.
    settings = Settings(home=tmp_path / "home", assets_dir=assets, code_exec_image=image, code_exec_timeout_s=60)
    scores = await grade_split(spec, manifest, tmp_path / "out", settings=settings,
                               inference=InferenceConfig(greedy=True, num_runs=3), tokenizer_dir=None,
                               executor=CodeExecutor.from_settings(settings))
    assert scores.item_scores == {"main": {"p0": [1.0, 0.0, 1.0], "p1": [0.0, 0.0, 0.0]}}, scores.error_samples
    assert scores.accuracy_summary == {"main": {"pass@1": pytest.approx(2 / 6)}}
    assert "code samples: 4 failed, 2 passed" in scores.notes, scores.notes  # all 6 runs were executed
    overall = scores.overall
    assert overall is not None and overall.num_runs == 3
    # Unbiased pass@k for p0 (n=3, c=2) averaged with p1's 0.
    assert overall.pass_at_k["pass@1"] == pytest.approx((2 / 3) / 2)
    assert overall.pass_at_k["pass@2"] == pytest.approx((1 - math.comb(1, 2) / math.comb(3, 2)) / 2)
    assert overall.pass_at_k["pass@3"] == pytest.approx(0.5)
    # The judge sees the first run's errors: p1 only (p0 passed its first run).
    assert [e.question for e in scores.error_samples] == [ITEMS[1]["question"]]
