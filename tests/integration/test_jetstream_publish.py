"""The lighter JetStream publish (shared/jetstream.py) against a real server: what a publish
tells (the stream, the sequence, a duplicate), and how each way it can fail reaches the caller as
nats-py's own errors, which the bus's retries and the aggregator's compare-and-set depend on."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest
from nats.js.errors import KeyWrongLastSequenceError

from shared.bus import Bus
from shared.jetstream import LeanJetStream


async def test_a_publish_is_acked_with_its_stream_and_sequence_and_a_duplicate_is_told(bus: Bus) -> None:
    assert isinstance(bus.js, LeanJetStream), "the bus does not publish through the lighter path"
    s = bus.subjects
    first = await bus.js.publish(s.eval_requested, b"one", headers={"Nats-Msg-Id": "dup-1"})
    second = await bus.js.publish(s.eval_requested, b"two", headers={"Nats-Msg-Id": "dup-2"})
    again = await bus.js.publish(s.eval_requested, b"one", headers={"Nats-Msg-Id": "dup-1"})
    assert first.stream == second.stream == s.stream_events
    assert second.seq == first.seq + 1 and not first.duplicate and not second.duplicate
    assert again.duplicate and again.seq == first.seq, "a second copy with the same id was stored"
    stored = await bus.js.get_msg(s.stream_events, second.seq)
    assert stored.data == b"two" and stored.subject == s.eval_requested
    assert not bus.nc._resp_map, "a publish left its reply waiting"


async def test_no_stream_on_the_subject_is_told_at_once_not_after_the_timeout(bus: Bus) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await bus.js.publish(f"{bus.subjects.prefix}-nowhere.x", b"x", timeout=30)
    assert loop.time() - started < 10


async def test_a_refused_write_raises_the_servers_error(bus: Bus) -> None:
    """The KV's compare-and-set is a publish with an expected revision: a stale one is refused,
    and the aggregator reads the record again on exactly this error."""
    kv = await bus.kv(bus.subjects.kv_status)
    revision = await kv.create("cas-1", b"a")
    await kv.update("cas-1", b"b", last=revision)
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("cas-1", b"c", last=revision)
    with pytest.raises(nats.js.errors.APIError):
        await bus.js.publish(bus.subjects.eval_requested, b"x",
                             headers={"Nats-Expected-Last-Sequence": "1"})
    assert (await kv.get("cas-1")).value == b"b"


async def test_a_silent_responder_times_out_with_nats_error_and_leaves_nothing_behind(bus: Bus) -> None:
    subject = f"{bus.subjects.prefix}-silent.x"
    sub = await bus.nc.subscribe(subject)  # a responder that never answers
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await bus.js.publish(subject, b"x", timeout=0.3)
    finally:
        await sub.unsubscribe()
    assert not bus.nc._resp_map


async def test_a_publish_asking_for_its_stream_takes_nats_py_s_path(bus: Bus) -> None:
    s = bus.subjects
    ack = await bus.js.publish(s.eval_requested, b"x", stream=s.stream_events)
    assert ack.stream == s.stream_events
    with pytest.raises(nats.js.errors.APIError):
        await bus.js.publish(s.eval_requested, b"x", stream="not-this-one")
