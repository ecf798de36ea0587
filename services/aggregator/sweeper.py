"""The sweeper: every ``sweep_interval_s``, each open record (services/aggregator/open_records.py)
is looked at, and what a crash or a lost message left undone is done: a verdict or report claimed
but not published is published, a hidden test split that never came is given up on, and a request
silent for longer than its stage may run ends with an error verdict naming the stage."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta

from services.aggregator.open_records import OpenRecords
from services.aggregator.store import RecordStore
from services.aggregator.transitions import Transition, give_up_on_test, on_stuck, unchanged
from shared.bus import Bus
from shared.events import utcnow
from shared.logs import get_logger
from shared.stagespec import StageSpec

log = get_logger("ftbus.aggregator")

#: Apply a transition to a request's record, and publish what it then owes (the aggregator's own).
Apply = Callable[[str, Transition], Awaitable[None]]


async def periodically(
    interval: float, stop: asyncio.Event, work: Callable[[], Awaitable[object]], failed: str
) -> None:
    """``work()`` every ``interval`` seconds until ``stop``; a failure is logged (as ``failed``), and
    the next round comes as usual."""
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
        if stop.is_set():
            return
        try:
            await work()
        except Exception:
            log.exception(failed)


class Sweeper:
    def __init__(self, bus: Bus, store: RecordStore, apply: Apply, rows: dict[str, StageSpec]) -> None:
        self.bus = bus
        self.store = store
        self.apply = apply
        self.rows = rows
        self._open: OpenRecords | None = None
        #: The stage that publishes the hidden test split: how long it may run bounds the wait for it.
        s = bus.subjects
        self.test_stage = next((stage for stage, row in rows.items() if s.bench_test in row.publishes(s)), None)

    async def run(self, stop: asyncio.Event) -> None:
        await periodically(self.bus.settings.sweep_interval_s, stop, self.sweep, "sweep failed")

    async def sweep(self) -> None:
        await self.store.bucket()  # the bucket exists
        if self._open is None:
            self._open = OpenRecords(self.bus.js, self.bus.subjects.kv_requests)
        now = utcnow()
        for key in await self._open.refresh():
            record = await self.store.get(key)
            if record is None or (record.verdict_published and record.report_published):
                self._open.forget(key)  # gone, or done (written before records said so)
                continue
            if record.verdict is not None:
                if not record.verdict_published or (record.report and not record.report_published):
                    await self.apply(key, unchanged)  # a crash after the claim: publish it now
                elif record.report is None and now - record.updated_at > self.limit(self.test_stage):
                    await self.apply(key, give_up_on_test)
                continue
            if now - record.updated_at > self.limit(record.stage):
                row = self.rows.get(record.stage or "")
                silent = int((now - record.updated_at).total_seconds())
                await self.apply(key, lambda r, row=row, silent=silent: on_stuck(r, row, silent))  # type: ignore[misc]

    def limit(self, stage: str | None) -> timedelta:
        """How long a request may stay silent in ``stage`` (its row's timeout, and some grace); before
        any stage: the first row's."""
        settings = self.bus.settings
        row = self.rows.get(stage or "") or next(iter(self.rows.values()))
        return timedelta(seconds=row.limit(settings) + settings.stuck_grace_s)
