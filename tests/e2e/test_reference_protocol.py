"""The reference protocol beside lm-eval's own CLI (pinned 0.4.13), on the same model and the same files.

For gsm8k, minerva math, MMLU, AIME 2024, HumanEval and MBPP, small files in the hub sources' schemas
(tests/fixtures/reference: a few items each) are imported by ftbus (`benchmarks import`), and:

- ftbus's reference protocol generates on the tiny model (evaluation/reference.py: one ``lm_eval``
  process, tasks that include lm-eval's own YAMLs, the data written back from ftbus's items);
- lm-eval's CLI runs its own task YAMLs on the fixture files themselves (``include:`` +
  ``dataset_path: json``/``data_files``, as lm-eval documents local data), all six in one process; the
  code tasks with their metric set to ``bypass`` (what ``--predict_only`` does to every task of a run,
  here to those two only): lm-eval would run the model's code in its own process, and model code runs
  only in ftbus's code executor;
- every rendered prompt (lm-eval's logged ``arguments``: the prompt and its generation settings), every
  response and every per-item metric of ftbus's scorer must equal lm-eval's; for code, the program
  ftbus runs must be byte for byte the one lm-eval's code_eval would run;
- lm-eval scores planted answers (a scripted model: right, wrong, ``\\boxed 5``, ``\\fbox``, ``#### 1,000``,
  fenced code), and ftbus, rescoring lm-eval's samples files, gives the same per-item metric; the planted
  code runs in lm-eval's code_eval (the test's own code, HF evaluate's metric vendored in
  tests/fixtures/code_eval, as lm-eval loads it from the hub) and in ftbus's code executor.

Both sides cap generation at MAX_GEN_TOKS (``--gen_kwargs``, the same on both): the tiny model never
stops by itself, and the logged arguments show the cap on both sides alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from filelock import FileLock

from evaluation.importer import import_benchmark
from evaluation.reference import (
    REFERENCE,
    ReferenceRun,
    lm_eval_tasks_dir,
    read_samples_file,
    reference_program,
    run_reference,
    sample_response,
    score_samples_files,
)
from evaluation.registry import BenchmarkSpec, load_benchmark
from shared.offline import OFFLINE_ENV

# Two lm_eval processes (ftbus's, lm-eval's CLI) start together, then the planted run: minutes on 2 busy cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "reference"
CODE_EVAL = REPO / "tests" / "fixtures" / "code_eval"
MAX_GEN_TOKS = 16
TEXT = ("gsm8k", "math", "mmlu", "aime24")
CODE = ("humaneval", "mbpp")

#: The lm-eval side: its own task YAML, pointed at the fixture files (split -> file), and what the
#: field adds (MMLU is reported 5-shot: lm-eval's --num_fewshot 5).
SIDE: dict[str, tuple[str, str, dict[str, str], dict[str, Any]]] = {
    "gsm8k": ("main", "gsm8k/gsm8k.yaml", {"test": "gsm8k/main/test-00000-of-00001.jsonl",
                                           "train": "gsm8k/main/train-00000-of-00001.jsonl"}, {}),
    "math": ("algebra", "minerva_math/minerva_math_algebra.yaml",
             {"test": "math/algebra/test-00000-of-00001.jsonl"}, {}),
    "mmlu": ("anatomy", "mmlu/default/mmlu_anatomy.yaml", {"test": "mmlu/all/test-00000-of-00001.jsonl",
                                                           "dev": "mmlu/all/dev-00000-of-00001.jsonl"},
             {"num_fewshot": 5}),
    "aime24": ("aime24", "aime/aime24.yaml", {"train": "aime24/train-00000-of-00001.jsonl"}, {}),
    "humaneval": ("humaneval", "humaneval/humaneval.yaml",
                  {"test": "humaneval/openai_humaneval/test-00000-of-00001.jsonl"}, {}),
    "mbpp": ("mbpp", "mbpp/mbpp.yaml", {"test": "mbpp/full/test-00000-of-00001.jsonl"}, {}),
}


def _side_task(benchmark: str) -> str:
    return f"side_{benchmark}"


#: lm-eval's ``--predict_only``, for one task: its metrics replaced by ``bypass`` (Task.override_metric).
BYPASS = {"metric_list": [{"metric": "bypass", "aggregation": "bypass", "higher_is_better": True}]}


def _write_side_tasks(tasks_dir: Path, include: Path, benchmarks: tuple[str, ...], *,
                      predict_only: tuple[str, ...] = ()) -> list[str]:
    """The side tasks of ``benchmarks`` under ``include``; those of ``predict_only`` generate only (their
    metrics bypassed), so that one run scores the text tasks and never runs the model's code."""
    include.mkdir(parents=True, exist_ok=True)
    for benchmark in benchmarks:
        _, rel, files, extra = SIDE[benchmark]
        config = {"include": str(tasks_dir / rel), "task": _side_task(benchmark), "dataset_path": "json",
                  "dataset_name": None,
                  "dataset_kwargs": {"data_files": {split: str(FIXTURES / f) for split, f in files.items()}}, **extra,
                  **(BYPASS if benchmark in predict_only else {})}
        (include / f"{_side_task(benchmark)}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return [_side_task(b) for b in benchmarks]


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, **OFFLINE_ENV, "HF_DATASETS_CACHE": str(tmp / "hf_datasets_cache"),
            "HF_HOME": str(tmp / "hf_home"), "HF_ALLOW_CODE_EVAL": "1"}


