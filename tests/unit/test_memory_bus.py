"""The in-memory bus (tests/memory_bus.py) behaves as the NATS server does where workers rely on it:
subject wildcards, the streams' subjects and limits, de-duplication by msg id, core delivery, KV
revisions and compare-and-set, redelivery, and the MAX_DELIVERIES advisory."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.errors import MsgAlreadyAckdError
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NoStreamResponseError

import tests.memory_bus
from shared import codec
from shared.consumer import Slot, consume
from shared.events import CancelRequested, Progress, Stage
from tests.memory_bus import MemoryBus, MemoryMsg, memory_settings, subject_matches

DURABLE = "test-consumer"
HANG_S = 60  # hang guard only: what the tests wait for here takes milliseconds


class BusClock:
    """The loop time the in-memory bus goes by (ack waits, nak delays, redeliveries), standing still
    until the test moves it: whether a message comes back is then decided by the test, never by how
    fast a loaded machine runs. Its waits (``bus.wait_for``) go by it too, and so never time out:
    a test that uses it runs under its own hang guard on the real clock (``asyncio.timeout``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.buses: list[MemoryBus] = []

    async def advance(self, seconds: float) -> None:
        """Move on ``seconds``, and let every consumer look at what is due now."""
        self.now += seconds
        for bus in self.buses:
            for consumer in bus.consumers.values():
                consumer.wake.set()
        await turns()


async def turns(n: int = 50) -> None:
    """``n`` turns of the event loop (counted, not timed): woken tasks run their next steps."""
    for _ in range(n):
        await asyncio.sleep(0)


class _ClockedLoop:
    def __init__(self, loop: asyncio.AbstractEventLoop, clock: BusClock) -> None:
        self._loop, self._clock = loop, clock

    def time(self) -> float:
        return self._clock.now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


class _ClockedAsyncio:
    """``asyncio`` as tests/memory_bus.py sees it: the same, but for its running loop's time."""

    def __init__(self, clock: BusClock) -> None:
        self._clock = clock

    def get_running_loop(self) -> _ClockedLoop:
        return _ClockedLoop(asyncio.get_running_loop(), self._clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


def use_bus_clock(monkeypatch: pytest.MonkeyPatch, *buses: MemoryBus) -> BusClock:
    clock = BusClock()
    clock.buses.extend(buses)
    monkeypatch.setattr(tests.memory_bus, "asyncio", _ClockedAsyncio(clock))
    return clock


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[MemoryBus]:
    bus = MemoryBus(memory_settings(tmp_path, ack_wait_s=0.4, max_deliver=3))
    yield bus
    await bus.close()
    assert bus.errors == []


@contextlib.asynccontextmanager
async def consuming(bus: MemoryBus, on_message: Callable[[MemoryMsg], Awaitable[None]], *,
                    filters: list[str] | None = None, concurrency: int = 1) -> AsyncIterator[None]:
    stop = asyncio.Event()

    async def handle(msg: Any, slot: Slot) -> None:
        await on_message(msg)

    task = asyncio.create_task(consume(bus, bus.subjects.stream_events, DURABLE,
                                       filters or [bus.subjects.completed("data")], handle, stop,
                                       concurrency=concurrency))
    try:
        await bus.wait_for(lambda: (bus.subjects.stream_events, DURABLE) in bus.consumers, what="the consumer")
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, HANG_S)  # hang guard


def cancel(rid: str) -> CancelRequested:
    return CancelRequested(request_id=rid)


# ---------------------------------------------------------------------------- subjects and streams


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("ftbus.data.completed", "ftbus.data.completed", True),
        ("ftbus.data.*", "ftbus.data.failed", True),
        ("ftbus.data.*", "ftbus.data.failed.more", False),
        ("ftbus.*.completed", "ftbus.train.completed", True),
        ("ftbus.>", "ftbus.verdict.r1", True),
        ("ftbus.>", "ftbus", False),
        ("ftbus.data", "ftbus.data.completed", False),
        ("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.*", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.d", True),
    ],
)
def test_subject_wildcards(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


async def test_a_publish_lands_in_the_stream_that_holds_its_subject(bus: MemoryBus) -> None:
    s = bus.subjects
    event = cancel("r1")
    assert (await bus.publish(s.completed("data"), event)).stream == s.stream_events
    assert (await bus.publish(s.bench_test, event)).stream == s.stream_test
    assert (await bus.publish(s.verdict("r1"), event)).stream == s.stream_verdicts
    assert (await bus.publish(s.dlq, event)).stream == s.stream_dlq
    with pytest.raises(NoStreamResponseError):
        await bus.publish(f"{s.prefix}.nowhere", event)
    stored = [m.subject for m in bus.messages(f"{s.prefix}.>")]
    assert stored == [s.completed("data"), s.bench_test, s.verdict("r1"), s.dlq]
    assert bus.events(s.completed("data")) == [event]


async def test_a_verdict_stream_takes_one_message_per_subject(bus: MemoryBus) -> None:
    s = bus.subjects
    await bus.publish(s.verdict("r1"), cancel("r1"))
    with pytest.raises(APIError, match="maximum messages per subject"):
        await bus.publish(s.verdict("r1"), cancel("r1"))
    await bus.publish(s.verdict("r2"), cancel("r2"))  # another request's subject
    await bus.publish(s.report("r1"), cancel("r1"))
    assert [m.subject for m in bus.messages(s.verdict())] == [s.verdict("r1"), s.verdict("r2")]


async def test_a_second_publish_with_the_same_msg_id_is_not_stored(bus: MemoryBus) -> None:
    s = bus.subjects
    first = await bus.publish(s.completed("train"), cancel("r1"), "r1:train:completed")
    again = await bus.publish_payload(s.completed("train"), codec.encode(cancel("r1")), "r1:train:completed")
    other = await bus.publish(s.completed("train"), cancel("r1"), "r1:train:failed")
    assert not first.duplicate and again.duplicate and not other.duplicate
    assert again.seq == first.seq and other.seq == first.seq + 1
    assert len(bus.messages(s.completed("train"))) == 2
    assert bus.duplicates == ["r1:train:completed"]


async def test_core_subscribers_hear_every_publish_in_order(bus: MemoryBus) -> None:
    s = bus.subjects
    heard: list[str] = []

    async def on_progress(msg: Any) -> None:
        heard.append(codec.decode(msg.data, Progress).state)

    sub = await bus.nc.subscribe(s.progress(), cb=on_progress)
    for state in ("started", "running", "finished"):
        await bus.publish_core(s.progress("r1"), Progress(request_id="r1", stage=Stage.train, state=state))
    await bus.publish_core(f"{s.prefix}.other", cancel("r1"))  # nobody listens, nothing stores it: lost
    await bus.flush()
    assert heard == ["started", "running", "finished"]
    assert bus.messages(s.progress()) == []  # core only: no stream holds progress
    await sub.unsubscribe()
    await bus.publish_core(s.progress("r1"), Progress(request_id="r1", stage=Stage.train))
    await bus.flush()
    assert len(heard) == 3


async def test_a_core_publish_on_a_stream_subject_is_stored_and_a_jetstream_one_is_heard(bus: MemoryBus) -> None:
    s = bus.subjects
    heard: list[str] = []

    async def on_cancel(msg: Any) -> None:
        heard.append(codec.decode(msg.data, CancelRequested).request_id)

    await bus.nc.subscribe(s.cancel, cb=on_cancel)
    await bus.publish_core(s.cancel, cancel("core-1"))
    await bus.publish(s.cancel, cancel("js-1"), "js-1:control:cancel")
    await bus.flush()
    assert heard == ["core-1", "js-1"]
    assert [e.request_id for e in bus.events(s.cancel)] == ["core-1", "js-1"]


# ---------------------------------------------------------------------------- key-value


async def test_kv_revisions_are_the_bucket_s_sequence_and_writes_compare_and_set(bus: MemoryBus) -> None:
    kv = await bus.kv("ftbus_status")
    assert await kv.put("a", b"1") == 1
    assert await kv.put("b", b"1") == 2
    assert await kv.update("a", b"2", last=1) == 3
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("a", b"3", last=1)
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.create("b", b"again")
    entry = await kv.get("a")
    assert (entry.key, entry.value, entry.revision) == ("a", b"2", 3)
    assert sorted(await kv.keys()) == ["a", "b"]
    await kv.delete("a")
    with pytest.raises(KeyNotFoundError):
        await kv.get("a")
    assert await kv.create("a", b"new") == 5  # a deleted key may be created again
    other = await bus.kv("ftbus_requests")
    assert await other.put("a", b"x") == 1  # revisions are per bucket
    with pytest.raises(NoKeysError):
        await (await bus.kv("empty")).keys()
    assert await bus.kv("ftbus_status") is kv


# ---------------------------------------------------------------------------- consumers


async def test_a_consumer_delivers_from_the_stream_s_start_through_its_filters(bus: MemoryBus) -> None:
    s = bus.subjects
    await bus.publish(s.completed("data"), cancel("before"))
    await bus.publish(s.completed("train"), cancel("other-subject"))
    seen: list[tuple[str, int]] = []

    async def on_message(msg: MemoryMsg) -> None:
        seen.append((codec.decode(msg.data).request_id, msg.metadata.num_delivered))
        assert msg.metadata.timestamp.tzinfo is not None
        await msg.ack()

    async with consuming(bus, on_message, filters=[s.completed("data"), s.failed("data")]):
        await bus.publish(s.failed("data"), cancel("after"))
        await bus.wait_for(lambda: bus.consumer(DURABLE).caught_up, what="both acked")
    assert seen == [("before", 1), ("after", 1)]


async def test_a_nak_redelivers_and_an_unacked_message_comes_back_after_ack_wait(
    bus: MemoryBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = bus.subjects
    clock = use_bus_clock(monkeypatch, bus)
    wait = bus.settings.ack_wait_s
    deliveries: list[int] = []

    async def on_message(msg: MemoryMsg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        if msg.metadata.num_delivered == 1:
            await msg.nak()  # at once
        elif msg.metadata.num_delivered == 2:
            pass  # neither ack nor nak: back after ack_wait
        else:
            await msg.ack()
            with pytest.raises(MsgAlreadyAckdError):
                await msg.ack()

    async with asyncio.timeout(HANG_S), consuming(bus, on_message):  # hang guard
        ack = await bus.publish(s.completed("data"), cancel("r1"))
        await bus.wait_for(lambda: deliveries == [1, 2], what="the nak's redelivery")  # no time passed
        await clock.advance(0.9 * wait)
        assert deliveries == [1, 2]  # not yet: the bus's clock is short of ack_wait since delivery 2
        await clock.advance(0.1 * wait)
        await bus.wait_for(lambda: bus.tracking(ack, DURABLE).acked, what="the third delivery acked")
    assert deliveries == [1, 2, 3]
    track = bus.tracking(ack, DURABLE)
    assert (track.delivered, track.naks, track.given_up) == (3, 1, False)


async def test_in_progress_holds_a_message_past_ack_wait_and_term_ends_it(
    bus: MemoryBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = bus.subjects
    clock = use_bus_clock(monkeypatch, bus)
    wait = bus.settings.ack_wait_s

    async def on_message(msg: MemoryMsg) -> None:
        for _ in range(3):  # 2.7 ack waits of work, saying so before each ack wait is out
            await msg.in_progress()
            await clock.advance(0.9 * wait)  # the free handler would take a redelivery due now
        await msg.term()

    async with asyncio.timeout(HANG_S), consuming(bus, on_message, concurrency=2):  # hang guard
        ack = await bus.publish(s.completed("data"), cancel("r1"))
        await bus.wait_for(lambda: bus.tracking(ack, DURABLE).termed, what="the message termed")
    track = bus.tracking(ack, DURABLE)
    assert track.delivered == 1 and track.in_progress == 3


async def test_after_max_deliver_deliveries_a_message_is_given_up_with_an_advisory(bus: MemoryBus) -> None:
    s = bus.subjects
    advisory_subject = s.max_deliveries_advisory(s.stream_events, DURABLE)
    heard: list[dict[str, Any]] = []

    async def on_advisory(msg: Any) -> None:
        heard.append(json.loads(msg.data))

    async def on_message(msg: MemoryMsg) -> None:
        await msg.nak(delay=0.01)

    await bus.nc.subscribe(s.max_deliveries_advisory(s.stream_events), cb=on_advisory)
    async with consuming(bus, on_message):
        ack = await bus.publish(s.completed("data"), cancel("r1"))
        await bus.wait_for(lambda: bus.tracking(ack, DURABLE).given_up, what="the message given up")
        await bus.flush()
    assert bus.tracking(ack, DURABLE).delivered == bus.settings.max_deliver
    advisory = {"stream": s.stream_events, "consumer": DURABLE, "stream_seq": ack.seq, "deliveries": 3}
    [stored] = bus.messages(advisory_subject)
    assert stored.stream == s.stream_advisories
    assert {k: json.loads(stored.data)[k] for k in advisory} == advisory
    assert heard == [json.loads(stored.data)]


async def test_consume_runs_up_to_concurrency_handlers_and_stop_cancels_them(bus: MemoryBus) -> None:
    s = bus.subjects
    running: set[str] = set()
    most = 0
    cancelled: list[str] = []

    async def on_message(msg: MemoryMsg) -> None:
        nonlocal most
        rid = codec.decode(msg.data).request_id
        running.add(rid)
        most = max(most, len(running))
        try:
            await asyncio.Event().wait()  # until stopped
        except asyncio.CancelledError:
            cancelled.append(rid)
            raise

    async with consuming(bus, on_message, concurrency=2):
        for i in range(4):
            await bus.publish(s.completed("data"), cancel(f"r{i}"))
        await bus.wait_for(lambda: len(running) == 2, what="two handlers running")
    assert most == 2 and sorted(cancelled) == ["r0", "r1"]
