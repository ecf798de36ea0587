"""The warm benchmark engine with the REAL lm-eval on the tiny model: as a local process and as a
Docker container. One model load for both splits, the splits one at a time (each in its own log),
warm between jobs, killed on a timeout and started afresh for the next job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from evaluation.lmeval import parse_lm_eval_output
from evaluation.models import select_model
from evaluation.registry import load_benchmark
from evaluation.splits import make_split
from evaluation.warm import WarmEngine, WarmSplit
from runners.base import LocalRunner
from runners.docker import DockerRunner, engine_client
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

pytestmark = pytest.mark.e2e
BENCHMARK = "tiny-sentiment"
MAX_ITEMS = 4


def _settings(tmp_path: Path, assets: Path, toolchain: Path, **extra: object) -> Settings:
    return Settings(home=tmp_path / "home", assets_dir=assets, toolchain_bin=toolchain, bench_max_items=MAX_ITEMS,
                    **extra)


def _splits(assets: Path, prefix: str = "") -> list[WarmSplit]:
    spec = load_benchmark(assets, BENCHMARK)
    return [WarmSplit(f"{prefix}{split}", make_split(spec, split, MAX_ITEMS)) for split in ("validation", "test")]


def _questions(assets: Path, split: str) -> list[str]:
    spec = load_benchmark(assets, BENCHMARK)
    manifest = make_split(spec, split, MAX_ITEMS)  # type: ignore[arg-type]
    out = []
    for subset in spec.subsets:
        wanted = set(manifest.item_ids[subset.name])
        out += [item.question for item in spec.items(subset.name) if item.id in wanted]
    return out


def _check_job(runs: dict, assets: Path, *, job: int, prefix: str = "") -> None:
    spec = load_benchmark(assets, BENCHMARK)
    validation, test = runs[f"{prefix}validation"], runs[f"{prefix}test"]
    for i, (split, run) in enumerate((("validation", validation), ("test", test))):
        assert run.result.exit_code == 0, run.result.output_tail
        assert run.error is None
        # The same layout as the lm_eval CLI's: the unchanged parser reads it.
        scores = parse_lm_eval_output(run.output_dir, spec, make_split(spec, split, MAX_ITEMS))  # type: ignore[arg-type]
        assert set(scores.accuracy_summary) == {"food", "films"}
        # One model load for the job, done in its first split: the second split reused it.
        assert run.loads == 1
        # While the split ran, the engine saw this split's run folder and no other.
        runs_seen = [name for name in run.listing if name.startswith("run-")]
        assert runs_seen == [f"run-{job}-{i}"], run.listing
        assert not any(name.startswith("split-") for name in run.listing)
    assert validation.engine_pid == test.engine_pid
    # Each split's log holds that split only: nothing of the other's items, folder or results.
    validation_log = validation.log_path.read_text()
    test_log = test.log_path.read_text()
    assert "model loaded" in validation_log and "model loaded" not in test_log
    test_questions = _questions(assets, "test")
    validation_questions = _questions(assets, "validation")
    assert set(test_questions).isdisjoint(validation_questions)
    assert not [q for q in test_questions if q in validation_log]
    assert not [q for q in validation_questions if q in test_log]
    assert f"run-{job}-1" not in validation_log and f"run-{job}-0" not in test_log
    assert f"run-{job}-0/tasks" in validation_log and f"run-{job}-1/tasks" in test_log  # each names its own tasks
    for log_text in (validation_log, test_log):
        assert log_text.count("|exact_match|") == 2  # one results table: food and films of this split


async def test_one_load_per_job_splits_one_at_a_time_and_warm_between_jobs(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, real_assets, toolchain_bin)
    engine = WarmEngine(LocalRunner(settings.passthrough_env, path_prefix=[toolchain_bin]), settings,
                        tmp_path / "engine")
    spec = load_benchmark(real_assets, BENCHMARK)
    base = select_model(real_assets / "models" / "tiny-llama", None)
    announced: list[str] = []

    async def on_split(split: WarmSplit) -> None:
        announced.append(split.label)

    try:
        first = await engine.run(spec, base, _splits(real_assets), tmp_path / "w1", device="cpu", timeout_s=600,
                                 on_split=on_split)
        _check_job(first, real_assets, job=1)
        assert announced == ["validation", "test"]
        # The exchange area holds no split once the job is over.
        assert not [p for p in engine.exchange.iterdir() if p.name.startswith(("run-", "model-", "split-"))]

        second = await engine.run(spec, base, _splits(real_assets), tmp_path / "w2", device="cpu", timeout_s=600)
        _check_job(second, real_assets, job=2)
        assert engine.starts == 1
        assert second["validation"].engine_pid == first["validation"].engine_pid  # warm: the same process
        assert json.loads((engine.exchange / "engine.json").read_text())["pid"] == first["validation"].engine_pid

        # A split over its timeout kills the engine; the next split, and the next job, get a fresh one.
        timed = await engine.run(spec, base, _splits(real_assets)[:1], tmp_path / "w3", device="cpu",
                                 timeout_s=0.2)
        run = timed["validation"]
        assert run.result.timed_out and run.result.exit_code == 124
        assert "the stage timeout" in run.log_path.read_text()
        assert not engine.running
        third = await engine.run(spec, base, _splits(real_assets), tmp_path / "w4", device="cpu", timeout_s=600)
        assert engine.starts == 2
        assert third["validation"].engine_pid != first["validation"].engine_pid
        assert third["validation"].result.exit_code == 0 and third["test"].loads == 1

        # An engine that died between jobs is started afresh for the next one.
        os.kill(third["validation"].engine_pid, signal.SIGKILL)
        resident = engine._resident
        assert resident is not None
        for _ in range(200):
            if await resident.poll() is not None:
                break
            await asyncio.sleep(0.05)
        fourth = await engine.run(spec, base, _splits(real_assets)[:1], tmp_path / "w5", device="cpu",
                                  timeout_s=600)
        assert fourth["validation"].result.exit_code == 0 and engine.starts == 3

        # A cancel (a user's, or the worker stopping) kills the engine in the middle of a split and
        # takes the split's files out of its view.
        job = asyncio.create_task(engine.run(spec, base, _splits(real_assets), tmp_path / "w6", device="cpu",
                                             timeout_s=600))
        for _ in range(600):
            if any(p.name.startswith("run-") for p in engine.exchange.iterdir()):
                break
            await asyncio.sleep(0.05)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert not engine.running
        assert not [p for p in engine.exchange.iterdir() if p.name.startswith(("run-", "model-"))]
    finally:
        await engine.stop()
    assert not engine.root.exists()


async def test_the_engine_container_sees_its_exchange_the_models_and_its_script_only(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    image = require_sandbox()
    settings = _settings(tmp_path, real_assets, toolchain_bin, sandbox="docker", sandbox_image=image)
    client = engine_client()
    runner = DockerRunner(image, stage="bench", client=client, memory="4g")
    engine = WarmEngine(runner, settings, tmp_path / "engine")
    spec = load_benchmark(real_assets, BENCHMARK)
    # A candidate outside the models folder: its files are linked into the exchange area per job.
    candidate_dir = tmp_path / "candidate"
    candidate_dir.mkdir()
    for path in (real_assets / "models" / "tiny-llama").iterdir():
        if path.is_file():
            (candidate_dir / path.name).write_bytes(path.read_bytes())
    (candidate_dir / "escape").symlink_to(real_assets / "benchmarks")
    candidate = select_model(candidate_dir, None)
    try:
        runs = await engine.run(spec, candidate, _splits(real_assets), tmp_path / "w", device="cpu",
                                timeout_s=600)
        _check_job(runs, real_assets, job=1)
        assert runs["validation"].result.sandbox == f"docker:{image}"
        resident = engine._resident
        assert resident is not None
        container = resident.container  # type: ignore[attr-defined]
        container.reload()
        host = container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["Memory"] == 4 * 2**30 and host["PidsLimit"] == settings.sandbox_pids
        mounts = {m["Destination"]: m["RW"] for m in container.attrs["Mounts"]}
        models = str((real_assets / "models").resolve())
        assert mounts == {str(engine.exchange): True, models: False, str(engine.code_dir): False}, mounts
        assert str((real_assets / "benchmarks").resolve()) not in mounts  # the hidden split's source
        assert container.labels["ftbus.stage"] == "bench" and container.labels["ftbus.owner"] == runner.owner
    finally:
        await engine.stop()
    assert not client.containers.list(all=True, filters={"label": f"ftbus.owner={runner.owner}"})


async def test_repeated_runs_are_one_batch_per_item_and_greedy_runs_are_identical(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    """num_runs on the warm engine: lm-eval's repeats, each item's runs one batched generation. Greedy
    runs of one model on the same items give identical outputs, within a job and from job to job;
    sampled runs differ from one another."""
    from evaluation.inference import InferenceConfig
    from evaluation.lmeval import read_lm_eval_output

    settings = _settings(tmp_path, real_assets, toolchain_bin)
    engine = WarmEngine(LocalRunner(settings.passthrough_env, path_prefix=[toolchain_bin]), settings,
                        tmp_path / "engine")
    spec = load_benchmark(real_assets, BENCHMARK)
    base = select_model(real_assets / "models" / "tiny-llama", None)
    split = _splits(real_assets)[:1]
    manifest = split[0].manifest

    async def outputs(inference: InferenceConfig, workdir: Path) -> dict[str, tuple[str, ...]]:
        runs = await engine.run(spec, base, split, workdir, device="cpu", timeout_s=600, inference=inference)
        run = runs["validation"]
        assert run.result.exit_code == 0, run.result.output_tail
        # The engine batched each prompt's copies: lm-eval's batch size was the number of runs.
        assert f"batch_size: {inference.num_runs}" in run.log_path.read_text()
        read = read_lm_eval_output(run.output_dir, spec, manifest)
        return {g.item_id: g.outputs for rows in read.generated.values() for g in rows}

    try:
        greedy = InferenceConfig(greedy=True, num_runs=3)
        first = await outputs(greedy, tmp_path / "w1")
        assert len(first) == sum(map(len, manifest.item_ids.values()))
        assert all(len(texts) == 3 and len(set(texts)) == 1 for texts in first.values()), first
        assert await outputs(greedy, tmp_path / "w2") == first  # and the same from one job to the next

        sampled = await outputs(InferenceConfig(temperature=1.0, top_p=1.0, top_k=0, num_runs=4), tmp_path / "w3")
        assert all(len(texts) == 4 for texts in sampled.values())
        assert any(len(set(texts)) > 1 for texts in sampled.values()), sampled
    finally:
        await engine.stop()
