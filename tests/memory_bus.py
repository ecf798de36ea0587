"""An in-memory bus for unit tests, in the spirit of FastStream's TestNatsBroker.

:class:`MemoryBus` offers what ``shared.runtime.StageWorker`` uses of ``shared.bus.Bus``, so that a
stage worker's lifecycle runs in a unit test, in milliseconds, without a nats-server. It models:

- the streams of ``Bus.ensure_topology`` and their subjects (wildcards ``*``, ``>``); a JetStream
  publish that no stream holds raises NoStreamResponseError; de-duplication by ``Nats-Msg-Id``;
  one message per subject on the verdict and report streams;
- core NATS: every publish reaches the core subscribers of its subject, each subscription's
  callbacks in order (:meth:`MemoryBus.flush` waits for them); a core publish on a stream's
  subject is stored too;
- durable pull consumers (deliver all, filters, explicit ack, nak with delay, term, in_progress,
  redelivery after ack_wait, max_deliver and its MAX_DELIVERIES advisory);
- key-value buckets with per-bucket revisions, also written by a JetStream publish on
  ``$KV.<bucket>.<key>`` (compare-and-set on Nats-Expected-Last-Subject-Sequence, headers kept).

It does not model clustering, persistence, retention limits (max_age, the de-duplication window:
ids are remembered for the bus's life), permissions, queue groups, flow control, reconnects or
object stores (artifacts are FilesystemArtifacts under ``settings.artifact_dir``): those stay in
tests/integration, with a real nats-server.

For tests: :meth:`MemoryBus.messages` (stored), :meth:`MemoryBus.heard` (published, core too),
:meth:`MemoryBus.tracking` (a message's deliveries and acks), :meth:`MemoryBus.wait_for`,
:meth:`MemoryBus.lose_acks` (a worker dying before its ack), :meth:`MemoryBus.expire` (its ack wait
running out now), :func:`memory_settings`, :func:`running`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import nats.errors
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError
from nats.js.api import PubAck
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NoStreamResponseError
from pydantic import BaseModel

from shared import codec
from shared import consumer as consumer_loop
from shared.events import Stage
from shared.fs_artifacts import FilesystemArtifacts
from shared.logs import get_logger
from shared.settings import Settings
from shared.subjects import Subjects
from shared.tasks import cancel_until_done

log = get_logger("tests.memory_bus")

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
KV_OPERATION = "KV-Operation"
#: A hang guard, not a limit legitimate work must finish within: what a test waits for on this bus
#: comes true in milliseconds, and a loaded machine may take seconds.
HANG_GUARD_S = 60.0


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(wanted) == len(tokens)


def memory_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings for a worker on the memory bus: quick redeliveries and retries, local runs, files as artifacts."""
    values: dict[str, Any] = {
        "home": tmp_path / "home", "artifact_store": "filesystem", "artifact_dir": tmp_path / "artifacts",
        "sandbox": "local", "judge_model": None, "ack_wait_s": 2.0, "heartbeat_s": 0.5, "max_deliver": 3,
        "retry_backoff_s": [0.01], "log_format": "console", "log_level": "WARNING",
        # Lanes list their consumers (shared/lanes.py), which this bus does not keep: the fair-share
        # order is tested on a real server (tests/integration/test_fair_share.py).
        "fair_share": False,
    }
    return Settings(**{**values, **overrides})


def _refuse(code: int, err_code: int, description: str) -> NoReturn:
    """Raise the error nats-py raises for this answer of the server (its class follows the code)."""
    APIError.from_error({"code": code, "err_code": err_code, "description": description})
    raise AssertionError("unreachable: from_error raises")


def _headers(headers: dict[Any, Any] | None) -> dict[str, str]:
    # nats-py's api.Header members are Enums, which do not hash as their string value.
    return {str(getattr(k, "value", k)): str(v) for k, v in (headers or {}).items()}


# ---------------------------------------------------------------------------- streams


@dataclass
class StoredMsg:
    """A message as a stream holds it."""

    stream: str
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    timestamp: datetime

    def event(self, expected: Any = None) -> Any:
        return codec.decode(self.data, expected)


