"""The aggregator's outbox: publish what a record holds and has not published (its verdict, its
report), then mark it published in the record.

Publish first, mark after: a crash in between publishes it again (a redelivery, the sweeper), and
the verdict and report streams keep one message per request (a second is refused). A record marked
published has therefore been published.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats

from services.aggregator.store import RecordStore
from services.aggregator.transitions import owed
from shared import metrics
from shared.bus import Bus
from shared.events import Stage
from shared.logs import bound, get_logger
from shared.records import RequestRecord

log = get_logger("ftbus.aggregator")


class Outbox:
    def __init__(self, bus: Bus, store: RecordStore) -> None:
        self.bus = bus
        self.store = store

    async def deliver(self, record: RequestRecord) -> RequestRecord:
        """Publish what ``record`` owes and mark it so; the record as marked (the caller holds the
        request's lock). Nothing owed: the record as it is."""
        flags = owed(record)
        if not flags:
            return record
        rid, s = record.request_id, self.bus.subjects
        said: dict[str, Any] = {}
        with bound(request_id=rid, stage=Stage.aggregate):
            publishing = []
            if "verdict_published" in flags and record.verdict is not None:
                publishing.append(self._publish_once(s.verdict(rid), record.verdict, f"{rid}:aggregate:verdict"))
                said.update(status=record.verdict.status, final_decision=record.verdict.final_decision,
                            failed_stage=record.verdict.failed_stage)
            if "report_published" in flags and record.report is not None:
                publishing.append(self._publish_once(s.report(rid), record.report, f"{rid}:aggregate:report"))
                said["has_test"] = record.report.benchmark_test is not None
            await asyncio.gather(*publishing)
            if "verdict_published" in flags and record.verdict is not None:
                metrics.verdict_published(record.verdict.status, record.submitted_at)
            log.info(f"{' and '.join(flag.removesuffix('_published') for flag in flags)} published", **said)

        def mark(stored: RequestRecord) -> bool:
            if all(getattr(stored, flag) for flag in flags):
                return False
            for flag in flags:
                setattr(stored, flag, True)
            return True

        marked, _ = await self.store.update(rid, mark, create=False, start=record)
        return marked or record

    async def _publish_once(self, subject: str, event: Any, msg_id: str) -> None:
        try:
            await self.bus.publish(subject, event, msg_id)
        except nats.js.errors.APIError as exc:
            # The stream holds at most one message per subject and refuses a second: it is out
            # already, which is exactly what we wanted.
            if "maximum messages per subject" not in str(exc).lower():
                raise
