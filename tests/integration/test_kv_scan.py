"""Listing and watching a whole KV bucket (shared/kv_scan.py) on a real nats-server, including the
moment nats-py's own keys() gets wrong: the server has delivered the snapshot's last message but
the client has not read it yet when the consumer's info comes back."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import NoKeysError

from shared.bus import Bus
from shared.kv_scan import BucketWatch, KeyChange, latest, list_keys

#: Hang guard for each wait on the server's next message: every one of them comes; only a hang ends here.
HANG_GUARD_S = 60.0


async def new_bucket(bus: Bus) -> str:
    name = "scan_" + secrets.token_hex(4)
    await bus.kv(name)
    return name


@contextlib.contextmanager
def kv_deliveries_read_late(delay_s: float = 0.3) -> Iterator[None]:
    """The client reads every JetStream delivery of a KV stream ``delay_s`` after it arrived, and
    everything else (the consumer info reply among it) at once: the order a loaded machine can
    produce, made certain."""
    original = NatsClient._process_msg
    late: set[asyncio.Task[Any]] = set()

    async def process(self: NatsClient, sid: int, subject: bytes, reply: bytes, data: bytes,
                      headers: bytes) -> None:
        if reply and reply.startswith(b"$JS.ACK.KV_"):
            async def later() -> None:
                await asyncio.sleep(delay_s)
                await original(self, sid, subject, reply, data, headers)

            task = asyncio.create_task(later())
            late.add(task)
            task.add_done_callback(late.discard)
            return
        await original(self, sid, subject, reply, data, headers)

    NatsClient._process_msg = process  # type: ignore[method-assign]
    try:
        yield
    finally:
        NatsClient._process_msg = original  # type: ignore[method-assign]


@contextlib.contextmanager
def kv_deliveries_read_after_the_consumer_info() -> Iterator[None]:
    """The exact moment of the race, made certain: a KV listing's consumer info is answered only
    once the server has delivered everything (its num_pending is 0), and the client reads those
    deliveries only after that answer came back."""
    original_process = NatsClient._process_msg
    original_info = JetStreamContext.PushSubscription.consumer_info
    held: list[Callable[[], Awaitable[None]]] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def process(self: NatsClient, sid: int, subject: bytes, reply: bytes, data: bytes,
                      headers: bytes) -> None:
        if reply and reply.startswith(b"$JS.ACK.KV_"):
            held.append(lambda: original_process(self, sid, subject, reply, data, headers))
            return
        await original_process(self, sid, subject, reply, data, headers)

    async def release_held() -> None:
        # A task of its own: it runs only once the caller has acted on the info (nats-py puts its
        # "snapshot complete" marker with no await between the info's return and the put).
        await asyncio.sleep(0)
        while held:
            await held.pop(0)()

    async def info(self: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HANG_GUARD_S  # hang guard: the server delivers the snapshot at once
        while (result := await original_info(self, *args, **kwargs)).num_pending != 0:
            assert loop.time() < deadline, f"the server never delivered the snapshot: {result}"
            await asyncio.sleep(0.02)
        task = asyncio.create_task(release_held())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return result

    NatsClient._process_msg = process  # type: ignore[method-assign]
    JetStreamContext.PushSubscription.consumer_info = info  # type: ignore[method-assign]
    try:
        yield
    finally:
        NatsClient._process_msg = original_process  # type: ignore[method-assign]
        JetStreamContext.PushSubscription.consumer_info = original_info  # type: ignore[method-assign]


async def test_list_keys_finds_what_a_late_read_hides_from_nats_py(bus: Bus) -> None:
    bucket = await new_bucket(bus)
    kv = await bus.kv(bucket)
    await kv.put("request-1", b"{}")
    with kv_deliveries_read_after_the_consumer_info():
        # The fault is real: nats-py's own listing says the bucket is empty...
        with pytest.raises(NoKeysError):
            await kv.keys()
        # ...and ours waits for the message the server says it delivered.
        assert await list_keys(bus.js, bucket, timeout_s=HANG_GUARD_S) == ["request-1"]
        assert [(c.key, c.value) for c in await latest(bus.js, bucket, timeout_s=HANG_GUARD_S)] == [
            ("request-1", b"{}")]
    # Read at once, both agree.
    assert await kv.keys() == await list_keys(bus.js, bucket) == ["request-1"]


async def test_list_keys_leaves_removed_keys_out_and_an_empty_bucket_is_empty(bus: Bus) -> None:
    bucket = await new_bucket(bus)
    assert await list_keys(bus.js, bucket) == []
    kv = await bus.kv(bucket)
    for key in ("a", "b", "c", "d"):
        await kv.put(key, key.encode())
    await kv.delete("b")
    await kv.purge("d")
    await kv.put("a", b"again")  # a key's latest value counts once
    assert sorted(await list_keys(bus.js, bucket)) == ["a", "c"]
    # The values in one pass: each key's latest, none of a removed key.
    assert {c.key: c.value for c in await latest(bus.js, bucket)} == {"a": b"again", "c": b"c"}
    for key in ("a", "c"):
        await kv.delete(key)
    assert await list_keys(bus.js, bucket) == []


async def test_watch_gives_the_snapshot_then_its_end_then_each_change(bus: Bus) -> None:
    bucket = await new_bucket(bus)
    kv = await bus.kv(bucket)
    await kv.put("one", b"1")
    await kv.put("two", b"2")
    with kv_deliveries_read_late():
        async with BucketWatch(bus.js, bucket) as watch:
            snapshot = [await watch.next(HANG_GUARD_S), await watch.next(HANG_GUARD_S)]
            assert await watch.next(HANG_GUARD_S) is None  # only now, after both entries arrived late
            assert {(c.key, c.value) for c in snapshot if c} == {("one", b"1"), ("two", b"2")}
            await kv.delete("one")
            removal = await watch.next(HANG_GUARD_S)
            assert isinstance(removal, KeyChange) and removal.key == "one" and removal.removed
            await kv.put("three", b"3")
            change = await watch.next(HANG_GUARD_S)
            assert change is not None and (change.key, change.value, change.removed) == ("three", b"3", False)
            assert change.revision > removal.revision


async def test_watch_of_an_empty_bucket_says_so_at_once(bus: Bus) -> None:
    bucket = await new_bucket(bus)
    async with BucketWatch(bus.js, bucket) as watch:
        # At once: the marker needs no message (none would ever come); a watch that waited for one
        # would end in the hang guard's TimeoutError.
        assert await watch.next(HANG_GUARD_S) is None
        kv = await bus.kv(bucket)
        await kv.put("first", b"x")
        change = await watch.next(HANG_GUARD_S)
        assert change is not None and change.key == "first"
