"""One pull-consumer loop: every worker of ftbus fetches its messages here.

Stage workers (``shared/runtime.py``) and the aggregator's advisory reader both run
:func:`consume`: ``concurrency`` loops bound to one durable consumer, each fetching one message at a
time and handing it to ``on_message``. An empty fetch is normal; a lost connection or a failed
fetch waits a second and tries again. On ``stop`` the loops are cancelled: a message whose
handling was cancelled is the handler's to nak (so another worker takes it over at once).

``device_slots``: a loop takes one of these before it fetches, and gives it back when its
message says the device work is over (:meth:`Slot.release`, e.g. once the training process has
exited) or when the message is done. A GPU stage runs two loops per slot: the next message is
fetched as soon as the GPU is free, while the last one still uploads its outputs, and never
while the GPU is busy (a message fetched then would wait here for a whole training while
another worker could be idle).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats
from nats.aio.msg import Msg

from shared.bus import Bus
from shared.logs import get_logger
from shared.retry import retry_transient
from shared.tasks import cancel_until_done

log = get_logger("ftbus.consumer")


class Slot:
    """One loop's hold on a device slot for one message; releasing twice is harmless."""

    def __init__(self, gate: asyncio.Semaphore | None) -> None:
        self._gate = gate

    def release(self) -> None:
        if self._gate is not None:
            gate, self._gate = self._gate, None
            gate.release()


OnMessage = Callable[[Msg, Slot], Awaitable[None]]


async def consume(
    bus: Bus,
    stream: str,
    durable: str,
    filters: Sequence[str],
    on_message: OnMessage,
    stop: asyncio.Event,
    *,
    concurrency: int = 1,
    device_slots: int | None = None,
    what: str = "",
) -> None:
    """Run ``concurrency`` fetch loops on ``durable`` until ``stop`` is set (or a loop fails); with
    ``device_slots``, a loop fetches only while it holds one of them."""
    # A cluster electing leaders answers slowly for a few seconds: no reason for a worker to exit.
    await retry_transient(lambda: bus.ensure_consumer(stream, durable, list(filters)), durable)
    gate = asyncio.Semaphore(device_slots) if device_slots else None
    loops = [asyncio.create_task(_loop(bus, stream, durable, on_message, stop, what, gate))
             for _ in range(concurrency)]
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*loops, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopping and task.exception():
                raise task.exception()  # type: ignore[misc]
    finally:
        stopping.cancel()
        await cancel_until_done(loops)


async def _loop(bus: Bus, stream: str, durable: str, on_message: OnMessage, stop: asyncio.Event, what: str,
                gate: asyncio.Semaphore | None) -> None:
    psub = await bus.js.pull_subscribe_bind(durable, stream)
    try:
        while not stop.is_set():
            if gate is not None:
                await gate.acquire()
            slot = Slot(gate)
            try:
                await _fetch_and_handle(psub, slot, on_message, durable, what)
            finally:
                slot.release()
    finally:
        with contextlib.suppress(Exception):
            await psub.unsubscribe()


async def _fetch_and_handle(psub: Any, slot: Slot, on_message: OnMessage, durable: str, what: str) -> None:
    try:
        msgs = await psub.fetch(1, timeout=2)
    except nats.errors.TimeoutError:
        return  # nothing to do: normal control flow
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
        await asyncio.sleep(1)
        return
    except Exception as exc:
        log.warning("fetch failed", consumer=durable, stage=what, error=str(exc))
        await asyncio.sleep(1)
        return
    for msg in msgs:
        try:
            await on_message(msg, slot)
        except Exception:
            # A bus error before or after the handler (a KV read while a node fails over):
            # the message comes back after a pause, and the worker stays up.
            log.exception("message not processed, it will be redelivered", consumer=durable, stage=what)
            with contextlib.suppress(Exception):
                await msg.nak(delay=2)
