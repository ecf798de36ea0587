"""A benchmark killed half way resumes with identical per-item outcomes (issue 37): the real lm-eval
on the tiny model in a warm engine, a worker process SIGKILLed once some batches are recorded, and
the next worker's run of the same split takes the recorded answers and generates only the rest."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from evaluation.lmeval import parse_lm_eval_output, read_lm_eval_output
from evaluation.registry import load_benchmark
from evaluation.resume import SplitJournal
from evaluation.warm import WarmRun, WarmSplit
from runners.docker import DockerRunner, engine_client
from shared.fs_artifacts import FilesystemArtifacts
from tests.e2e.bench_worker import BENCHMARK, ITEMS, resumable_split, run_split
from tests.sandbox_support import require_sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # three engine starts on 2 loaded cores
REPO = Path(__file__).resolve().parents[2]
REQUESTS = 2 * ITEMS * 2  # two subsets of ITEMS items, two runs each


def _outcomes(assets: Path, split: WarmSplit, run: WarmRun) -> tuple[dict, dict]:
    assert run.result.exit_code == 0, run.result.output_tail
    spec = load_benchmark(assets, BENCHMARK)
    texts = {g.item_id: g.outputs for rows in read_lm_eval_output(run.output_dir, spec, split.manifest)
             .generated.values() for g in rows}
    scores = parse_lm_eval_output(run.output_dir, spec, split.manifest).item_scores
    return texts, scores


async def _recorded(split: WarmSplit, scratch: Path) -> int:
    assert split.journal is not None
    return await split.journal.restore(scratch / "journal.jsonl")


async def _kill_when_recording(assets: Path, toolchain: Path, store: Path, workdir: Path) -> None:
    """Start a worker process; SIGKILL it once its second shipment of answers is in the store."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.e2e.bench_worker", str(assets), str(toolchain), str(store), str(workdir),
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    journal = resumable_split(assets, store).journal
    assert journal is not None
    deadline = time.monotonic() + 900
    try:
        while await journal.store.stat(f"{journal.prefix}/000001.jsonl") is None:
            assert worker.returncode is None, (await worker.stdout.read()).decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the worker recorded nothing in 900 s"
            await asyncio.sleep(0.05)
        assert worker.returncode is None  # killed in the middle, not after the end
    finally:
        if worker.returncode is None:
            worker.kill()  # SIGKILL: no handler runs, the engine dies with it (PR_SET_PDEATHSIG)
        await worker.wait()
    assert worker.returncode == -signal.SIGKILL


async def test_a_benchmark_killed_half_way_resumes_with_identical_per_item_outcomes(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    # Uninterrupted: every request generated, nothing taken from a journal.
    reference_split = resumable_split(real_assets, tmp_path / "reference-store")
    reference = await run_split(real_assets, toolchain_bin, reference_split, tmp_path / "reference")
    assert reference.resume == {"items": 0, "of": 2 * ITEMS, "requests": REQUESTS, "generated": REQUESTS}
    expected = _outcomes(real_assets, reference_split, reference)
    assert await _recorded(reference_split, tmp_path) == REQUESTS  # every answer was shipped

    # Interrupted: a worker killed once some batches are recorded.
    store = tmp_path / "store"
    await _kill_when_recording(real_assets, toolchain_bin, store, tmp_path / "killed")
    recorded = await _recorded(resumable_split(real_assets, store), tmp_path)
    assert 0 < recorded < REQUESTS

    # Redelivered: the next worker's run takes the recorded answers, generates the rest.
    split = resumable_split(real_assets, store)
    resumed = await run_split(real_assets, toolchain_bin, split, tmp_path / "resumed")
    assert resumed.resume is not None
    assert resumed.resume["requests"] == REQUESTS
    assert resumed.resume["generated"] == REQUESTS - recorded
    assert 0 < resumed.resume["items"] <= recorded // 2
    assert _outcomes(real_assets, split, resumed) == expected
    assert "recorded by an earlier attempt" in resumed.log_path.read_text()

    # The request is over: its journal goes.
    assert split.journal is not None
    await split.journal.clear()
    assert await _recorded(resumable_split(real_assets, store), tmp_path) == 0


async def test_the_engine_container_reads_and_extends_its_journal(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    """In the Docker sandbox (the default): the journal restored into the run folder is the
    sandbox user's to extend, and the engine in the container answers from it."""
    image = require_sandbox()
    reference_split = resumable_split(real_assets, tmp_path / "reference-store")
    reference = await run_split(real_assets, toolchain_bin, reference_split, tmp_path / "reference")
    expected = _outcomes(real_assets, reference_split, reference)
    assert await _recorded(reference_split, tmp_path) == REQUESTS
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines(keepends=True)
    half = b"".join(lines[: len(lines) // 2])
    split = resumable_split(real_assets, tmp_path / "store")
    assert isinstance(split.journal, SplitJournal)
    await FilesystemArtifacts(tmp_path / "store").put_bytes(f"{split.journal.prefix}/000000.jsonl", half)

    runner = DockerRunner(image, stage="bench", client=engine_client(), memory="4g")
    resumed = await run_split(real_assets, toolchain_bin, split, tmp_path / "resumed", runner=runner)
    assert resumed.result.sandbox == f"docker:{image}"
    assert resumed.resume is not None and resumed.resume["generated"] == REQUESTS - len(lines) // 2
    assert _outcomes(real_assets, split, resumed) == expected
    assert await _recorded(resumable_split(real_assets, tmp_path / "store"), tmp_path) == REQUESTS
