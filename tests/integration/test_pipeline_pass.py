"""A candidate that passes end to end: real NATS, real services, stand-in toolchain executables."""

from __future__ import annotations

from pathlib import Path

from shared.events import Progress, Report, TaskSpec
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")


async def test_a_good_candidate_passes_with_scores_baseline_and_a_separate_report(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    await pipeline.start()
    ws = write_workspace(tmp_path / "ws")
    seen: list[Progress] = []
    rid = await pipeline.client.submit(ws, TASK)
    verdict = await pipeline.client.wait(rid, on_progress=seen.append, timeout_s=120)

    assert verdict.status == "completed", verdict.execution
    assert verdict.final_decision is True
    assert verdict.failed_stage is None
    bench = verdict.result.benchmark
    assert bench is not None and set(bench.accuracy_summary) == {"doubling", "halving"}
    # Validation = the first min(100, n//2) items of each subset.
    assert bench.item_ids == {"doubling": [f"d{i}" for i in range(10)], "halving": [f"h{i}" for i in range(6)]}
    metrics = verdict.result.training_metrics
    assert len(metrics.loss_history.train) == 5 and metrics.final_loss < metrics.initial_loss
    assert verdict.result.data_stats is not None and verdict.result.data_stats.total_samples == 40
    baseline = verdict.result.baseline
    assert baseline is not None and baseline.difference is not None and baseline.difference > 0
    # The agent's verdict has no test results; the report does, on the last items.
    assert "benchmark_test" not in verdict.model_dump()
    report = await pipeline.client.wait_report(rid, timeout_s=60)
    assert isinstance(report, Report)
    assert report.benchmark_test is not None
    assert report.benchmark_test.item_ids["doubling"] == [f"d{i}" for i in range(10, 20)]
    # Training progress arrived, in step order.
    steps = [p.step for p in seen if p.stage == "train" and p.step is not None]
    assert steps == sorted(steps) and steps[-1] == 5
    # Test-split logs live in the private store only: agents cannot read them from the shared one.
    public, private = await pipeline.bus.artifacts(), await pipeline.bus.private_artifacts()
    assert await public.stat(f"{rid}/logs/benchmark-test.log") is None
    assert await private.stat(f"{rid}/logs/benchmark-test.log") is not None
    assert await public.stat(f"{rid}/logs/benchmark-validation.log") is not None
    # The public status view carries no test-split data.
    view = await pipeline.client.status(rid)
    assert view is not None and view.status == "completed"
    assert "benchmark_test" not in view.model_dump_json()
    # The trained outputs are referenced, and optimizer checkpoints are not kept.
    paths = {a.path for a in verdict.artifacts}
    assert "output/adapter_model.safetensors" in paths
    assert not any("checkpoint-" in p for p in paths)
    # ... in the models store, from which `ftbus pull` gets them, checked, and nothing else.
    from ftbus.pull import pull

    pulled = await pull(pipeline.client, rid, tmp_path / "model")
    assert "adapter_model.safetensors" in pulled.files and pulled.model_kind == "lora"
    assert len(pulled.files) == len(paths)


async def test_watch_follows_progress_and_verdicts(pipeline: Pipeline, tmp_path: Path) -> None:
    import asyncio

    from shared.events import Verdict

    await pipeline.start()
    assert pipeline.client is not None
    seen: list[object] = []

    async def follow() -> None:
        async for item in pipeline.client.watch():
            seen.append(item)
            if isinstance(item, Verdict):
                return

    watcher = asyncio.create_task(follow())
    # The watch is in place once it has passed on a probe: it yields only after both of its
    # subscriptions exist (progress, then verdicts). Core NATS drops a probe sent before that: send
    # another until one comes through.
    from shared import codec

    probe = Progress(request_id="20990101-000000-00000000", stage="data", message="probe")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60  # hang guard
    while not any(isinstance(p, Progress) and p.request_id == probe.request_id for p in seen):
        assert not watcher.done() and loop.time() < deadline, "the watch never started"
        await pipeline.client.bus.nc.publish(pipeline.client.bus.subjects.progress(probe.request_id),
                                             codec.encode(probe))
        await asyncio.sleep(0.1)
    rid = await pipeline.client.submit(write_workspace(tmp_path / "ws"), TASK)
    await asyncio.wait_for(watcher, timeout=120)  # hang guard: the verdict comes in seconds
    stages = {p.stage for p in seen if isinstance(p, Progress) and p.request_id == rid}
    # The stages that run a while (or report progress) are followed; a judgement by the rules is
    # over in milliseconds, announces nothing, and shows in the verdict (shared/runtime.py).
    assert {"data", "train", "bench"} <= stages
    assert isinstance(seen[-1], Verdict) and seen[-1].request_id == rid
