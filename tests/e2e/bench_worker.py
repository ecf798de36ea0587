"""A benchmark worker for tests/e2e/test_bench_resume.py, run as its own process so that the test can
SIGKILL it in the middle of a split: one split of tiny-sentiment on a warm engine (the real lm-eval),
its journal kept in a filesystem artifact store, as the benchmark stage keeps it in its stores.

    python -m tests.e2e.bench_worker <assets> <toolchain bin> <store> <workdir>

Prints the split's outcome as JSON when it finishes (the test kills it before).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from evaluation.inference import InferenceConfig
from evaluation.models import select_model
from evaluation.registry import load_benchmark
from evaluation.resume import SplitJournal, journal_prefix
from evaluation.splits import make_split
from evaluation.warm import WarmEngine, WarmRun, WarmSplit
from runners.base import LocalRunner
from shared.fs_artifacts import FilesystemArtifacts
from shared.settings import Settings

BENCHMARK = "tiny-sentiment"
ITEMS = 20  # per subset: every validation item of tiny-sentiment, 40 in all
#: Greedy, two runs per item: the copies of a prompt are identical requests with an answer each.
INFERENCE = InferenceConfig(greedy=True, num_runs=2)
REQUEST_ID = "resume-e2e"


def resumable_split(assets: Path, store: Path) -> WarmSplit:
    manifest = make_split(load_benchmark(assets, BENCHMARK), "validation", ITEMS)
    prefix = journal_prefix(REQUEST_ID, "validation", manifest, "cpu", 0, INFERENCE)
    return WarmSplit("validation", manifest, SplitJournal(FilesystemArtifacts(store), prefix))


async def run_split(assets: Path, toolchain: Path, split: WarmSplit, workdir: Path, runner: Any = None) -> WarmRun:
    """``split`` on a fresh warm engine: a local process, or in ``runner``'s sandbox."""
    settings = Settings(home=workdir / "home", assets_dir=assets, toolchain_bin=toolchain, bench_max_items=ITEMS)
    runner = runner or LocalRunner(settings.passthrough_env, path_prefix=[toolchain])
    engine = WarmEngine(runner, settings, workdir / "engine")
    try:
        runs = await engine.run(load_benchmark(assets, BENCHMARK), select_model(assets / "models" / "tiny-llama", None),
                                [split], workdir, device="cpu", timeout_s=900, inference=INFERENCE)
    finally:
        await engine.stop()
    return runs[split.label]


def main() -> None:
    assets, toolchain, store, workdir = map(Path, sys.argv[1:5])
    run = asyncio.run(run_split(assets, toolchain, resumable_split(assets, store), workdir))
    print(json.dumps({"exit_code": run.result.exit_code, "resume": run.resume}))


if __name__ == "__main__":
    main()