def _code_eval_cwd(tmp: Path) -> Path:
    """A working folder holding HF evaluate's code_eval metric, where evaluate.load("code_eval") finds it."""
    cwd = tmp / "cwd"
    shutil.copytree(CODE_EVAL, cwd / "code_eval", dirs_exist_ok=True)
    return cwd


def _lm_eval_cli(toolchain: Path, model: Path, tasks: list[str], include: Path, output: Path,
                 tmp: Path) -> subprocess.CompletedProcess[str]:
    # --confirm_run_unsafe_code: lm-eval refuses to load the code tasks (unsafe_code: true) without it;
    # their metrics are bypassed (_write_side_tasks), so no model code runs.
    argv = [str(toolchain / "lm_eval"), "run", "--model", "hf", "--model_args", f"pretrained={model}",
            "--tasks", ",".join(tasks), "--include_path", str(include), "--output_path", str(output),
            "--log_samples", "--batch_size", "1", "--device", "cpu", "--gen_kwargs", f"max_gen_toks={MAX_GEN_TOKS}",
            "--confirm_run_unsafe_code"]
    return subprocess.run(argv, env=_env(tmp), cwd=_code_eval_cwd(tmp), capture_output=True, text=True, timeout=900,
                          check=False)


class SideBySide:
    def __init__(self, specs: dict[str, BenchmarkSpec], ftbus: ReferenceRun, lm_eval_out: Path) -> None:
        self.specs, self.ftbus, self.lm_eval_out = specs, ftbus, lm_eval_out

    def ftbus_rows(self, benchmark: str) -> list[dict[str, Any]]:
        (path,) = self.ftbus.samples(benchmark).values()
        return _first_per_doc(read_samples_file(path))

    def lm_eval_rows(self, benchmark: str, *, every_filter: bool = False) -> list[dict[str, Any]]:
        (path,) = sorted(self.lm_eval_out.rglob(f"samples_{_side_task(benchmark)}_*.jsonl"))
        rows = read_samples_file(path)
        return rows if every_filter else _first_per_doc(rows)


