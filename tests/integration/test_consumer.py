"""shared/consumer.py on a real nats-server: a burst is fetched in batches as large as the free
handlers, never more at once than the concurrency; an idle consumer asks for a message per free
handler and gets the one that comes the moment it comes, not when its fetch expires."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from shared import consumer
from shared.bus import Bus
from shared.consumer import Slot, consume
from tests.integration.test_delivery import poll


class CountedFetches:
    """Wraps every pull subscription the consumer binds: what each fetch asked for and got."""

    def __init__(self, bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fetches: list[tuple[int, int]] = []  # (asked, got)
        bind = bus.js.pull_subscribe_bind

        async def counted_bind(*args: Any, **kwargs: Any) -> Any:
            psub = await bind(*args, **kwargs)
            fetch = psub.fetch

            async def counted_fetch(batch: int = 1, *args: Any, **kw: Any) -> Any:
                msgs = await fetch(batch, *args, **kw)
                self.fetches.append((batch, len(msgs)))
                return msgs

            psub.fetch = counted_fetch
            return psub

        monkeypatch.setattr(bus.js, "pull_subscribe_bind", counted_bind)


async def _publish(bus: Bus, subject: str, n: int) -> None:
    await asyncio.gather(*(bus.js.publish(subject, f"m{i}".encode()) for i in range(n)))


async def test_a_burst_is_fetched_in_batches_and_handled_at_most_concurrency_at_once(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = bus.subjects
    counted = CountedFetches(bus, monkeypatch)
    running, peak, handled = 0, 0, []
    release = asyncio.Event()

    async def on_message(msg: Any, slot: Slot) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()  # every handler holds its message until the burst is in
        running -= 1
        handled.append(msg.data)
        await msg.ack()

    await _publish(bus, s.eval_requested, 40)  # waiting before the consumer starts: one burst
    stop = asyncio.Event()
    task = asyncio.create_task(consume(bus, s.stream_events, "consumer-test", [s.eval_requested], on_message,
                                       stop, concurrency=8, what="test"))
    try:
        await poll(lambda: _true(running == 8), "eight handlers busy", timeout_s=60)
        # Room for a ninth to be taken; one taken any later, while the eight still hold theirs or
        # after, shows in the peak at the end.
        await asyncio.sleep(0.5)
        assert running == 8 and peak == 8, "more messages taken than there are free handlers"
        release.set()
        await poll(lambda: _true(len(handled) == 40), "the burst handled", timeout_s=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)  # a hang guard
    assert peak == 8, "more messages taken than there are free handlers"
    assert sorted(handled) == sorted(f"m{i}".encode() for i in range(40))
    got = [n for _, n in counted.fetches if n]
    assert counted.fetches[0] == (8, 8), "the burst was not fetched for every free handler at once"
    assert len(got) < 40, f"a fetch per message: {counted.fetches}"
    assert all(n <= asked for asked, n in counted.fetches)


async def test_an_idle_consumer_gets_a_message_the_moment_it_comes(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle consumer with 8 free handlers asks for 8 messages and gets the one that comes as soon
    as it comes, not when its fetch expires (made 600 s here, ten times the hang guard of the wait for
    the message, so that waiting for the expiry could not pass)."""
    monkeypatch.setattr(consumer, "FETCH_WAIT_S", 600.0)
    s = bus.subjects
    counted = CountedFetches(bus, monkeypatch)
    handled: list[bytes] = []

    async def on_message(msg: Any, slot: Slot) -> None:
        handled.append(msg.data)
        await msg.ack()

    stop = asyncio.Event()
    task = asyncio.create_task(consume(bus, s.stream_events, "consumer-idle", [s.eval_requested], on_message,
                                       stop, concurrency=8, what="test"))
    try:
        async def fetch_waiting() -> bool:  # the consumer's fetch is waiting at the server
            with contextlib.suppress(NotFoundError):
                return (await bus.js.consumer_info(s.stream_events, "consumer-idle")).num_waiting >= 1
            return False

        await poll(fetch_waiting, "the consumer's fetch to wait at the server", timeout_s=60)
        await _publish(bus, s.eval_requested, 1)
        await poll(lambda: _true(handled == [b"m0"]), "the one message handled", timeout_s=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
    assert counted.fetches[0] == (8, 1)


async def _true(value: bool) -> bool:
    return value
