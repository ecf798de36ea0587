"""Stopping asyncio tasks for sure.

On Python 3.11, ``asyncio.wait_for`` returns its result instead of raising ``CancelledError`` when
a cancel arrives just as that result does; nats-py waits for every reply, fetch and KV read with
it. A task that loops until it is cancelled can therefore take a cancel as if it had never come
and go on looping, and whoever awaits it waits for ever. :func:`cancel_until_done` cancels again
until every task has really ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def cancel_until_done(tasks: Iterable[asyncio.Future[object]], *, every_s: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until all of them are done, cancelling again every ``every_s``
    those that took a cancel and went on. Their results and exceptions are left on the tasks."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every_s)
