"""The chaos clients' patience: while nodes die and leaders move, any call may fail for a while."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def retry(call: Callable[[], Awaitable[T]], attempts: int = 30, every_s: float = 1.0) -> T:
    """``call()`` until it succeeds, ``attempts`` times ``every_s`` apart; the last error is raised."""
    for attempt in range(attempts):
        try:
            return await call()
        except Exception:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(every_s)
    raise AssertionError("unreachable")
