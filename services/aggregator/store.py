"""The aggregator's store: each request's record (the requests bucket) and its public view (the
status bucket), written by compare-and-set.

One update at a time per request in this aggregator (:meth:`RecordStore.hold`); across aggregators
the compare-and-set on the record's revision decides, and the loser reads the record again and
applies its change to what won. The public view carries the revision of the record it shows, and
never replaces a view of a later revision: aggregators may write one request's views out of order.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import nats
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.aggregator.transitions import Transition, complete_report
from shared.bus import Bus
from shared.events import utcnow
from shared.records import RequestRecord, RequestStatusView


class Contention(RuntimeError):
    """Every compare-and-set of a record lost: the caller's message is naked and retried later."""


class RecordStore:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._bucket: KeyValue | None = None
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def bucket(self) -> KeyValue:
        if self._bucket is None:
            self._bucket = await self.bus.kv(self.bus.subjects.kv_requests)
        return self._bucket

    @contextlib.asynccontextmanager
    async def hold(self, request_id: str) -> AsyncIterator[None]:
        """This request's lock: one update of a request at a time in this aggregator."""
        lock, users = self._locks.get(request_id) or (asyncio.Lock(), 0)
        self._locks[request_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[request_id]
            if users <= 1:
                del self._locks[request_id]
            else:
                self._locks[request_id] = (lock, users - 1)

    async def get(self, request_id: str) -> RequestRecord | None:
        """The record as stored, its ``revision`` the entry's; None when there is none."""
        try:
            entry = await (await self.bucket()).get(request_id)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        record = RequestRecord.model_validate_json(entry.value)
        record.revision = entry.revision
        return record

    async def update(self, request_id: str, change: Transition, *, create: bool = True,
                     start: RequestRecord | None = None, attempts: int = 100) -> tuple[RequestRecord | None, bool]:
        """Read the record (or begin from ``start``, a record this caller just wrote), apply
        ``change``, and write it if its revision is still the one read; else read it again and
        retry. Returns (the record, True) once written; (the record, False) when ``change`` returned
        False (nothing written); (None, False) with no record and ``create`` off."""
        bucket = await self.bucket()
        for attempt in range(attempts):
            if attempt == 0 and start is not None:
                record: RequestRecord | None = start
            else:
                record = await self.get(request_id)
            if record is None:
                if not create:
                    return None, False
                record = RequestRecord(request_id=request_id)
            if change(record) is False:
                return record, False
            complete_report(record)
            record.updated_at = utcnow()
            try:
                if record.revision:
                    record.revision = await bucket.update(request_id, record.stored_json(), last=record.revision)
                else:
                    record.revision = await bucket.create(request_id, record.stored_json())
            except KeyWrongLastSequenceError:
                # Another aggregator wrote it first: read and apply again, after a little jitter so
                # that several aggregators do not keep colliding.
                await asyncio.sleep(random.uniform(0, 0.02 * min(attempt, 5)))
                continue
            except nats.js.errors.BadRequestError as exc:
                if "wrong last sequence" in str(exc).lower():
                    continue
                raise
            return record, True
        raise Contention(f"could not update the record of {request_id}: {attempts} concurrent updates won")

    async def get_view(self, request_id: str) -> Any:
        """The status bucket's entry of ``request_id`` (None: none)."""
        status = await self.bus.kv(self.bus.subjects.kv_status)
        try:
            return await status.get(request_id)
        except KeyNotFoundError:
            return None

    async def put_view(self, record: RequestRecord, attempts: int = 20) -> None:
        """Write ``record``'s public view unless the status bucket holds one of a later record
        revision already (the newest must stay): read, then compare-and-set."""
        status = await self.bus.kv(self.bus.subjects.kv_status)
        view = record.public_view_json()
        for _ in range(attempts):
            entry = await self.get_view(record.request_id)
            try:
                if entry is None or not entry.value:
                    await status.create(record.request_id, view)
                elif _view_revision(entry.value) >= record.revision:
                    return  # a view as new or newer is there
                else:
                    await status.update(record.request_id, view, last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another aggregator wrote a view meanwhile (or ``entry`` was stale): look again
        raise Contention(f"could not write the public view of {record.request_id}: {attempts} concurrent writes won")


def _view_revision(value: bytes) -> int:
    """The record revision a stored public view shows (0: a view from before views said)."""
    try:
        return RequestStatusView.model_validate_json(value).revision
    except ValueError:
        return 0