class MemoryStream:
    def __init__(self, name: str, subjects: Sequence[str], *, max_msgs_per_subject: int = 0) -> None:
        self.name, self.subjects, self.max_msgs_per_subject = name, list(subjects), max_msgs_per_subject
        self.stored: list[StoredMsg] = []
        self._ids: dict[str, int] = {}

    def holds(self, subject: str) -> bool:
        return any(subject_matches(pattern, subject) for pattern in self.subjects)

    def store(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        msg_id = headers.get(MSG_ID)
        if msg_id is not None and msg_id in self._ids:
            return PubAck(stream=self.name, seq=self._ids[msg_id], duplicate=True)
        if self.max_msgs_per_subject and sum(m.subject == subject for m in self.stored) >= self.max_msgs_per_subject:
            # As the server answers on a stream with discard_new_per_subject.
            _refuse(503, 10077, "maximum messages per subject exceeded")
        seq = len(self.stored) + 1
        self.stored.append(StoredMsg(self.name, seq, subject, bytes(data), headers, datetime.now(UTC)))
        if msg_id is not None:
            self._ids[msg_id] = seq
        return PubAck(stream=self.name, seq=seq, duplicate=False)


# ---------------------------------------------------------------------------- key-value


@dataclass
class KVEntry:
    """nats-py's ``KeyValue.Entry``, with the headers the entry was written with."""

    bucket: str
    key: str
    value: bytes
    revision: int
    headers: dict[str, str] = field(default_factory=dict)
    operation: str | None = None  # "DEL" or "PURGE" for a delete marker


class MemoryKV:
    """A bucket as nats-py's ``KeyValue`` reads and writes it; revisions are the bucket's sequence."""

    def __init__(self, bus: MemoryBus, bucket: str) -> None:
        self._bus, self.bucket = bus, bucket
        self.entries: dict[str, KVEntry] = {}  # the latest entry of each key, delete markers included
        self.revision = 0

    def write(self, key: str, value: bytes, headers: dict[str, str]) -> int:
        """A write as the bucket's stream takes it (``$KV.<bucket>.<key>``), compare-and-set included."""
        expected = headers.get(EXPECTED_LAST_SUBJECT_SEQUENCE)
        current = self.entries.get(key)
        last = current.revision if current is not None else 0
        if expected is not None and int(expected) != last:
            _refuse(400, 10071, f"wrong last sequence: {last}")
        self.revision += 1
        self.entries[key] = KVEntry(self.bucket, key, bytes(value), self.revision, headers, headers.get(KV_OPERATION))
        return self.revision

    async def _write(self, key: str, value: bytes, headers: dict[str, str]) -> int:
        ack = await self._bus.js.publish(f"$KV.{self.bucket}.{key}", value, headers=headers)
        return ack.seq

    async def get(self, key: str) -> KVEntry:
        entry = self.entries.get(key)
        if entry is None or entry.operation is not None:
            raise KeyNotFoundError
        return entry

    async def put(self, key: str, value: bytes) -> int:
        return await self._write(key, value, {})

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        try:
            return await self._write(key, value, {EXPECTED_LAST_SUBJECT_SEQUENCE: str(last or 0)})
        except APIError as exc:
            if exc.err_code == 10071:
                raise KeyWrongLastSequenceError(description=exc.description) from exc
            raise

    async def create(self, key: str, value: bytes) -> int:
        current = self.entries.get(key)
        deleted = current is not None and current.operation is not None
        return await self.update(key, value, current.revision if deleted and current else 0)

    async def delete(self, key: str, last: int | None = None) -> bool:
        headers = {KV_OPERATION: "DEL"}
        if last:
            headers[EXPECTED_LAST_SUBJECT_SEQUENCE] = str(last)
        await self._write(key, b"", headers)
        return True

    async def keys(self) -> list[str]:
        keys = [key for key, entry in self.entries.items() if entry.operation is None]
        if not keys:
            raise NoKeysError
        return keys


# ---------------------------------------------------------------------------- consumers


@dataclass
class Tracking:
    """What one durable consumer did with one stored message: the server's delivery state."""

    seq: int
    delivered: int = 0
    acked: bool = False
    termed: bool = False
    naks: int = 0
    in_progress: int = 0
    #: Delivered ``max_deliver`` times without an ack: never again, and the advisory was sent.
    given_up: bool = False
    #: Loop time from which it is delivered again unless settled (ack wait, or a nak's delay).
    due: float = 0.0

    @property
    def settled(self) -> bool:
        return self.acked or self.termed or self.given_up


class MemoryMsg:
    """One delivery of a stored message, with nats-py's ``Msg`` interface (metadata, acks)."""

    def __init__(self, consumer: MemoryConsumer, stored: StoredMsg, track: Tracking, num_pending: int) -> None:
        self._consumer, self._track, self._done = consumer, track, False
        self.subject, self.data, self.reply = stored.subject, stored.data, ""
        self.headers: dict[str, str] | None = dict(stored.headers) or None
        consumer.delivered += 1
        self.metadata = Msg.Metadata(
            sequence=Msg.Metadata.SequencePair(consumer=consumer.delivered, stream=stored.seq),
            num_pending=num_pending, num_delivered=track.delivered, timestamp=stored.timestamp,
            stream=stored.stream, consumer=consumer.durable,
        )

    def _settle(self) -> None:
        if self._done:
            raise MsgAlreadyAckdError(self)
        self._done = True

    async def ack(self) -> None:
        self._settle()
        if self._consumer.bus.acks_to_lose > 0:  # lost on the way: the server never hears it
            self._consumer.bus.acks_to_lose -= 1
            return
        self._consumer.settle(self._track, acked=True)

    async def nak(self, delay: float | None = None) -> None:
        self._settle()
        bus = self._consumer.bus
        if delay == consumer_loop.ERROR_NAK_S:
            # The consumer loop's answer to an error around a handler (the memory settings' retry
            # backoff is far shorter): the test's bus says so, and it comes back sooner than 2 s.
            bus.errors.append(RuntimeError(f"the handling of {self.subject} (seq {self.metadata.sequence.stream}) "
                                           "failed: see the log"))
            delay = bus.ERROR_NAK_S
        self._consumer.settle(self._track, nak_delay=delay or 0.0)

    async def term(self) -> None:
        self._settle()
        self._consumer.settle(self._track, termed=True)

    async def in_progress(self) -> None:
        self._consumer.settle(self._track, in_progress=True)


class MemoryConsumer:
    """A durable pull consumer: deliver all, explicit acks, ack wait, max deliver."""

    def __init__(self, bus: MemoryBus, stream: MemoryStream, durable: str, filters: Sequence[str],
                 ack_wait: float) -> None:
        self.bus, self.stream, self.durable = bus, stream, durable
        self.filters, self.ack_wait = list(filters), ack_wait
        self.tracks: dict[int, Tracking] = {}
        self.delivered = 0
        self.max_deliver = bus.settings.max_deliver  # -1: unlimited
        self.wake = asyncio.Event()

    def wants(self, subject: str) -> bool:
        return any(subject_matches(f, subject) for f in self.filters)

    @property
    def caught_up(self) -> bool:
        """Nothing left to deliver and nothing unacknowledged."""
        return all(m.seq in self.tracks and self.tracks[m.seq].settled
                   for m in self.stream.stored if self.wants(m.subject))

    def settle(self, track: Tracking, *, acked: bool = False, termed: bool = False,
               nak_delay: float | None = None, in_progress: bool = False) -> None:
        if track.settled:
            return
        now = asyncio.get_running_loop().time()
        track.acked, track.termed = track.acked or acked, track.termed or termed
        if nak_delay is not None:
            track.naks += 1
            track.due = now + nak_delay
        if in_progress:
            track.in_progress += 1
            track.due = now + self.ack_wait
        self.wake.set()

    async def next(self) -> MemoryMsg:
        """The next delivery, once there is one."""
        while True:
            self.wake.clear()
            msg, next_due = self._take()
            if msg is not None:
                return msg
            timeout = None if next_due is None else max(0.0, next_due - asyncio.get_running_loop().time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)

    def ready(self) -> MemoryMsg | None:
        """The next delivery if one is due now."""
        return self._take()[0]

    def _take(self) -> tuple[MemoryMsg | None, float | None]:
        """A redelivery that is due, else the first message never delivered; else None and when the
        next redelivery is due."""
        now = asyncio.get_running_loop().time()
        fresh: list[StoredMsg] = []
        next_due: float | None = None
        for stored in self.stream.stored:
            if not self.wants(stored.subject):
                continue
            track = self.tracks.get(stored.seq)
            if track is None:
                fresh.append(stored)
            elif track.settled:
                continue
            elif track.due > now:
                next_due = track.due if next_due is None else min(next_due, track.due)
            elif 0 < self.max_deliver <= track.delivered:
                self._give_up(track)
            else:
                return self._deliver(stored, track, len(fresh)), None
        if fresh:
            track = self.tracks[fresh[0].seq] = Tracking(fresh[0].seq)
            return self._deliver(fresh[0], track, len(fresh) - 1), None
        return None, next_due

    def _deliver(self, stored: StoredMsg, track: Tracking, num_pending: int) -> MemoryMsg:
        track.delivered += 1
        track.due = asyncio.get_running_loop().time() + self.ack_wait
        return MemoryMsg(self, stored, track, num_pending)

    def _give_up(self, track: Tracking) -> None:
        track.given_up = True
        advisory = {"type": "io.nats.jetstream.advisory.v1.max_deliver", "stream": self.stream.name,
                    "consumer": self.durable, "stream_seq": track.seq, "deliveries": track.delivered}
        subject = self.bus.subjects.max_deliveries_advisory(self.stream.name, self.durable)
        self.bus.route(subject, json.dumps(advisory).encode(), {}, jetstream=False)


# ---------------------------------------------------------------------------- core NATS


@dataclass
class CoreMsg:
    subject: str
    data: bytes
    headers: dict[str, str] | None = None
    reply: str = ""


class MemorySubscription:
    """A core subscription; its callbacks run one after the other, in order, as nats-py runs them.
    Without a callback, ``messages`` iterates over them as nats-py's does."""

    def __init__(self, bus: MemoryBus, subject: str, cb: Callable[[CoreMsg], Awaitable[None]] | None) -> None:
        self._bus, self.subject, self._cb = bus, subject, cb
        self.queue: asyncio.Queue[CoreMsg] = asyncio.Queue()
        #: Messages queued for the callback or in it.
        self.pending = 0
        self._task = asyncio.create_task(self._run()) if cb is not None else None
        self._iterated = False

    def put(self, msg: CoreMsg) -> None:
        self.pending += self._task is not None or self._iterated
        self.queue.put_nowait(msg)

    @property
    def messages(self) -> AsyncIterator[CoreMsg]:
        """The messages in order; one is in the reader's hands until it asks for the next."""
        if not self._iterated:
            self._iterated = True
            self.pending += self.queue.qsize()  # those that came before the reader
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[CoreMsg]:
        while True:
            msg = await self.queue.get()
            try:
                yield msg
            finally:
                self.pending -= 1
                self.queue.task_done()

    async def _run(self) -> None:
        assert self._cb is not None
        while True:
            msg = await self.queue.get()
            try:
                await self._cb(msg)
            except Exception as exc:  # nats-py hands it to the error callback; the test sees it
                log.exception("a core subscriber's callback failed", subject=msg.subject)
                self._bus.errors.append(exc)
            finally:
                self.pending -= 1
                self.queue.task_done()

    async def unsubscribe(self) -> None:
        with contextlib.suppress(ValueError):
            self._bus.subscriptions.remove(self)
        if self._task is not None:
            await cancel_until_done([self._task])


class MemoryConnection:
    """``bus.nc``: core publish and subscribe."""

    is_connected, is_closed = True, False

    def __init__(self, bus: MemoryBus) -> None:
        self._bus = bus

    async def subscribe(self, subject: str, queue: str = "", cb: Any = None, **_: Any) -> MemorySubscription:
        sub = MemorySubscription(self._bus, subject, cb)
        self._bus.subscriptions.append(sub)
        return sub

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None:
        self._bus.route(subject, payload, _headers(headers), jetstream=False)


class MemoryJetStream:
    """``bus.js``: JetStream publishes (what :meth:`MemoryBus.publish` does), with a KV subject's
    compare-and-set header honoured as the server does."""

    def __init__(self, bus: MemoryBus) -> None:
        self._bus = bus

    async def publish(self, subject: str, payload: bytes = b"", timeout: float | None = None,  # noqa: ASYNC109
                      stream: str | None = None, headers: dict[Any, Any] | None = None) -> PubAck:
        ack = self._bus.route(subject, payload, _headers(headers), jetstream=True)
        assert ack is not None
        return ack

    async def pull_subscribe_bind(self, durable: str, stream: str, **_: Any) -> MemoryPullSubscription:
        return MemoryPullSubscription(self._bus.consumers[(stream, durable)])


class MemoryPullSubscription:
    """``bus.js.pull_subscribe_bind(durable, stream)``: fetch as nats-py's does (what is there as soon
    as one message has come, at most ``batch``; nats.errors.TimeoutError when none came in time)."""

    def __init__(self, consumer: MemoryConsumer) -> None:
        self._consumer = consumer

    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[MemoryMsg]:  # noqa: ASYNC109
        try:
            first = await asyncio.wait_for(self._consumer.next(), timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None
        msgs = [first]
        while len(msgs) < batch and (more := self._consumer.ready()) is not None:
            msgs.append(more)
        return msgs

    async def unsubscribe(self) -> None:
        return None


# ---------------------------------------------------------------------------- the bus


class MemoryBus:
    """What ``shared.bus.Bus`` offers a worker, in memory (see the module's docstring)."""

    #: After an error around a handler (the consumer loop's nak), the message comes back after this.
    ERROR_NAK_S = 0.1

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.subjects = s = Subjects(settings.subject_prefix)
        self.nc = MemoryConnection(self)
        self.js = MemoryJetStream(self)
        self.streams: dict[str, MemoryStream] = {}
        self.buckets: dict[str, MemoryKV] = {}
        self.consumers: dict[tuple[str, str], MemoryConsumer] = {}
        self.subscriptions: list[MemorySubscription] = []
        #: Every message published, core or JetStream, refused or not, in order.
        self.wire: list[CoreMsg] = []
        #: Msg ids whose publish a stream discarded as a duplicate, in order.
        self.duplicates: list[str] = []
        #: Exceptions the bus caught around handlers and callbacks (none in a healthy test).
        self.errors: list[BaseException] = []
        #: Workers started by :func:`running`: :meth:`wait_for` fails at once when one has failed.
        self.tasks: list[asyncio.Task[Any]] = []
        self.acks_to_lose = 0
        for name, subjects, per_subject in (
            (s.stream_events, s.event_stream_subjects(), 0), (s.stream_test, [s.bench_test], 0),
            (s.stream_verdicts, [s.verdict()], 1), (s.stream_reports, [s.report()], 1),
            (s.stream_dlq, [s.dlq], 0),
            (s.stream_advisories, [s.max_deliveries_advisory(s.stream_events),
                                   s.max_deliveries_advisory(s.stream_test)], 0),
        ):
            self.streams[name] = MemoryStream(name, subjects, max_msgs_per_subject=per_subject)

    # ------------------------------------------------------------------ what Bus offers

    async def ensure_topology(self) -> None:
        for bucket in (self.subjects.kv_requests, self.subjects.kv_status, self.subjects.kv_campaigns,
                       *(self.subjects.kv_stage_results(stage) for stage in Stage)):
            await self.kv(bucket)

    async def close(self) -> None:
        for sub in list(self.subscriptions):
            await sub.unsubscribe()

    async def kv(self, bucket: str) -> MemoryKV:
        return self.buckets.setdefault(bucket, MemoryKV(self, bucket))

    def _store(self, bucket: str) -> FilesystemArtifacts:
        if self.settings.artifact_dir is None:
            raise ValueError("the memory bus keeps artifacts in settings.artifact_dir: set it (memory_settings)")
        return FilesystemArtifacts(self.settings.artifact_dir / bucket)

    async def artifacts(self) -> FilesystemArtifacts:
        return self._store(self.subjects.object_store)

    async def cache_artifacts(self) -> FilesystemArtifacts:
        return self._store(self.subjects.object_store_cache)

    async def private_artifacts(self) -> FilesystemArtifacts:
        return self._store(self.subjects.object_store_private)

    async def models_artifacts(self) -> FilesystemArtifacts:
        return self._store(self.subjects.object_store_models)

    async def ensure_consumer(self, stream: str, durable: str, filters: list[str], *,
                              ack_wait: float | None = None, max_deliver: int | None = None) -> None:
        consumer = self.consumers.get((stream, durable))
        if consumer is None:
            consumer = MemoryConsumer(self, self.streams[stream], durable, filters, 0.0)
            self.consumers[(stream, durable)] = consumer
        consumer.filters, consumer.ack_wait = list(filters), ack_wait or self.settings.ack_wait_s
        consumer.max_deliver = self.settings.max_deliver if max_deliver is None else max_deliver

    async def publish(self, subject: str, event: BaseModel, msg_id: str | None = None, *, retries: int = 5) -> PubAck:
        return await self.publish_payload(subject, codec.encode(event), msg_id)

    async def publish_payload(self, subject: str, payload: bytes, msg_id: str | None = None, *,
                              retries: int = 5) -> PubAck:
        return await self.js.publish(subject, payload, headers={MSG_ID: msg_id} if msg_id else None)

    async def publish_core(self, subject: str, event: BaseModel) -> None:
        await self.nc.publish(subject, codec.encode(event))

    # ------------------------------------------------------------------ the wire

    def route(self, subject: str, payload: bytes, headers: dict[str, str], *, jetstream: bool) -> PubAck | None:
        """One message on the wire: the core subscribers of its subject hear it, then the stream (or
        bucket) that holds its subject stores it. ``jetstream``: a JetStream publish, which gets an
        ack, or NoStreamResponseError when no stream holds the subject, or the stream's refusal."""
        self.wire.append(CoreMsg(subject, bytes(payload), headers or None))
        for sub in self.subscriptions:
            if subject_matches(sub.subject, subject):
                sub.put(CoreMsg(subject, bytes(payload), headers or None))
        bucket, _, key = subject.removeprefix("$KV.").partition(".")
        kv = self.buckets.get(bucket) if subject.startswith("$KV.") else None
        stream = next((s for s in self.streams.values() if s.holds(subject)), None)
        if kv is None and stream is None:
            if jetstream:
                raise NoStreamResponseError
            return None
        if kv is not None:
            return PubAck(stream=f"KV_{bucket}", seq=kv.write(key, payload, headers))
        assert stream is not None
        ack = stream.store(subject, payload, headers)
        if ack.duplicate:
            self.duplicates.append(headers[MSG_ID])
        for consumer in self.consumers.values():
            if consumer.stream is stream:
                consumer.wake.set()
        return ack

    # ------------------------------------------------------------------ test helpers

    def messages(self, pattern: str = ">") -> list[StoredMsg]:
        """The messages the streams hold on subjects matching ``pattern``, in each stream's order."""
        return [m for stream in self.streams.values() for m in stream.stored if subject_matches(pattern, m.subject)]

    def events(self, pattern: str = ">", expected: Any = None) -> list[Any]:
        """:meth:`messages`, decoded."""
        return [m.event(expected) for m in self.messages(pattern)]

    def heard(self, pattern: str, expected: Any = None) -> list[Any]:
        """Every event published on subjects matching ``pattern`` (core or JetStream), decoded, in order."""
        return [codec.decode(m.data, expected) for m in self.wire if subject_matches(pattern, m.subject)]

    def consumer(self, durable: str, stream: str | None = None) -> MemoryConsumer:
        return self.consumers[(stream or self.subjects.stream_events, durable)]

    def tracking(self, ack: PubAck, durable: str) -> Tracking:
        """What ``durable`` did with the message ``ack`` acknowledged (nothing yet: all zero)."""
        consumer = self.consumers.get((ack.stream, durable))
        track = consumer.tracks.get(ack.seq) if consumer is not None else None
        return track if track is not None else Tracking(ack.seq)

    def expire(self, ack: PubAck, durable: str) -> None:
        """The ack wait of ``durable``'s delivery of the message ``ack`` acknowledged runs out now:
        unless settled, the message is delivered again at once. A test of a redelivery (after
        :meth:`lose_acks`) calls it once the delivery is over, instead of waiting out ``ack_wait_s``,
        so that the settings' ack wait can be long enough for no load to cause a redelivery."""
        consumer = self.consumers[(ack.stream, durable)]
        consumer.tracks[ack.seq].due = asyncio.get_running_loop().time()
        consumer.wake.set()

    def lose_acks(self, count: int = 1) -> None:
        """The next ``count`` acks never reach the server (a worker dying between its publish and its ack)."""
        self.acks_to_lose += count

    async def flush(self) -> None:
        """Wait until every core message published so far (and by the callbacks meanwhile) has been
        through its callbacks."""
        while busy := [sub for sub in self.subscriptions if sub.pending]:
            await asyncio.gather(*(sub.queue.join() for sub in busy))

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = HANG_GUARD_S,  # noqa: ASYNC109
                       what: str = "") -> None:
        """Poll ``predicate`` (sync or async) every 10 ms until it is true; fail after ``timeout``
        seconds, or at once when a worker started by :func:`running` has failed. The timeout is a
        hang guard, never the evidence: a condition that should come true is waited for, however
        slow a loaded machine is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            for task in self.tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise AssertionError(f"a worker failed while waiting for {what or 'a condition'}") \
                        from task.exception()
            if loop.time() >= deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what or 'a condition'}")
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(bus: MemoryBus, worker: Any,
                  timeout: float = HANG_GUARD_S) -> AsyncIterator[Any]:  # noqa: ASYNC109
    """Run ``worker`` (a StageWorker) until the block ends; it is consuming when the block starts.
    On exit the worker is stopped and awaited: an error it raised is raised here. ``timeout``: a
    hang guard on its start and on its stop."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    bus.tasks.append(task)
    try:
        await bus.wait_for(lambda: (worker.stream, worker.durable) in bus.consumers, timeout, "the worker to start")
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout)
