"""The judge stage (services/judge/service.py, its SPEC) run by its worker on the in-memory bus
(tests/memory_bus.py), with no judge model: the rules decide. Events come from tests/fakes/judge_events.py;
tests/unit/test_rules.py pins the rules' prose, these what the worker publishes for them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.api import PubAck
from pydantic import BaseModel

from ftbus.stages import PIPELINE
from services.judge import service as judge
from shared.events import ArtifactRef, FailedStage, JudgeResult, Stage
from shared.subjects import msg_id
from tests.fakes import judge_events as ev
from tests.memory_bus import MemoryBus, memory_settings, running

#: The files of judge_events.context()'s workspace, as the submitter uploaded them.
WORKSPACE = {"train.yaml": ev.TRAIN_YAML, "process_data.py": "print('hi')\n", "dataset_info.json": "{}"}


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[MemoryBus]:
    # An ack wait no loaded machine reaches between two heartbeats: a redelivery happens only where a
    # test makes one (bus.expire), never because a handling was slow.
    bus = MemoryBus(memory_settings(tmp_path, ack_wait_s=60.0))
    assert bus.settings.judge_model is None  # rules only
    artifacts = await bus.artifacts()
    for path, text in WORKSPACE.items():
        await artifacts.put_bytes(f"req-1/{path}", text.encode())
    yield bus
    await bus.close()
    assert bus.errors == []


async def stored_log(bus: MemoryBus, name: str, text: str) -> ArtifactRef:
    return await (await bus.artifacts()).put_bytes(f"req-1/logs/{name}", text.encode())


async def judged(bus: MemoryBus, subject: str, event: BaseModel) -> tuple[JudgeResult, PubAck]:
    """Publish ``event`` for the judge's worker and return its one JudgeResult. Where an ack is to be
    lost (bus.lose_acks), the message comes back once that ack is gone (bus.expire)."""
    durable = bus.subjects.durable(Stage.judge)
    async with running(bus, judge.SPEC.worker(bus, PIPELINE)):  # type: ignore[arg-type]
        lost = bus.acks_to_lose
        ack = await bus.publish(subject, event, msg_id("req-1", "test", "event"))
        if lost:
            await bus.wait_for(lambda: bus.acks_to_lose == 0, what="the first handling's ack lost")
            assert bus.tracking(ack, durable).delivered == 1 and not bus.tracking(ack, durable).acked
            bus.expire(ack, durable)
        await bus.wait_for(lambda: bus.tracking(ack, durable).acked, what="judged")
    [message] = bus.messages(bus.subjects.completed("judge"))
    assert message.headers["Nats-Msg-Id"] == "req-1:judge:completed"
    return message.event(JudgeResult), ack


async def test_a_precheck_failure_is_judged_a_failure_of_the_precheck(bus: MemoryBus) -> None:
    event = ev.precheck_failed("unsafe path in workspace: ../../etc/passwd")
    result, _ = await judged(bus, bus.subjects.failed("data"), event)
    assert result.request_id == "req-1"
    assert result.feedback.final_decision is False and result.failed_stage == FailedStage.precheck
    assert (result.judge.kind, result.judge.rules_decision) == ("rules", False)
    assert result.feedback.execution.startswith("FAILED with category [Config]")
    assert "../../etc/passwd" in result.feedback.execution
    assert result.expects_test is False  # nothing ran: no test split to wait for


async def test_a_successful_validation_run_is_judged_a_success_from_its_stored_logs(bus: MemoryBus) -> None:
    event = ev.bench_result()
    # The whole logs are in the artifact store; the events carry only their tails.
    train_log = "loading model\n[INFO] epoch 3/3: loss 0.41 (only in the stored log)\nTraining completed.\n"
    trained, benched = event.runs["training"], event.runs["benchmark"]
    assert trained.outcome is not None and benched.outcome is not None
    trained.outcome = trained.outcome.model_copy(update={"log": await stored_log(bus, "train.log", train_log)})
    bench_log = "gsm8k: 100 items\naccuracy 0.52 (only in the stored benchmark log)\n"
    benched.outcome = benched.outcome.model_copy(update={"log": await stored_log(bus, "bench.log", bench_log)})
    result, _ = await judged(bus, bus.subjects.completed("bench"), event)
    fb = result.feedback
    assert fb.final_decision is True and result.failed_stage is None
    assert (result.judge.kind, result.judge.rules_decision, result.judge.reason) == (
        "rules", True, "no judge model configured")
    assert fb.execution.startswith("SUCCESS") and "gsm8k/accuracy = 0.52" in fb.execution
    assert "gsm8k: accuracy=0.52" in fb.return_checking and "+0.07" in fb.return_checking
    assert "epoch 3/3: loss 0.41 (only in the stored log)" in result.raw_execution
    assert "(only in the stored benchmark log)" in result.raw_execution
    assert result.expects_test is True and result.result.benchmark == event.benchmark
    assert [a.path for a in result.artifacts] == [f.path for f in event.train.outputs]


async def test_a_training_failure_is_classified_from_its_stored_log(bus: MemoryBus) -> None:
    event = ev.train_failed(1, "(the tail lost the traceback)\n")
    trained = event.runs["training"]
    assert trained.outcome is not None
    trained.outcome = trained.outcome.model_copy(update={"log": await stored_log(bus, "train.log", ev.OOM_LOG)})
    result, _ = await judged(bus, bus.subjects.failed("train"), event)
    assert result.feedback.final_decision is False and result.failed_stage == FailedStage.training
    assert result.feedback.execution.startswith("FAILED with category [OOM]")
    assert "per_device_train_batch_size from 8 to 4" in result.feedback.code


async def test_a_redelivered_judge_message_publishes_no_second_judge_result(bus: MemoryBus) -> None:
    bus.lose_acks(1)  # the judge dies between its publish and its ack: the message comes back
    result, ack = await judged(bus, bus.subjects.completed("bench"), ev.bench_result())
    assert bus.tracking(ack, bus.subjects.durable(Stage.judge)).delivered == 2
    assert result.feedback.final_decision is True
    assert bus.duplicates == ["req-1:judge:completed"]  # the second copy was refused by its id
