"""Which records of the requests bucket are open, for the sweeper (docs/design.md, §9).

A record is open until its verdict and report are published and marked so
(``verdict_published`` and ``report_published``). The sweeper needs only the open ones (stuck
requests, verdicts not yet published, a hidden test split still awaited), and a bucket keeps
finished records for ``record_max_age_s`` (30 days): reading every record on every sweep grew with
the bucket (bench/sweep_cost.py). :class:`OpenRecords` follows the bucket's writes instead: the
first :meth:`~OpenRecords.refresh` reads every key's latest record once, each later one only the
records written since its last look.
"""

from __future__ import annotations

import json

import nats.errors
from nats.js import JetStreamContext

from shared.kv_scan import BucketWatch


def is_open(value: bytes | None) -> bool:
    """Whether a stored record still owes its verdict or report (an unreadable one: yes, so that
    the sweeper reads it and says what is wrong)."""
    if not value:
        return False
    try:
        stored = json.loads(value)
    except ValueError:
        return True
    return not (isinstance(stored, dict) and stored.get("verdict_published") and stored.get("report_published"))


class OpenRecords:
    """The keys of the requests bucket whose latest record is open."""

    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self._js = js
        self._bucket = bucket
        self._open: set[str] = set()
        #: The first revision not read yet.
        self._next = 1
        #: Entries read by the last refresh (bench and tests look at it).
        self.last_read = 0

    async def refresh(self, timeout_s: float = 10.0) -> list[str]:
        """The open keys now, in no particular order."""
        read = 0
        try:
            async with BucketWatch(self._js, self._bucket, since=self._next) as watch:
                while (change := await watch.next(timeout_s)) is not None:
                    read += 1
                    self._next = max(self._next, change.revision + 1)
                    if change.removed or not is_open(change.value):
                        self._open.discard(change.key)
                    else:
                        self._open.add(change.key)
        except nats.errors.TimeoutError:
            pass  # the rest comes with the next refresh (from the revision reached)
        self.last_read = read
        return list(self._open)

    def forget(self, key: str) -> None:
        """``key`` was read and is done (or gone): until it is written open again."""
        self._open.discard(key)
