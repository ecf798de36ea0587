"""A flush that nobody waits for any more must not hang the connection (real nats-server).

nats-py 2.16 answers each PONG by setting the result of the oldest PING's future, even when the
flush() that waited on it was cancelled: the InvalidStateError ends its read loop, and the
connection, still "connected", hears nothing more (docs/dependencies.md, "nats-py"). Bus.guard()
cancels what it runs when the server refuses something, so ftbus flushes only through Bus.flush(),
which never lets that PING's wait be cancelled.
"""

from __future__ import annotations

import asyncio

import nats
import pytest

from shared.bus import Bus
from shared.settings import Settings

#: A hang guard on a reply that must come (a working connection answers at once).
REPLY_S = 60.0
#: How long a deaf connection is given to answer: it never does (its read loop has ended), so this
#: only sets how long the test takes.
DEAF_S = 10.0


async def _cancel_after_ping(flush: asyncio.Future[None]) -> None:
    # One turn of the loop, not a wait: the flush sends its PING, and is cancelled before any PONG
    # can be read (a reply needs the loop to poll the socket, which comes after this turn).
    await asyncio.sleep(0)
    flush.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flush


async def test_a_cancelled_bus_flush_leaves_the_connection_working(bus: Bus) -> None:
    for _ in range(5):
        await _cancel_after_ping(asyncio.ensure_future(bus.flush()))
        # The PONG of the cancelled flush has arrived before this reply: the read loop still runs.
        info = await asyncio.wait_for(bus.js.account_info(), REPLY_S)
        assert info.streams >= 1
    await bus.flush()
    assert bus.nc.is_connected


async def test_a_cancelled_nats_py_flush_still_hangs_the_connection(settings: Settings) -> None:
    """The upstream bug Bus.flush() steps around, reproduced with nats-py alone. When this fails,
    a nats-py release has fixed it: drop the shield in Bus.flush() and the note in
    docs/dependencies.md."""
    nc = await nats.connect(settings.nats_url)
    try:
        await _cancel_after_ping(asyncio.ensure_future(nc.flush()))
        with pytest.raises(nats.errors.TimeoutError):
            await nc.jetstream(timeout=DEAF_S).account_info()
        assert nc.is_connected  # "connected", yet deaf: the hang
    finally:
        await nc.close()
