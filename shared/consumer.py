"""The pull consumer loop: every worker of ftbus fetches its messages here.

Stage workers (``shared/runtime.py``) and the aggregator's advisory reader run :func:`consume` on
one durable consumer, handing each message to ``on_message``, up to ``concurrency`` at a time. One
loop, one fetch at a time: it waits for a free handler (and, with ``device_slots``, a free device
slot), asks the server for as many messages as it has free handlers (one per free slot on a device
stage), and starts a task per message. nats-py's fetch returns what is there as soon as one has
come, so a batch never waits to be full; an idle worker keeps one pull waiting at the server,
renewed every ``FETCH_WAIT_S``. An empty fetch is normal; a lost connection or a failed fetch waits a
second and tries again. On ``stop`` the handlers are cancelled: a message whose handling was
cancelled is the handler's to nak (so another worker takes it over at once).

``device_slots``: a message holds one of them from before its fetch until its handler says the
device work is over (:meth:`Slot.release`, e.g. once the training process has exited) or the
message is done. A GPU stage runs two handlers per slot: the next message is fetched as soon as the
GPU is free, while the last one still uploads its outputs, and never while the GPU is busy (a
message fetched then would wait here for a whole training while another worker could be idle).

The worker sees only the public API of nats-py's pull subscription (``fetch``, ``unsubscribe``) and
of its messages (``nak``): the in-memory bus of the unit tests fakes those, as a server would serve
them (tests/memory_bus.py), and tests/integration/test_bus_contract.py runs one scenario on both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats
from nats.aio.msg import Msg

from shared import metrics
from shared.logs import get_logger
from shared.retry import retry_transient
from shared.tasks import cancel_until_done

log = get_logger("ftbus.consumer")

#: How long a fetch waits for a first message before it asks again (an idle worker's pull renewal).
FETCH_WAIT_S = 2.0
#: A message whose handling failed on a bus error (not the handler's verdict) comes back after this.
ERROR_NAK_S = 2.0
#: ``max_deliver`` of a consumer whose worker counts the attempts itself (shared/attempts.py).
UNLIMITED = -1


class Slot:
    """One message's hold on a device slot; releasing twice is harmless. ``stage``: whose (metrics)."""

    def __init__(self, gate: asyncio.Semaphore | None, stage: str = "") -> None:
        self._gate = gate
        self._stage = stage
        if gate is not None:
            metrics.gpu_slot_taken(stage)

    def release(self) -> None:
        if self._gate is not None:
            gate, self._gate = self._gate, None
            gate.release()
            metrics.gpu_slot_freed(self._stage)


OnMessage = Callable[[Msg, Slot], Awaitable[None]]


async def consume(
    bus: Any,
    stream: str,
    durable: str,
    filters: Sequence[str],
    on_message: OnMessage,
    stop: asyncio.Event,
    *,
    concurrency: int = 1,
    device_slots: int | None = None,
    what: str = "",
    max_deliver: int | None = None,
) -> None:
    """Hand ``durable``'s messages to ``on_message(msg, slot)``, up to ``concurrency`` at once (with
    ``device_slots``, each fetched only while it holds one of them), until ``stop`` is set or the
    loop fails. ``bus``: a :class:`shared.bus.Bus` (its ``ensure_consumer`` and ``js``).
    ``max_deliver``: the consumer's, None for the setting's, :data:`UNLIMITED` when the worker counts."""
    # A cluster electing leaders answers slowly for a few seconds: no reason for a worker to exit.
    await retry_transient(lambda: bus.ensure_consumer(stream, durable, list(filters), max_deliver=max_deliver),
                          durable)
    psub = await bus.js.pull_subscribe_bind(durable, stream)
    try:
        await serve(lambda batch: _fetch(psub, batch, durable, what), on_message, stop, concurrency=concurrency,
                    device_slots=device_slots, durable=durable, what=what)
    finally:
        with contextlib.suppress(Exception):
            await psub.unsubscribe()


#: Up to ``batch`` messages, or none after a while (an idle fetch): where :func:`serve` gets its work.
Take = Callable[[int], Awaitable[list[Msg]]]


async def serve(take: Take, on_message: OnMessage, stop: asyncio.Event, *, concurrency: int = 1,
                device_slots: int | None = None, durable: str = "", what: str = "") -> None:
    """:func:`consume`'s loop over any ``take``: a consumer's fetch, or a fair-share stage's pick
    among its lanes (shared/lanes.py). Until ``stop`` is set or the loop fails."""
    fetching = asyncio.create_task(_fetch_loop(take, on_message, stop, max(1, concurrency), device_slots,
                                               durable, what))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([fetching, stopping], return_when=asyncio.FIRST_COMPLETED)
        if fetching.done():
            fetching.result()  # raise what ended it
    finally:
        stopping.cancel()
        await cancel_until_done([fetching])


async def _fetch_loop(take: Take, on_message: OnMessage, stop: asyncio.Event, concurrency: int,
                      device_slots: int | None, durable: str, what: str) -> None:
    free = asyncio.Semaphore(concurrency)
    gate = asyncio.Semaphore(device_slots) if device_slots else None
    if device_slots:
        metrics.gpu_slots(what, device_slots)
    handling: set[asyncio.Task[None]] = set()

    async def handle(msg: Msg, slot: Slot) -> None:
        try:
            await on_message(msg, slot)
        except Exception:
            # A bus error before or after the handler (a KV read while a node fails over):
            # the message comes back after a pause, and the worker stays up.
            log.exception("message not processed, it will be redelivered", consumer=durable, stage=what)
            with contextlib.suppress(Exception):
                await msg.nak(delay=ERROR_NAK_S)
        finally:
            slot.release()
            free.release()

    try:
        while not stop.is_set():
            await free.acquire()
            wanted = 1
            if gate is not None:
                await gate.acquire()
            else:
                while not free.locked():  # every free handler, without waiting for one
                    await free.acquire()
                    wanted += 1
            msgs = await take(wanted)
            for _ in range(wanted - len(msgs)):
                free.release()
            if gate is not None and not msgs:
                gate.release()
            for msg in msgs:
                task = asyncio.create_task(handle(msg, Slot(gate, what)))
                handling.add(task)
                task.add_done_callback(handling.discard)
    finally:
        await cancel_until_done(list(handling))
        if device_slots:
            metrics.gpu_slots(what, -device_slots)


async def _fetch(psub: Any, batch: int, durable: str, what: str) -> list[Msg]:
    """Up to ``batch`` messages: those waiting now, or the first to come within FETCH_WAIT_S (else none)."""
    try:
        return list(await psub.fetch(batch, timeout=FETCH_WAIT_S))
    except nats.errors.TimeoutError:
        return []  # nothing to do: normal control flow
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
        await asyncio.sleep(1)
        return []
    except Exception as exc:
        log.warning("fetch failed", consumer=durable, stage=what, error=str(exc))
        await asyncio.sleep(1)
        return []
