"""The attempt count of a stage worker (shared/attempts.py) on the in-memory bus: a handler that
raises uses up the attempts and the worker itself dead-letters the request; a delivery that meets
a live attempt runs nothing and counts nothing; a silent holder is counted lost and taken over; a
worker that stops counts nothing. The real-server versions, with links cut: tests/integration/test_attempts.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared import attempts
from shared.attempts import UNAVAILABLE_PER_ATTEMPT, AttemptLimit, Attempts, attempts_key
from shared.events import DataResult, DeadLetter, Progress, Stage
from shared.runtime import StageContext, StageWorker, stage_policies
from tests.memory_bus import MemoryBus, memory_settings, running
from tests.unit.test_stage_worker import Counting, durable, results, send, train_worker


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[MemoryBus]:
    # An ack wait (the delay of a delivery that waits for a live attempt) that is not the consumer
    # loop's error delay, which this bus counts as an error.
    bus = MemoryBus(memory_settings(tmp_path, ack_wait_s=3.0))
    yield bus
    await bus.close()
    assert bus.errors == [], "the bus caught errors around a handler or a callback"


def counting_worker(bus: MemoryBus, handler: Counting) -> StageWorker:
    """The train worker with a stage's policies (shared/stagespec.py): the attempts counted here."""
    worker = train_worker(bus, handler)
    worker.policies = (*stage_policies(), AttemptLimit())
    return worker


async def attempts_of(bus: MemoryBus, rid: str) -> Attempts:
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    return Attempts.model_validate_json((await kv.get(attempts_key(rid, Stage.train))).value)


