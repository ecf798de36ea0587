"""The pull consumer: every worker of ftbus fetches its messages here.

Stage workers (``shared/runtime.py``) and the aggregator's advisory reader both run
:func:`consume` on one durable consumer, handing each message to ``on_message``, up to
``concurrency`` at a time. An empty fetch is normal; a lost connection or a failed fetch waits a
second and tries again. On ``stop`` the handlers are cancelled: a message whose handling was
cancelled is the handler's to nak (so another worker takes it over at once).

Without device slots (the light stages, the aggregator), one fetch at a time serves every free
handler. It asks for one message while none is known to be waiting (it gets it the moment it
comes), and for as many as are waiting behind the last one it got (each message says how many),
up to the free handlers, once a backlog builds (a burst): a pull request per batch, not per
message. An idle worker keeps one pull waiting at the server, renewed every 2 s, not one per
handler (bench/precheck_burst.py). Asking for a batch while none waits would cost each message
a wait for the server's end-of-batch status (0.2-0.4 ms a hop: bench/overhead.py).

``device_slots``: ``concurrency`` loops, each fetching one message at a time; a loop takes a slot
before it fetches, and gives it back when its message says the device work is over
(:meth:`Slot.release`, e.g. once the training process has exited) or when the message is done. A
GPU stage runs two loops per slot: the next message is fetched as soon as the GPU is free, while
the last one still uploads its outputs, and never while the GPU is busy (a message fetched then
would wait here for a whole training while another worker could be idle).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import nats
from nats.aio.msg import Msg

from shared.logs import get_logger
from shared.retry import retry_transient
from shared.tasks import cancel_until_done

if TYPE_CHECKING:
    from shared.bus import Bus

log = get_logger("ftbus.consumer")

#: How long a fetch waits for a first message before it asks again (an idle worker's pull renewal).
FETCH_WAIT_S = 2.0


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
    if device_slots:
        gate = asyncio.Semaphore(device_slots)
        loops = [asyncio.create_task(_loop(bus, stream, durable, on_message, stop, what, gate))
                 for _ in range(concurrency)]
    else:
        loops = [asyncio.create_task(_batches(bus, stream, durable, on_message, stop, what, concurrency))]
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


async def _batches(bus: Bus, stream: str, durable: str, on_message: OnMessage, stop: asyncio.Event, what: str,
                   concurrency: int) -> None:
    """One fetch at a time, for one message, or for the backlog up to the free handlers; a task per
    message."""
    psub = await bus.js.pull_subscribe_bind(durable, stream)
    free = asyncio.Semaphore(concurrency)
    handling: set[asyncio.Task[None]] = set()
    waiting = 0  # messages the server said were waiting behind the last one fetched

    def done(task: asyncio.Task[None]) -> None:
        handling.discard(task)
        free.release()

    try:
        while not stop.is_set():
            await free.acquire()
            wanted = 1
            while wanted < waiting and not free.locked():  # more free handlers, without waiting
                await free.acquire()
                wanted += 1
            msgs = await _fetch(psub, wanted, durable, what)
            waiting = _waiting_behind(msgs[-1]) if msgs else 0
            for _ in range(wanted - len(msgs)):
                free.release()
            for msg in msgs:
                task = asyncio.create_task(_handle(msg, Slot(None), on_message, durable, what))
                handling.add(task)
                task.add_done_callback(done)
    finally:
        await cancel_until_done(list(handling))
        with contextlib.suppress(Exception):
            await psub.unsubscribe()


def _waiting_behind(msg: Msg) -> int:
    """How many messages the consumer still had waiting when the server sent ``msg``."""
    try:
        return int(msg.metadata.num_pending)
    except Exception:  # not a JetStream delivery: no count to go by
        return 0


async def _fetch(psub: Any, batch: int, durable: str, what: str) -> list[Msg]:
    """Up to ``batch`` messages: those waiting now, or the first to come within FETCH_WAIT_S (else none).
    nats-py's fetch asks the server for what is there without lingering once one has come, so a
    batch never waits to be full (bench/precheck_burst.py; tests/integration/test_consumer.py)."""
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


async def _fetch_and_handle(psub: Any, slot: Slot, on_message: OnMessage, durable: str, what: str) -> None:
    for msg in await _fetch(psub, 1, durable, what):
        await _handle(msg, slot, on_message, durable, what)


async def _handle(msg: Msg, slot: Slot, on_message: OnMessage, durable: str, what: str) -> None:
    try:
        await on_message(msg, slot)
    except Exception:
        # A bus error before or after the handler (a KV read while a node fails over):
        # the message comes back after a pause, and the worker stays up.
        log.exception("message not processed, it will be redelivered", consumer=durable, stage=what)
        with contextlib.suppress(Exception):
            await msg.nak(delay=2)
