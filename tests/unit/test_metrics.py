"""The metrics module (shared/metrics.py): outcome classification, exit causes, bounded labels, and a
stage worker's metrics on the in-memory bus (tests/memory_bus.py). The same metrics scraped by a real
Prometheus from every worker: tests/integration/test_metrics_prometheus.py."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from runners.base import LocalRunner, RunResult
from runners.metered import MeteredRunner, exit_cause
from shared import metrics
from shared.consumer import Slot
from shared.events import CancelRequested, DataResult, Stage, StageOutcome, TrainResult
from shared.runtime import Outgoing, StageContext, StageWorker
from shared.settings import Settings
from shared.subjects import msg_id
from tests.fakes.judge_events import context, data_summary, train_summary
from tests.memory_bus import MemoryBus, memory_settings, running

#: Every label any ftbus metric may carry: none of them a request's own words.
BOUNDED_LABELS = {"stage", "outcome", "consumer", "sandbox", "cause", "source", "kind", "status"}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def trained(rid: str, *, ok: bool = True, timed_out: bool = False) -> TrainResult:
    outcome = StageOutcome(exit_code=0 if ok else (124 if timed_out else 1), timed_out=timed_out)
    return TrainResult(request_id=rid, ok=ok, context=context(), data=data_summary(), train=train_summary(),
                       outcome=outcome)


# ---------------------------------------------------------------------------- classification


def test_a_handling_is_ok_a_candidate_failure_or_a_timeout_by_what_it_published() -> None:
    s = "ftbus.train"
    assert metrics.outcome_of([Outgoing(f"{s}.completed", trained("a"), "completed")]) == "ok"
    assert metrics.outcome_of([Outgoing(f"{s}.failed", trained("b", ok=False), "failed")]) == "candidate_failure"
    assert metrics.outcome_of([Outgoing(f"{s}.failed", trained("c", ok=False, timed_out=True), "failed")]) == "timeout"
    # The benchmark's two splits: a validation failure is the handling's failure.
    data = DataResult(request_id="d", ok=False, context=context(), data=data_summary(),
                      outcome=StageOutcome(exit_code=124, timed_out=True))
    both = [Outgoing("x.test", trained("d"), "test"), Outgoing("x.failed", data, "failed")]
    assert metrics.outcome_of(both) == "timeout"
    assert metrics.outcome_of([]) == "ok"  # the aggregator publishes nothing of its own


@pytest.mark.parametrize(("result", "cause"), [
    ({"exit_code": 0}, "ok"),
    ({"exit_code": 1}, "error"),
    ({"exit_code": 2}, "error"),
    ({"exit_code": 124, "timed_out": True}, "timeout"),
    ({"exit_code": 130, "cancelled": True}, "cancelled"),
    ({"exit_code": 137, "oom_killed": True}, "oom"),
    ({"exit_code": 137}, "oom"),
    ({"exit_code": 125}, "quota"),
    ({"exit_code": 127}, "not_found"),
    ({"exit_code": 126}, "cannot_execute"),
    ({"exit_code": 139}, "signal"),
    ({"exit_code": 255}, "signal"),
])
def test_every_exit_of_a_run_has_one_of_the_fixed_causes(tmp_path: Path, result: dict[str, Any], cause: str) -> None:
    run = RunResult(**{"timed_out": False, "cancelled": False, "duration_s": 1.0, "timeout_s": 10.0,
                       "log_path": tmp_path / "log", "output_tail": "", **result})
    assert exit_cause(run) == cause and cause in metrics.CAUSES


async def test_a_metered_runner_counts_each_run_by_its_sandbox_kind_and_cause(tmp_path: Path) -> None:
    runner = MeteredRunner(LocalRunner(["PATH"]), "data")
    before = [sample("ftbus_sandbox_runs_total", stage="data", sandbox="local", cause=c) for c in ("ok", "error")]
    for code in (0, 3):
        result = await runner.run(["python3", "-c", f"raise SystemExit({code})"], cwd=tmp_path, timeout_s=30,
                                  log_path=tmp_path / f"run-{code}.log")
        assert result.exit_code == code
    after = [sample("ftbus_sandbox_runs_total", stage="data", sandbox="local", cause=c) for c in ("ok", "error")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert runner.name == "local"  # the inner runner's attributes show through


# ---------------------------------------------------------------------------- bounded labels


def test_every_ftbus_metric_has_only_bounded_labels() -> None:
    ours = [m for m in REGISTRY.collect() if m.name.startswith("ftbus_")]
    assert len(ours) >= 15
    for metric in ours:
        for s in metric.samples:
            names = set(s.labels) - {"le"}  # a histogram's bucket bound
            assert names <= BOUNDED_LABELS, f"{s.name} has labels {names - BOUNDED_LABELS}"


def test_labels_outside_their_fixed_sets_are_refused_or_folded() -> None:
    with pytest.raises(ValueError, match="not one of"):
        metrics.stage_done("train", "exploded", 1.0)
    with pytest.raises(ValueError, match="not one of"):
        metrics.llm_tokens("the-candidates-own-model", 1, 1)
    with pytest.raises(ValueError, match="not one of"):
        metrics.verdict_published("maybe", None)  # checked even when there is nothing to observe
    # A stage's name comes from the pipeline; anything else is folded into one series.
    assert metrics.stage_label("train") == "train"
    assert metrics.stage_label("Req-0123456789abcdef") == "other"
    assert metrics.stage_label("x" * 40) == "other"
    assert metrics.stage_label(None) == "unknown"


def test_a_resumed_training_counts_once_with_the_steps_it_saved() -> None:
    resumed, saved = sample("ftbus_training_resumed_total"), sample("ftbus_training_steps_saved_total")
    metrics.training_resumed(200)
    metrics.training_resumed(-5)  # a nonsensical count saves nothing rather than failing the training
    assert sample("ftbus_training_resumed_total") - resumed == 2
    assert sample("ftbus_training_steps_saved_total") - saved == 200


def test_gpu_slots_are_busy_while_a_message_holds_one() -> None:
    gate = asyncio.Semaphore(1)
    before = sample("ftbus_gpu_slots_busy", stage="bench")
    slot = Slot(gate, "bench")
    assert sample("ftbus_gpu_slots_busy", stage="bench") - before == 1
    slot.release()
    slot.release()  # twice is harmless, and counted once
    assert sample("ftbus_gpu_slots_busy", stage="bench") - before == 0
    Slot(None, "data").release()  # a stage without device slots counts nothing
    assert sample("ftbus_gpu_slots_busy", stage="data") == 0


# ---------------------------------------------------------------------------- serving


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def test_a_worker_serves_its_metrics_on_a_free_port_and_a_busy_port_falls_back(tmp_path: Path) -> None:
    first = metrics.serve(Settings(home=tmp_path, metrics_port=0))
    assert first is not None and first.url.startswith("http://127.0.0.1:") and first.url.endswith("/metrics")
    try:
        assert "# TYPE ftbus_stage_duration_seconds histogram" in _get(first.url)
        busy = int(first.url.rsplit(":", 1)[1].split("/")[0])
        second = metrics.serve(Settings(home=tmp_path, metrics_port=busy))
        assert second is not None and second.url != first.url
        second.close()
    finally:
        first.close()
    assert metrics.serve(Settings(home=tmp_path, metrics_enabled=False)) is None


# ---------------------------------------------------------------------------- a stage worker's metrics


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[MemoryBus]:
    bus = MemoryBus(memory_settings(tmp_path))
    yield bus
    await bus.close()


def worker(bus: MemoryBus, handler: Any, stage: str) -> StageWorker:
    return StageWorker(bus, stage, handler, (DataResult,), filters=[bus.subjects.completed("data")],  # type: ignore[arg-type]
                       runner=LocalRunner(bus.settings.passthrough_env))


async def send(bus: MemoryBus, rid: str) -> Any:
    event = DataResult(request_id=rid, ok=True, context=context(), data=data_summary())
    return await bus.publish(bus.subjects.completed("data"), event, msg_id(rid, "data", "completed"))


def counts(stage: str) -> dict[str, float]:
    found = {o: sample("ftbus_stage_outcomes_total", stage=stage, outcome=o) for o in metrics.OUTCOMES}
    found["durations"] = sum(sample("ftbus_stage_duration_seconds_count", stage=stage, outcome=o)
                             for o in metrics.OUTCOMES)
    found["redeliveries"] = sample("ftbus_stage_redeliveries_total", stage=stage)
    found["in_flight"] = sample("ftbus_stage_in_flight", stage=stage)
    return found


async def test_a_stage_worker_counts_each_handling_by_its_outcome(bus: MemoryBus) -> None:
    async def handler(event: DataResult, ctx: StageContext) -> list[Outgoing]:
        if event.request_id == "flaky" and ctx.deliveries == 1:
            raise ConnectionError("the artifact store is away")
        kind = "failed" if event.request_id == "bad" else "completed"
        return [Outgoing(ctx.subjects.completed("train"), trained(event.request_id, ok=kind == "completed"), kind)]

    durable = bus.subjects.durable("mtrain")
    async with running(bus, worker(bus, handler, "mtrain")):
        for rid in ("good", "bad", "flaky"):
            ack = await send(bus, rid)
            await bus.wait_for(lambda ack=ack: bus.tracking(ack, durable).acked, what=f"{rid} acked")
    seen = counts("mtrain")
    assert {k: v for k, v in seen.items() if v} == {
        "ok": 2, "candidate_failure": 1, "infrastructure_failure": 1, "durations": 4, "redeliveries": 1}


async def test_a_cancelled_handling_counts_as_cancelled_and_leaves_nothing_in_flight(bus: MemoryBus) -> None:
    started = asyncio.Event()

    async def handler(event: DataResult, ctx: StageContext) -> list[Outgoing]:
        started.set()
        assert sample("ftbus_stage_in_flight", stage="mcancel") == 1
        await asyncio.Event().wait()
        return []

    durable = bus.subjects.durable("mcancel")
    async with running(bus, worker(bus, handler, "mcancel")):
        ack = await send(bus, "cancel-me")
        await asyncio.wait_for(started.wait(), 60)  # hang guard
        await bus.publish_core(bus.subjects.cancel, CancelRequested(request_id="cancel-me"))
        await bus.wait_for(lambda: bus.tracking(ack, durable).acked, what="the cancelled message acked")
    assert {k: v for k, v in counts("mcancel").items() if v} == {"cancelled": 1, "durations": 1}


async def test_the_aggregators_dead_letters_and_verdicts_are_counted(tmp_path: Path) -> None:
    """Through the aggregator's own handling, on the memory bus: a dead letter naming a stage, then the
    error verdict it makes, observed from the request's submission."""
    from services.aggregator.service import Aggregator
    from shared.events import DeadLetter, EvalRequested
    from tests.memory_bus import MemoryBus as Bus

    bus = Bus(memory_settings(tmp_path))
    try:
        from ftbus.stages import PIPELINE

        aggregator = Aggregator(bus, PIPELINE)
        letters = sample("ftbus_dead_letters_total", stage=Stage.train)
        errors = sample("ftbus_verdict_latency_seconds_count", status="error")
        ctx = StageContext(bus, Stage.aggregate, "dl-1", await bus.artifacts(), None, 1, tmp_path,  # type: ignore[arg-type]
                           subject=bus.subjects.eval_requested)
        await aggregator.on_event(EvalRequested(request_id="dl-1", context=context()), ctx)
        ctx.subject = bus.subjects.dlq
        letter = DeadLetter(request_id="dl-1", original_subject="x", stage=Stage.train, reason="gave up")
        await aggregator.on_event(letter, ctx)
        assert sample("ftbus_dead_letters_total", stage=Stage.train) - letters == 1
        assert sample("ftbus_verdict_latency_seconds_count", status="error") - errors == 1
    finally:
        await bus.close()