async def test_a_handler_that_always_raises_uses_up_the_attempts_and_the_worker_dead_letters_it(bus: MemoryBus) -> None:
    async def always(event: DataResult, ctx: StageContext) -> None:
        raise ConnectionError("the artifact store is away")

    handler = Counting(always)
    s = bus.subjects
    async with running(bus, counting_worker(bus, handler)):
        ack = await send(bus, "doomed-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).termed, what="the message terminated")
    assert handler.runs == [("doomed-1", n) for n in range(1, bus.settings.max_deliver + 1)]
    assert bus.consumer(durable(bus)).max_deliver == -1  # the server counts nothing: the worker does
    assert results(bus) == [] and bus.messages(s.max_deliveries_advisory(s.stream_events, durable(bus))) == []
    [letter] = bus.events(s.dlq, DeadLetter)
    assert (letter.request_id, letter.stage, letter.deliveries) == ("doomed-1", Stage.train, bus.settings.max_deliver)
    [original] = bus.messages(s.completed("data"))
    assert letter.original_subject == original.subject and letter.payload == original.data
    assert f"{bus.settings.max_deliver} raised" in letter.reason and "the artifact store is away" in letter.reason
    record = await attempts_of(bus, "doomed-1")
    assert (record.failed, record.lost, record.holder) == (bus.settings.max_deliver, [], None)


async def test_a_delivery_that_meets_a_live_attempt_waits_and_a_silent_one_is_taken_over_and_counted(
    bus: MemoryBus, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The records' clock stands still: a beat's age is what the test wrote, however long the worker
    # took to look at it (a loaded machine could make a fresh beat look silent).
    now = time.time()
    monkeypatch.setattr(attempts, "time", SimpleNamespace(time=lambda: now))
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    key = attempts_key("busy-1", Stage.train)
    # Another worker holds the request and beats: its message came back (its in_progress was lost).
    await kv.create(key, Attempts(holder="elsewhere#1", beat_at=now).model_dump_json().encode())
    handler = Counting()
    async with running(bus, counting_worker(bus, handler)):
        ack = await send(bus, "busy-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).naks == 1, what="the delivery naked")
        assert handler.runs == []
        assert (await attempts_of(bus, "busy-1")).counted == 0
        # The holder goes silent (its worker died): the next delivery counts it lost and runs.
        entry = await kv.get(key)
        stale = Attempts(holder="elsewhere#1", beat_at=now - bus.settings.ack_wait_s)
        await kv.update(key, stale.model_dump_json().encode(), last=entry.revision)
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the takeover acked")
    assert handler.runs == [("busy-1", 2)] and len(results(bus)) == 1
    record = await attempts_of(bus, "busy-1")
    assert (record.lost, record.failed, record.holder) == (["elsewhere#1"], 0, None)


async def test_a_handlings_number_is_the_records_count_of_handlings_not_the_servers_of_deliveries(
    bus: MemoryBus,
) -> None:
    """Deliveries that never reached a handler (a fetch that expired as the server sent it: seen in
    CI) or met a live attempt take no number: the record counts the handlings that began."""
    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    # Two handlings began and raised (their deliveries were the server's 1 and 3, say).
    await kv.create(attempts_key("third-1", Stage.train),
                    Attempts(started=2, failed=2).model_dump_json().encode())
    handler = Counting()
    async with running(bus, counting_worker(bus, handler)):
        ack = await send(bus, "third-1")  # this consumer's first delivery of it
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the handling acked")
    assert handler.runs == [("third-1", 1)]
    [result] = results(bus)
    assert result.runs["train"].attempt == 3
    started = [p for p in bus.heard(bus.subjects.progress("third-1"), Progress) if p.state == "started"]
    assert [(p.attempt, p.message) for p in started] == [(3, "attempt 3")]
    assert (await attempts_of(bus, "third-1")).started == 3


async def test_a_worker_that_stops_during_the_handling_counts_no_attempt(bus: MemoryBus) -> None:
    started = asyncio.Event()

    async def long(event: DataResult, ctx: StageContext) -> None:
        started.set()
        await asyncio.Event().wait()

    async with running(bus, counting_worker(bus, Counting(long))):
        ack = await send(bus, "stopped-1")
        await bus.wait_for(started.is_set, what="the handler started")
        assert (await attempts_of(bus, "stopped-1")).holder is not None
    record = await attempts_of(bus, "stopped-1")
    assert (record.holder, record.counted) == (None, 0)  # released before its nak: the next worker runs at once
    assert bus.tracking(ack, durable(bus)).naks == 1


async def test_a_handler_that_meets_an_unavailable_nats_server_counts_no_attempt(bus: MemoryBus) -> None:
    """A JetStream 503 (a leader election, a partition) is the infrastructure's: more of them than
    max_deliver still end in the stage's result, not a dead letter."""
    import nats.js.errors

    runs = bus.settings.max_deliver + 1

    async def unavailable_then_fine(event: DataResult, ctx: StageContext) -> None:
        if len(handler.runs) < runs:
            raise nats.js.errors.ServiceUnavailableError(description="JetStream system temporarily unavailable")

    handler = Counting(unavailable_then_fine)
    async with running(bus, counting_worker(bus, handler)):
        ack = await send(bus, "shaken-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the message acked")
    assert len(handler.runs) == runs
    assert bus.events(bus.subjects.dlq, DeadLetter) == []
    record = await attempts_of(bus, "shaken-1")
    assert (record.failed, record.lost, record.holder) == (0, [], None)
    assert record.unavailable == runs - 1  # the last run succeeded


async def test_a_server_unavailable_without_end_is_dead_lettered_after_its_own_longer_limit(bus: MemoryBus) -> None:
    """A handler that meets a NATS timeout every time (an outage, or outputs that always time out on
    upload) is not retried for ever: after UNAVAILABLE_PER_ATTEMPT × max_deliver tries it is
    dead-lettered, and the letter says the server was unavailable, not that the candidate failed."""
    import nats.errors

    async def always_times_out(event: DataResult, ctx: StageContext) -> None:
        raise nats.errors.TimeoutError

    handler = Counting(always_times_out)
    limit = UNAVAILABLE_PER_ATTEMPT * bus.settings.max_deliver
    async with running(bus, counting_worker(bus, handler)):
        ack = await send(bus, "outage-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).termed, what="the message terminated")
    assert len(handler.runs) == limit
    [letter] = bus.events(bus.subjects.dlq, DeadLetter)
    assert (letter.request_id, letter.stage) == ("outage-1", Stage.train)
    assert "NATS server was unavailable" in letter.reason and f"{limit} times" in letter.reason
    assert "TimeoutError" in letter.reason
    record = await attempts_of(bus, "outage-1")
    assert (record.failed, record.lost, record.unavailable, record.holder) == (0, [], limit, None)


@pytest.mark.parametrize("lost_write", ["before", "after"])
async def test_a_release_that_meets_an_unavailable_server_is_tried_again_and_counted_once(
    bus: MemoryBus, monkeypatch: pytest.MonkeyPatch, lost_write: str
) -> None:
    """The handler raised (the candidate's failure), then the release's write timed out: before it
    reached the server, or after it had landed (the answer was lost). The release is tried again
    until it is written, and the failure is counted once. Before, a timeout left the hold, and the
    next delivery counted it lost."""
    import nats.errors

    kv = await bus.kv(bus.subjects.kv_stage_results(Stage.train))
    key = attempts_key("shaky-1", Stage.train)
    timeouts: list[str] = []  # what the next update of the record meets
    update = kv.update

    async def update_on_a_shaky_server(k: str, value: bytes, last: int | None = None) -> int:
        when = timeouts.pop(0) if k == key and timeouts else None
        if when == "before":
            raise nats.errors.TimeoutError
        revision = await update(k, value, last)
        if when == "after":
            raise nats.errors.TimeoutError
        return revision

    monkeypatch.setattr(kv, "update", update_on_a_shaky_server)

    async def fail_once(event: DataResult, ctx: StageContext) -> None:
        if len(handler.runs) == 1:
            timeouts.append(lost_write)
            raise ValueError("the candidate's script failed")

    handler = Counting(fail_once)
    async with running(bus, counting_worker(bus, handler)):
        ack = await send(bus, "shaky-1")
        await bus.wait_for(lambda: bus.tracking(ack, durable(bus)).acked, what="the second handling acked")
    assert timeouts == [], "the release's write never met the timeout"
    record = await attempts_of(bus, "shaky-1")
    assert (record.failed, record.lost, record.holder, record.started) == (1, [], None, 2)
    assert "the candidate's script failed" in record.last_error
    assert len(handler.runs) == 2
