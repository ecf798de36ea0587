"""A runner that runs at most ``limit`` candidate programs at once (the data stage's
``data_concurrent_runs``): the stage handles many messages at once (pre-checks and cache hits wait
on the server), but each run is the candidate's CPU work on this worker's host."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any


class LimitedRunner:
    """Each run waits for one of ``limit`` turns; the inner runner does the rest."""

    def __init__(self, inner: Any, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a run limit must be at least 1, not {limit}")
        self.inner = inner
        self.limit = limit
        self._turns = asyncio.Semaphore(limit)

    def __getattr__(self, name: str) -> Any:  # name, child_env, ...: the inner runner's
        return getattr(self.inner, name)

    async def run(self, argv: Sequence[str], **kwargs: Any) -> Any:
        async with self._turns:
            return await self.inner.run(argv, **kwargs)
