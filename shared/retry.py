"""Start-up calls that a cluster electing its leaders may answer slowly or not at all.

A worker that starts while a node is down, or while a fresh 3-node cluster elects stream leaders,
gets timeouts and "service unavailable" from the JetStream API for a few seconds. That is no
reason to exit: such calls are tried again, with backoff, for up to ``deadline_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from shared.logs import get_logger

T = TypeVar("T")
log = get_logger("ftbus.retry")

TRANSIENT: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.ServiceUnavailableError,
)


async def retry_transient(call: Callable[[], Awaitable[T]], what: str, deadline_s: float = 120.0) -> T:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    delay = 0.5
    while True:
        try:
            return await call()
        except TRANSIENT as exc:
            if loop.time() + delay > end:
                raise
            log.warning("the NATS server is not ready, trying again", what=what, error=f"{type(exc).__name__}: {exc}",
                        retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