def _first_per_doc(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for row in rows:
        seen.setdefault(int(row["doc_id"]), row)
    return [seen[k] for k in sorted(seen)]


@pytest.fixture(scope="module")
def side_by_side(real_assets: Path, toolchain_bin: Path, tmp_path_factory: pytest.TempPathFactory,
                 worker_id: str) -> SideBySide:
    """ftbus's reference run and lm-eval's own, side by side (minutes of CPU each). Under pytest-xdist,
    every worker that takes one of this module's tests needs the same two runs: the first makes them,
    under a lock the run's workers share, and the others read what it made (xdist's own recipe for a
    fixture that must run once; its ``xdist_group`` does not group under pytest 9.2:
    docs/dependencies.md). In one process: made here."""
    if worker_id == "master":
        return _side_by_side(real_assets, toolchain_bin, tmp_path_factory.mktemp("reference"))
    shared = tmp_path_factory.getbasetemp().parent / "reference-side-by-side"  # this run's, every worker's
    with FileLock(f"{shared}.lock"):
        made = shared / "side_by_side.pickle"
        if not made.exists():
            side = _side_by_side(real_assets, toolchain_bin, shared)
            made.write_bytes(pickle.dumps(side))
        return pickle.loads(made.read_bytes())  # written by this run, just above


def _side_by_side(real_assets: Path, toolchain_bin: Path, tmp: Path) -> SideBySide:
    assets = tmp / "assets"
    (assets / "models").mkdir(parents=True)
    (assets / "models" / "tiny-llama").symlink_to(real_assets / "models" / "tiny-llama")
    model = (assets / "models" / "tiny-llama").resolve()
    specs = {}
    for benchmark in (*TEXT, *CODE):
        import_benchmark(assets, benchmark, FIXTURES / benchmark)
        specs[benchmark] = load_benchmark(assets, benchmark)
    tasks_dir = lm_eval_tasks_dir(toolchain_bin / "python")
    side_tasks = _write_side_tasks(tasks_dir, tmp / "side", (*TEXT, *CODE), predict_only=CODE)
    with ThreadPoolExecutor(2) as pool:
        ours = pool.submit(run_reference, list(specs.values()), tmp / "ftbus", toolchain_bin=toolchain_bin,
                           pretrained=model, max_gen_toks=MAX_GEN_TOKS, timeout_s=900)
        theirs = pool.submit(_lm_eval_cli, toolchain_bin, model, side_tasks, tmp / "side", tmp / "lm-eval", tmp)
        run, side = ours.result(), theirs.result()
    assert side.returncode == 0, side.stdout[-3000:] + side.stderr[-3000:]
    assert run.returncode == 0, run.log.read_text()[-4000:]
    return SideBySide(specs, run, tmp / "lm-eval")


@pytest.mark.parametrize("benchmark", (*TEXT, *CODE))
def test_every_prompt_and_response_is_lm_evals(side_by_side: SideBySide, benchmark: str) -> None:
    ours, theirs = side_by_side.ftbus_rows(benchmark), side_by_side.lm_eval_rows(benchmark)
    assert len(ours) == len(theirs) == len(side_by_side.specs[benchmark].items(SIDE[benchmark][0]))
    for mine, lm in zip(ours, theirs, strict=True):
        # The rendered prompt (few-shot examples included) and the generation settings, as lm-eval logs them.
        assert mine["arguments"] == lm["arguments"], (benchmark, mine["doc_id"])
        assert mine["resps"] == lm["resps"], (benchmark, mine["doc_id"])


@pytest.mark.parametrize("benchmark", TEXT)
def test_every_per_item_metric_is_lm_evals(side_by_side: SideBySide, benchmark: str) -> None:
    run = side_by_side.ftbus
    result = asyncio.run(score_samples_files(benchmark, run.samples(benchmark), items=run.files[benchmark].items))
    ref = REFERENCE[benchmark]
    theirs = side_by_side.lm_eval_rows(benchmark, every_filter=True)
    assert len(result.items) == len({r["doc_id"] for r in theirs})
    for doc, item in enumerate(result.items):  # in doc order
        for ours, (key, flt) in ref.lm_eval_metrics.items():
            (lm,) = [r for r in theirs if r["doc_id"] == doc and r["filter"] == flt]
            assert item.metrics[ours] == float(lm[key]), (benchmark, doc, ours)


@pytest.mark.parametrize("benchmark", CODE)
def test_the_program_run_is_the_one_lm_evals_code_eval_would_run(side_by_side: SideBySide, benchmark: str) -> None:
    items = side_by_side.ftbus.files[benchmark].items[SIDE[benchmark][0]]
    for item, mine, lm in zip(items, side_by_side.ftbus_rows(benchmark), side_by_side.lm_eval_rows(benchmark),
                              strict=True):
        program = reference_program(benchmark, "plain", item, sample_response(mine))
        candidate = lm["filtered_resps"]
        while isinstance(candidate, list):  # humaneval's create_test filter logs [[program]]
            candidate = candidate[0]
        # code_eval runs candidate + "\n" + test case: the filtered response and the task's target.
        assert program.solution + "\n" + program.tests == candidate + "\n" + lm["target"]


# ------------------------------------------------------------------ planted answers


HUMANEVAL_0 = "    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n" \
              "            if abs(a - b) < threshold:\n                return True\n    return False\n"
PLANTS: dict[str, dict[str, Any]] = {
    # golds 3, 5, 1000: strict-match; flexible-extract only; "#### 1,000" (both, once normalised)
    "gsm8k": {"generate": [" 0 + 3 = 3\n#### 3", " He has 5 apples, I think.", " 250 * 4 = 1,000\n#### 1,000"]},
    # golds 5, 1/2, 7: "\boxed 5" (no braces), "\fbox{...}", a wrong answer
    "math": {"generate": [" We add, so $\\boxed 5$.", " So $x = \\fbox{\\frac{1}{2}}$.", " It is $\\boxed{8}$."]},
    # golds 24 and 6: "\boxed 24"; "\fbox{6}" (lm-eval's aime finds the box, then its remove_boxed refuses it)
    "aime24": {"generate": [" The remainder is $\\boxed 24$.", " There are $\\fbox{6}$ divisors."]},
    # golds A and B: the first most likely choice is A both times
    "mmlu": {"loglik": [[-1.0, -2.0, -3.0, -4.0], [-1.0, -2.0, -3.0, -4.0]]},
    # right; fenced code (plain humaneval appends it to the prompt verbatim: a syntax error)
    "humaneval": {"generate": [HUMANEVAL_0, "```python\n    return [x for x in string]\n```"]},
    "mbpp": {"generate": ["def add(a, b):\n  return a + b\n", "```python\ndef reverse(s):\n  return s[::-1]\n```"]},
}


@pytest.fixture(scope="module")
def planted(toolchain_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("planted")
    tasks_dir = lm_eval_tasks_dir(toolchain_bin / "python")
    _write_side_tasks(tasks_dir, tmp / "include", (*TEXT, *CODE))
    plants = tmp / "plants.json"
    plants.write_text(json.dumps({_side_task(b): p for b, p in PLANTS.items()}), encoding="utf-8")
    done = subprocess.run([str(toolchain_bin / "python"), str(Path(__file__).with_name("planted_lm.py")), str(plants),
                           str(tmp / "include"), str(tmp / "out")], env=_env(tmp), cwd=_code_eval_cwd(tmp),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp / "out"


def _planted_rows(out: Path, benchmark: str) -> tuple[Path, list[dict[str, Any]]]:
    (path,) = sorted(out.rglob(f"samples_{_side_task(benchmark)}_*.jsonl"))
    return path, read_samples_file(path)


@pytest.mark.parametrize("benchmark", (*TEXT, *CODE))
def test_planted_answers_score_as_lm_eval_scores_them(planted: Path, benchmark: str, tmp_path: Path) -> None:
    path, rows = _planted_rows(planted, benchmark)
    execute = None
    if benchmark in CODE:
        from tests.sandbox_support import require_sandbox

        execute = _executor(require_sandbox(), tmp_path)
    # The logged docs are the sources' rows: ftbus makes its items from them, as its importer does.
    result = asyncio.run(score_samples_files(benchmark, {SIDE[benchmark][0]: path}, execute=execute))
    ref = REFERENCE[benchmark]
    expected = [{ours: float(next(r[key] for r in rows if r["doc_id"] == doc and r["filter"] == flt))
                 for ours, (key, flt) in ref.lm_eval_metrics.items()} for doc in sorted({r["doc_id"] for r in rows})]
    assert [item.metrics for item in result.items] == expected
    # Not a vacuous comparison: each benchmark's plants hold a right answer and (but gsm8k) a wrong one.
    values = [item.metrics[ref.metric] for item in result.items]
    assert 1.0 in values and (benchmark == "gsm8k" or 0.0 in values)


def _executor(image: str, tmp: Path) -> Any:
    from evaluation.executor import CodeExecutor, CodeSample
    from shared.settings import Settings

    executor = CodeExecutor.from_settings(Settings(home=tmp / "home", sandbox_image=image, code_exec_timeout_s=20))

    async def execute(programs: list) -> dict[str, bool]:
        outcomes = await executor.run([CodeSample(key, program) for key, program in programs])
        return {o.key: o.passed for o in outcomes}

    return execute
