"""Stopping asyncio tasks for sure, and awaiting several at once without a task each.

On Python 3.11, ``asyncio.wait_for`` returns its result instead of raising ``CancelledError`` when
a cancel arrives just as that result does; nats-py waits for every reply, fetch and KV read with
it. A task that loops until it is cancelled can therefore take a cancel as if it had never come
and go on looping, and whoever awaits it waits for ever. :func:`cancel_until_done` cancels again
until every task has really ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def cancel_until_done(tasks: Iterable[asyncio.Future[object]], *, every_s: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until all of them are done, cancelling again every ``every_s``
    those that took a cancel and went on. Their results and exceptions are left on the tasks."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every_s)


async def together(*aws: Awaitable[T]) -> list[T]:
    """``asyncio.gather(*aws)`` for the hot path: the first awaitable is awaited here while the others
    run as tasks, so a lone one costs no task at all (a task per publish was a tenth of a light
    stage's CPU: bench/precheck_burst.py). Every one runs to its end, then the first exception
    (in their order) is raised; a cancel cancels them all."""
    if not aws:
        return []
    if len(aws) == 1:
        return [await aws[0]]
    rest = [asyncio.ensure_future(aw) for aw in aws[1:]]
    try:
        first = await aws[0]
    except asyncio.CancelledError:
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        raise
    except BaseException:
        await asyncio.gather(*rest, return_exceptions=True)
        raise
    outcomes = await asyncio.gather(*rest, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [first, *outcomes]  # type: ignore[list-item]
