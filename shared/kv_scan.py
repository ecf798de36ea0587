"""Reading a whole KV bucket: its keys, and its snapshot followed by each change.

Why not nats-py's ``KeyValue.keys()`` and ``watchall()``: they decide that the snapshot is empty
from the consumer's ``num_pending`` (a server count) and the messages the client has *read*
(a client count). When the server has delivered the last message but the client has not read it
yet, both are 0: ``keys()`` raises ``NoKeysError`` on a bucket that has keys, and a watch says
"snapshot complete" before the snapshot came. It happened in CI (the dashboard's key listing of
a seeded bucket). Here both counts come from the server (``num_pending`` and the consumer's
``delivered`` sequence, read under one lock), and the end of a non-empty snapshot is the message
that says nothing is pending after it.

The subscription is the one nats-py's watch makes (an ordered push consumer, last value per key),
so the NATS permissions it needs are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"  # nats-server 2.11+: expiry markers a server writes itself
_MARKER_OPERATIONS = {"MaxAge": "PURGE", "Purge": "PURGE", "Remove": "DEL"}


@dataclass(frozen=True)
class KeyChange:
    key: str
    value: bytes | None  # None with meta_only
    operation: str | None  # None for a value; "DEL" or "PURGE" for a removal
    revision: int
    #: The headers the entry was written with (meta_only delivers them too).
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def removed(self) -> bool:
        return self.operation is not None


class BucketWatch:
    """``async with BucketWatch(js, bucket) as watch``: ``await watch.next(timeout_s)`` returns each
    key's latest change, then ``None`` once when the snapshot is complete, then every later change.
    Raises ``nats.errors.TimeoutError`` when nothing came for ``timeout_s``.

    ``since``: only the keys written at or after this revision (the bucket's stream sequence);
    a bucket that keeps one revision per key holds nothing older of them, so that is each such
    key's latest change, and the snapshot is what was written since."""

    def __init__(self, js: JetStreamContext, bucket: str, *, meta_only: bool = False, since: int | None = None,
                 keys: str = ">") -> None:
        self.js = js
        self.bucket = bucket
        self.prefix = f"$KV.{bucket}."
        self.keys = keys  # a subject filter on the keys: ">" every key, "*" the keys of one token
        self.meta_only = meta_only
        self.since = since
        self._sub: JetStreamContext.PushSubscription | None = None
        self._snapshot_done = False
        self._marker_due = False

    async def __aenter__(self) -> BucketWatch:
        since = self.since is not None and self.since > 1
        self._sub = await self.js.subscribe(
            self.prefix + self.keys,
            stream=f"KV_{self.bucket}",
            config=api.ConsumerConfig(opt_start_seq=self.since) if since else None,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if since else api.DeliverPolicy.LAST_PER_SUBJECT,
            headers_only=self.meta_only,
            # The server drops the consumer this long after our interest ends (an unsubscribe leaves it
            # behind): short, or every sweep and listing would leave one for nats-py's five minutes.
            inactive_threshold=10.0,
        )
        try:
            info = await self._sub.consumer_info()
        except BaseException:
            await self._close()
            raise
        delivered = info.delivered.consumer_seq if info.delivered else 0
        # Nothing pending and nothing ever delivered, by the server's own count: an empty bucket.
        self._marker_due = (info.num_pending or 0) == 0 and (delivered or 0) == 0
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass  # a closed connection has dropped it already; the server expires the consumer

    async def next(self, timeout_s: float) -> KeyChange | None:
        if self._marker_due and not self._snapshot_done:
            self._marker_due, self._snapshot_done = False, True
            return None
        assert self._sub is not None, "use BucketWatch in `async with`"
        msg = await self._sub.next_msg(timeout=timeout_s)
        change = self._change(msg)
        if not self._snapshot_done and msg.metadata.num_pending == 0:
            self._marker_due = True  # this was the snapshot's last message: the marker comes next
        return change

    def _change(self, msg: Msg) -> KeyChange:
        headers = msg.headers or {}
        operation = headers.get(KV_OPERATION)
        if operation is None and MARKER_REASON in headers:
            operation = _MARKER_OPERATIONS.get(headers[MARKER_REASON], "PURGE")
        return KeyChange(
            key=msg.subject[len(self.prefix):],
            value=None if self.meta_only else msg.data,
            operation=operation,
            revision=msg.metadata.sequence.stream,
            headers=headers,
        )


async def latest(js: JetStreamContext, bucket: str, *, meta_only: bool = False,
                 timeout_s: float = 10.0, keys: str = ">") -> list[KeyChange]:
    """Every key of ``bucket`` that holds a value now, with its latest value (only its headers with
    ``meta_only``), in stream order, read in one pass (no request per key); ``[]`` for an empty
    bucket. ``timeout_s`` bounds each wait for the server's next message."""
    changes: list[KeyChange] = []
    async with BucketWatch(js, bucket, meta_only=meta_only, keys=keys) as watch:
        while (change := await watch.next(timeout_s)) is not None:
            if not change.removed:
                changes.append(change)
    return changes


async def list_keys(js: JetStreamContext, bucket: str, timeout_s: float = 10.0) -> list[str]:
    """Every key of ``bucket`` that holds a value now (removed keys left out), in stream order;
    ``[]`` for an empty bucket. ``timeout_s`` bounds each wait for the server's next message."""
    return [change.key for change in await latest(js, bucket, meta_only=True, timeout_s=timeout_s)]
