"""The aggregator: the only stateful service.

It keeps one record per request in the requests KV bucket, updated from every stage event
(status, stage, timings, progress), publishes the verdict (no test results) when the judge is
done, and the report (with them) when the hidden test split is in as well. Dead letters, the
server's MAX_DELIVERIES advisories, cancellations and stuck requests become error or cancelled
verdicts naming the stage. Every record update is a compare-and-set on the KV revision, and the
verdict is claimed in the record before it is published: so any number of aggregator workers,
crashing at any point, publish exactly one verdict per request (the verdict stream's
one-message-per-subject rule enforces it a second time).

One aggregator handles many events at once (its stage's concurrency), but never two of the same
request: their updates queue on a lock of that request, so they do not race each other's
compare-and-set. It remembers the records it wrote last (with their revisions), so that an update
is one compare-and-set, not a read and a write; a record another aggregator changed meanwhile
fails that compare-and-set and is read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import nats
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from services.aggregator.records_bucket import OpenRecords, RecordBucket
from services.aggregator.verdicts import (
    build_report,
    cancelled_verdict,
    error_verdict,
    report_ready,
    verdict_from_judge,
)
from shared import codec
from shared.bus import Bus
from shared.consumer import Slot, consume
from shared.events import (
    BenchResult,
    CancelRequested,
    DataResult,
    DeadLetter,
    EvalRequested,
    JudgeResult,
    Progress,
    Stage,
    StageRun,
    TrainResult,
    utcnow,
)
from shared.logs import bound, get_logger
from shared.records import RequestRecord, RequestStatusView, StageTiming
from shared.runtime import Outgoing, StageContext, StageWorker, always_dead_letter, never_dead_letter
from shared.tasks import cancel_until_done, together

log = get_logger("ftbus.aggregator")

# Requests whose last progress write the aggregator remembers before it forgets the idle ones.
PROGRESS_MEMORY = 256
# Records (with their KV revision) the aggregator remembers from its own last writes.
RECORD_MEMORY = 512
# How long a request's public view may lag its record while the request is under way: its updates
# meanwhile are written once. A request that is over, or asked to cancel, is written at once.
STATUS_LINGER_S = 0.25
# How long an update that ends nothing waits for its request's next event, to be written with it,
# before it is written alone: a stage's progress (a stage that ends quickly: one write for its start
# and its result), a request's arrival and a stage's result (a pre-check failure: one write for
# the request, the data stage's refusal and the judge's verdict). An event's message is acked once
# its update is written (StageContext.ack_after). A second, not less: in a burst the aggregator
# is the last in line, and the next event of a request it met early can wait in its own backlog
# for longer than a quarter of a second; at 0.25 s, up to a third of a slow burst of 100 pre-check
# failures were written twice (counted on the requests bucket's sequence), and such bursts are the
# ones a write more slows down further (bench/precheck_burst.py). At 1 s: once.
LINGER_S = 1.0
# At most this many requests wait on a lingering write with messages unacked: beyond that the
# oldest is written at once. Each holds up to three of the consumer's unacked messages (its arrival,
# a stage's result, a redelivery), and the consumer takes no more once 1000 are (max_ack_pending,
# shared/bus.py): the events that would end the waits would never come, and only the timers would
# move the burst on.
OWED_REQUESTS_MAX = 256

RESULT_STAGE: dict[type, Stage] = {
    DataResult: Stage.data,
    TrainResult: Stage.train,
    BenchResult: Stage.bench,
    JudgeResult: Stage.judge,
}


#: What the aggregator's event consumer accepts: the request, cancels and every stage's result.
ACCEPTS = (EvalRequested, CancelRequested, DataResult, TrainResult, BenchResult, JudgeResult)


class Aggregator:
    def __init__(self, bus: Bus, *, concurrency: int = 1, stage_reads: Mapping[Stage, list[str]] | None = None) -> None:
        self.bus = bus
        self.s = bus.subjects
        self.concurrency = concurrency
        #: The subjects each stage's consumer reads (from the pipeline's specs).
        self.stage_reads = dict(stage_reads or {})
        self._kv: RecordBucket | None = None
        #: The requests the sweeper looks at: those whose record is still open.
        self._open: OpenRecords | None = None
        #: The status bucket's revision of the view this aggregator last wrote, per request under way.
        self._view_revisions: OrderedDict[str, int] = OrderedDict()
        self._last_progress_write: dict[str, float] = {}
        self._records: OrderedDict[str, tuple[RequestRecord, int]] = OrderedDict()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._queued: dict[str, list[_Queued]] = {}
        # Lingering writes that run alone at once (bounded; a request's writes keep their order on
        # its lock).
        self._owed_slots = asyncio.Semaphore(max(1, concurrency))
        # Updates waiting for their request's next write, in order (`_write_later`; tasks write
        # them: the progress subscription's callbacks run one after the other and must not wait).
        self._owed: dict[str, list[_Queued]] = {}
        self._owed_later = _Lingering(lambda: LINGER_S, self._write_owed, most=OWED_REQUESTS_MAX)
        # Public views waiting out their linger: the newest of each request, with its record revision.
        self._status_owed: dict[str, tuple[bytes, int]] = {}
        self._status_later = _Lingering(lambda: STATUS_LINGER_S, self._write_lingering_status)
        s = self.s
        #: Each event type's own subjects (a test-split BenchResult's is s.bench_test alone): `_belongs`.
        self._home_subjects: dict[type, frozenset[str]] = {
            EvalRequested: frozenset({s.eval_requested}),
            CancelRequested: frozenset({s.cancel}),
            DataResult: frozenset({s.data_completed, s.data_failed}),
            TrainResult: frozenset({s.train_completed, s.train_failed}),
            BenchResult: frozenset({s.bench_completed, s.bench_failed}),
            JudgeResult: frozenset({s.judge_completed}),
            DeadLetter: frozenset({s.dlq}),
        }

    async def kv(self) -> RecordBucket:
        if self._kv is None:
            self._kv = RecordBucket(self.bus.js, await self.bus.kv(self.s.kv_requests), self.s.kv_requests)
        return self._kv

    # ------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event) -> None:
        s = self.s
        durable = s.durable(Stage.aggregate)
        # Three consumers, one handler, no stage policies: the aggregator must see cancelled
        # requests, and it stores and announces nothing. (stream, durable, filters, accepts, rule,
        # concurrency). Each consumer's concurrency follows its stream's traffic: about five
        # events a request, one test-split result, and a dead letter now and then (an idle one
        # keeps one pull request waiting at the server, whatever its concurrency).
        consumers = [
            (s.stream_events, durable, s.event_stream_subjects(), ACCEPTS, self._dead_letters_here,
             self.concurrency),
            (s.stream_test, f"{durable}-test", [s.bench_test], (BenchResult,), always_dead_letter,
             max(1, self.concurrency // 4)),
            (s.stream_dlq, f"{durable}-dlq", [s.dlq], (DeadLetter,), never_dead_letter, min(2, self.concurrency)),
        ]
        workers = [
            StageWorker(self.bus, Stage.aggregate, self.on_event, accepts, concurrency=loops,
                        stream=stream, durable=name, filters=filters, policies=(), dead_letter=rule,
                        log_each=False)
            for stream, name, filters, accepts, rule, loops in consumers
        ]
        progress_sub = await self.bus.nc.subscribe(self.s.progress(), cb=self._on_progress)
        tasks = [
            *(asyncio.create_task(worker.run(stop)) for worker in workers),
            asyncio.create_task(self._advisories(stop)),
            asyncio.create_task(self._sweeper(stop)),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_until_done(tasks)
            with contextlib.suppress(Exception):
                await progress_sub.unsubscribe()
            await self._owed_later.flush(list(self._owed))
            await self._status_later.flush(list(self._status_owed))
            # The acks of the events just written (or naks of those that could not be).
            await asyncio.gather(*(worker.settle() for worker in workers))

    def _dead_letters_here(self, subject: str) -> str | None:
        """None when no stage worker consumes ``subject``, so that the aggregator must dead-letter it.

        An unreadable event bound for a stage is dead-lettered by that stage's workers, naming that
        stage; were the aggregator to do it too, the two letters would race to name the stage of
        the error verdict. The aggregator dead-letters only what it alone reads (judge results,
        cancels, subjects nobody consumes).
        """
        reader = next((stage for stage, subjects in self.stage_reads.items() if subject in subjects), None)
        return None if reader is None else f"the {reader.value} stage dead-letters it"

    # ------------------------------------------------------------------ events

    def _belongs(self, event: Any, subject: str) -> bool:
        """An event is only believed on its own subject: a JudgeResult published on
        data.completed is the data stage's dead letter, not a verdict."""
        if isinstance(event, BenchResult) and event.split == "test":
            return subject == self.s.bench_test
        return subject in self._home_subjects.get(type(event), ())

    async def on_event(self, event: Any, ctx: StageContext) -> list[Outgoing]:
        rid = event.request_id
        if not self._belongs(event, ctx.subject):
            log.warning("ignoring an event on a subject where it does not belong",
                        event_type=type(event).__name__, subject=ctx.subject, request_id=rid)
            return []
        # Every event here is a message: it comes back if its update, or what that publishes, fails.
        again = ctx.deliveries > 1 or isinstance(event, DeadLetter)
        if isinstance(event, EvalRequested):
            self._write_later(rid, lambda r: _on_request(r, event), ctx, new=True, again=again)
        elif isinstance(event, CancelRequested):
            await self.update(rid, lambda r: _on_cancel(r, event), retried=True, again=again)
        elif isinstance(event, BenchResult) and event.split == "test":
            await self.update(rid, lambda r: _on_test(r, event), retried=True, again=again)
        elif isinstance(event, JudgeResult):
            await self.update(rid, lambda r: _on_judge(r, event), retried=True, again=again)
        elif isinstance(event, DeadLetter):
            if rid is None:
                log.warning("dead letter without a readable request id", reason=event.reason)
                return []
            await self.update(rid, lambda r: _on_dead_letter(r, event), retried=True, again=again)
        else:  # a stage's result ends nothing: the next stage's start or the judge's verdict follows
            self._write_later(rid, lambda r: _on_stage_result(r, event), ctx, again=again)
        return []

    def _write_later(self, request_id: str, mutate: Callable[[RequestRecord], bool | None], ctx: StageContext,
                     *, new: bool = False, again: bool = False) -> None:
        """An event whose update ends nothing (no verdict, no report): written with its request's
        next write, or alone after LINGER_S, and its message acked then (a crash meanwhile
        redelivers it). The request's record and public view lag it by that much, as the view
        already does (STATUS_LINGER_S); a pre-check failure's three events become one write."""
        written: asyncio.Future[RequestRecord | None] = asyncio.get_running_loop().create_future()
        self._owed.setdefault(request_id, []).append(_Queued(mutate, True, new, written, retried=True, again=again))
        self._owed_later.owe(request_id)
        ctx.ack_after(written)

    async def _on_progress(self, msg: Any) -> None:
        """The progress subscription's callback: it waits for nothing (the write, if any, is a task
        of its own, `_update_soon`), so no task per message."""
        try:
            event = codec.decode(msg.data, Progress)
        except codec.CodecError:
            return
        # Progress can come several times a second: write the record at most once a second,
        # but always on a state change (started/finished), which status and the sweeper rely on.
        if event.state in ("finished", "failed"):
            # The stage's result event (or the cancel) follows and updates the record: writing
            # this one too would only race it.
            return
        now = asyncio.get_running_loop().time()
        key = event.request_id
        if event.state == "running" and now - self._last_progress_write.get(key, 0.0) < 1.0:
            return
        self._last_progress_write[key] = now
        self._update_soon(key, lambda r: _on_progress(r, event))
        self._prune_progress(now)

    def _update_soon(self, request_id: str, mutate: Callable[[RequestRecord], bool | None]) -> None:
        """A progress update: written with the request's next event (the stage's result, when the
        stage is quick), or alone after LINGER_S. Progress travels as core messages (at most once),
        so the update a crash loses here is one the bus may always lose: nobody waits for it."""
        settled: asyncio.Future[RequestRecord | None] = asyncio.get_running_loop().create_future()
        settled.set_result(None)
        self._owed.setdefault(request_id, []).append(_Queued(mutate, False, False, settled, retried=True))
        self._owed_later.owe(request_id)

    async def _write_owed(self, request_id: str) -> None:
        """What a request owes, written alone once it has lingered (``update`` takes it along)."""
        async with self._owed_slots:
            # Taken once a slot is free: updates owed meanwhile join this write, in order.
            if request_id not in self._owed:
                return  # written with an event meanwhile
            try:
                record = await self.update(request_id, _unchanged, create=False, retried=True)
            except Exception as exc:
                # The events' messages are naked (their futures hold the error); progress is lost.
                log.warning("lingering update failed", request_id=request_id, error=str(exc))
                record = None
        # Bounded memory: forget a request once it is over (or unknown), and whatever fell silent.
        if record is None or record.terminal:
            self._last_progress_write.pop(request_id, None)

    def _prune_progress(self, now: float, idle_s: float = 60.0) -> None:
        """Forget requests without progress for ``idle_s`` once more than PROGRESS_MEMORY are remembered."""
        if len(self._last_progress_write) > PROGRESS_MEMORY:
            for rid, at in list(self._last_progress_write.items()):
                if now - at > idle_s:
                    del self._last_progress_write[rid]

    # ------------------------------------------------------------------ record updates

    async def get(self, request_id: str) -> tuple[RequestRecord | None, int | None]:
        kv = await self.kv()
        try:
            entry = await kv.get(request_id)
        except KeyNotFoundError:
            return None, None
        if not entry.value:
            return None, None
        record = RequestRecord.model_validate_json(entry.value)
        record.revision = entry.revision
        return record, entry.revision

    @contextlib.asynccontextmanager
    async def _hold(self, request_id: str) -> AsyncIterator[None]:
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

    def _remember(self, record: RequestRecord, revision: int) -> None:
        if record.verdict_published and record.report_published:
            # Over: only a rare late event touches it again, and that one reads it. Remembering
            # finished records (tens of KB each) made the aggregator grow by 30 MB in its first
            # RECORD_MEMORY requests (bench/soak.py); now it holds only requests under way.
            self._records.pop(record.request_id, None)
            return
        self._records[record.request_id] = (record, revision)
        self._records.move_to_end(record.request_id)
        while len(self._records) > RECORD_MEMORY:
            self._records.popitem(last=False)

    async def _cas(
        self, request_id: str, mutate: Callable[[RequestRecord], bool | None], *, create: bool, attempts: int,
        new: bool = False, promised: list[str] | None = None,
    ) -> tuple[RequestRecord | None, bool]:
        """Compare-and-set loop: (the record as written, True), (the record unchanged, False) when
        ``mutate`` returns False, or (None, False) with no record and ``create`` off. Starts from the
        remembered record when there is one (no read); ``new`` (a request's first event): from no
        record (a create, no read; a create that finds one reads it and tries again); else reads it.
        ``promised`` (a write of messages' updates, `_write`): the verdict and report the write makes
        owed are marked published in it, their flags listed there for the publishing that follows."""
        kv = await self.kv()
        for attempt in range(attempts):
            remembered = self._records.pop(request_id, None)
            if remembered is not None:
                record, revision = remembered  # popped: a failed write reads it again
            elif new and create and attempt == 0:
                record, revision = None, None
            else:
                record, revision = await self.get(request_id)
            if record is None:
                if not create:
                    return None, False
                record = RequestRecord(request_id=request_id)
            if mutate(record) is False:
                if revision is not None:
                    self._remember(record, revision)
                return record, False
            if record.verdict is not None and report_ready(record):
                record.report = build_report(record)
            if promised is not None:
                promised[:] = _promise(record)  # a lost compare-and-set promises again, from the record read anew
            record.updated_at = utcnow()
            data = record.stored_json()
            # Open until its verdict and report are out and marked: the sweeper follows this.
            open_ = not (record.verdict_published and record.report_published)
            try:
                if revision is None:
                    written = await kv.create(request_id, data, open_=open_)
                else:
                    written = await kv.update(request_id, data, last=revision, open_=open_)
            except KeyWrongLastSequenceError:
                if remembered is None and attempt:
                    # Someone else updated it first: re-read and re-apply, after a little jitter so
                    # that several aggregator workers do not keep colliding. (A remembered record
                    # that was stale is simply read again.)
                    await asyncio.sleep(random.uniform(0, 0.05))
                continue
            except nats.js.errors.BadRequestError as exc:
                if "wrong last sequence" in str(exc).lower():
                    continue
                raise
            if isinstance(written, int):
                record.revision = written
                self._remember(record, written)
            return record, True
        raise _Contention(attempts)

    async def update(
        self, request_id: str, mutate: Callable[[RequestRecord], bool | None], *, create: bool = True,
        new: bool = False, retried: bool = False, again: bool = False,
    ) -> RequestRecord | None:
        """Compare-and-set loop, then publish whatever the new record owes (verdict, report).
        ``mutate`` returns False when it changed nothing: then nothing is written.

        Group commit: the updates of a request that queue while one of its writes is under way
        are applied together, in their order, by the next write (one compare-and-set and one
        public view for all of them); each caller returns once its own change is written. ``new``:
        the request's first event (its record most likely does not exist yet); ``retried`` and
        ``again``: see :class:`_Queued`."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[RequestRecord | None] = loop.create_future()
        queued = self._queued.setdefault(request_id, [])
        owed = self._owed.pop(request_id, None)
        if owed:
            self._owed_later.forget(request_id)  # written here: its timer has nothing left to do
            queued.extend(owed)  # what came before this update goes first, in the same write
        queued.append(_Queued(mutate, create, new, done, retried=retried, again=again))
        async with self._hold(request_id):
            if not done.done():  # nobody wrote it yet: write everything queued for this request
                batch = self._queued.pop(request_id, [])
                try:
                    record = await self._write(request_id, batch)
                except BaseException as exc:
                    # The others queued behind this write learn how it ended; our own future is
                    # left alone (we raise instead), and a cancelled write cancels theirs, so no
                    # future is left holding an exception that nobody will retrieve.
                    for waiter in (queued.done for queued in batch):
                        if waiter is done or waiter.done():
                            continue
                        if isinstance(exc, asyncio.CancelledError):
                            waiter.cancel()
                        else:
                            waiter.set_exception(exc)
                    raise
                for waiter in (queued.done for queued in batch):
                    if not waiter.done():
                        waiter.set_result(record)
        return done.result()

    async def _write(self, request_id: str, batch: list[_Queued]) -> RequestRecord | None:
        mutate_all = _all_of([queued.mutate for queued in batch])
        # Messages that come back if this fails: the write that claims the verdict (or builds the
        # report) marks it published too, and a redelivery publishes it again (`again`).
        promised: list[str] = []
        try:
            # ``new``: the batch holds the request's first event, so the record most likely does not
            # exist yet (a create, no read first).
            record, changed = await self._cas(request_id, mutate_all, create=any(q.create for q in batch),
                                              new=any(q.new for q in batch), attempts=100,
                                              promised=promised if all(q.retried for q in batch) else None)
        except _Contention as exc:
            raise RuntimeError(f"could not update the record of {request_id}: too much contention") from exc
        if record is None or not changed:
            return record
        if record.terminal:
            self._last_progress_write.pop(request_id, None)  # its progress is over
        # The final view before the verdict: whoever has the verdict then finds it in `ftbus status`
        # (a view under way only lingers here, without a round trip). The sweeper's mark comes
        # after both: a record marked done has its final view written, so the sweeper, which looks
        # only at open records, never needs to write it again (a promise broken by a crash is kept
        # by the redelivery, which writes the view again).
        again = any(queued.again for queued in batch)
        await self._publish_status(record)
        published = await self._publish_owed(record, promised, again=again)
        unmarked = [flag for flag in published if not getattr(record, flag)]
        if unmarked:
            await self._mark(request_id, *unmarked)
        return record

    async def _publish_status(self, record: RequestRecord) -> None:
        """Write the public view of ``record``: at once when the request is over or asked to cancel
        (stage workers read that view to stop its work), else after STATUS_LINGER_S, so that the
        quick steps of a request (a pre-check failure is over in milliseconds) are one write, not
        one each. A crash loses at most a lingering view; the sweeper rewrites the views of recent
        records."""
        rid, view = record.request_id, record.public_view_json()
        if record.terminal or record.cancel_requested:
            if self._status_owed.pop(rid, None) is not None:  # a lingering one is older: never written after this
                self._status_later.forget(rid)
            await _after_a_turn()
            await self._put_status(rid, view, record.revision,
                                   final=record.verdict_published and record.report_published)
            return
        self._status_owed[rid] = (view, record.revision)  # the newest view replaces a lingering one
        self._status_later.owe(rid)

    async def _write_lingering_status(self, request_id: str) -> None:
        owed = self._status_owed.pop(request_id, None)
        if owed is None:
            return  # the request ended meanwhile: its final view is written
        try:
            await self._put_status(request_id, *owed)
        except Exception as exc:
            log.warning("public view not written; the request's next update writes it", request_id=request_id,
                        error=str(exc))

    async def _put_status(self, request_id: str, view: bytes, revision: int, *, final: bool = False,
                          attempts: int = 20) -> None:
        """Write ``view`` (of the record at ``revision``) unless the bucket holds a view of a later
        revision already: several aggregators, each handling some of a request's events, and
        lingering views may write one request's views out of order, and the newest must stay.
        A compare-and-set on the status bucket's own revision, which this aggregator remembers
        from its last write of that request (no read); a write that loses reads what won.
        ``final``: the view of a record whose verdict and report are out, after which this
        aggregator forgets the revision (a rare later write reads it)."""
        status_kv = await self.bus.kv(self.s.kv_status)
        last = self._view_revisions.pop(request_id, None)
        for _ in range(attempts):
            try:
                if last is None:
                    written = await status_kv.create(request_id, view)
                else:
                    written = await status_kv.update(request_id, view, last=last)
            except KeyWrongLastSequenceError:
                try:
                    entry = await status_kv.get(request_id)
                except KeyNotFoundError:
                    last = None
                    continue
                if _view_revision(entry.value) >= revision:
                    return  # a view as new or newer is there
                last = entry.revision
                continue
            if final:
                return
            self._view_revisions[request_id] = written
            while len(self._view_revisions) > RECORD_MEMORY:
                self._view_revisions.popitem(last=False)
            return
        raise RuntimeError(f"could not write the public view of {request_id}: {attempts} concurrent writes won")

    async def _publish_owed(self, record: RequestRecord, promised: list[str] | tuple[str, ...] = (), *,
                            again: bool = False) -> list[str]:
        """Publish the verdict and the report if the record owes them, or its write ``promised``
        them (marked them published before they are), or ``again``: whatever it marks published; the
        flags published (the caller marks those still unmarked, once whatever else must come first
        is done too)."""
        rid = record.request_id

        def owes(flag: str) -> bool:
            return not getattr(record, flag) or flag in promised or again

        with bound(request_id=rid, stage=Stage.aggregate.value):
            # Both at once when both are owed (a request that failed before the benchmark), then
            # one mark for both; a crash in between publishes them again, and the streams keep one.
            owed: dict[str, Awaitable[None]] = {}
            if record.verdict is not None and owes("verdict_published"):
                owed["verdict_published"] = self._publish_once(
                    self.s.verdict(rid), record.verdict, f"{rid}:aggregate:verdict")
            if record.report is not None and owes("report_published"):
                owed["report_published"] = self._publish_once(
                    self.s.report(rid), record.report, f"{rid}:aggregate:report",
                    wait_a_turn="verdict_published" in owed)
            if not owed:
                return []
            await together(*owed.values())
            # One line for what went out together.
            said: dict[str, Any] = {}
            if record.verdict is not None and "verdict_published" in owed:
                said.update(status=record.verdict.status, final_decision=record.verdict.final_decision,
                            failed_stage=record.verdict.failed_stage)
            if record.report is not None and "report_published" in owed:
                said["has_test"] = record.report.benchmark_test is not None
            what = " and ".join(flag.removesuffix("_published") for flag in owed)
            log.info(f"{what} published", **said)
            return list(owed)

    async def _publish_once(self, subject: str, event: Any, msg_id: str, *, wait_a_turn: bool = False) -> None:
        if wait_a_turn:
            await _after_a_turn()
        try:
            await self.bus.publish(subject, event, msg_id)
        except nats.js.errors.APIError as exc:
            # The stream holds at most one message per subject and refuses a second: the
            # verdict is already out, which is exactly what we wanted.
            if "maximum messages per subject" not in str(exc).lower():
                raise

    async def _mark(self, request_id: str, *flags: str, attempts: int = 100) -> None:
        """Set ``flags`` on the record (the caller holds the request's lock)."""

        def mark(record: RequestRecord) -> bool:
            if all(getattr(record, flag) for flag in flags):
                return False
            for flag in flags:
                setattr(record, flag, True)
            return True

        try:
            await self._cas(request_id, mark, create=False, attempts=attempts)
        except _Contention:
            # Never give up silently: the caller's message is naked and the mark retried later.
            raise RuntimeError(
                f"could not set {', '.join(flags)} on the record of {request_id}: {attempts} concurrent updates won"
            ) from None

    # ------------------------------------------------------------------ advisories

    async def _advisories(self, stop: asyncio.Event) -> None:
        await consume(self.bus, self.s.stream_advisories, f"{self.s.durable(Stage.aggregate)}-advisories", [">"],
                      self._on_advisory, stop, what="aggregate")

    async def _on_advisory(self, msg: Any, slot: Slot) -> None:
        try:
            await self._on_max_deliveries(json.loads(msg.data))
            await msg.ack()
        except Exception:
            log.exception("advisory handling failed, will retry")
            await msg.nak(delay=2)

    async def _on_max_deliveries(self, advisory: dict[str, Any]) -> None:
        """A stage gave up on a message: turn it into a dead letter (the DLQ consumer does the rest)."""
        stream, consumer, seq = advisory["stream"], advisory["consumer"], int(advisory["stream_seq"])
        stage = _stage_of_consumer(self.s.prefix, consumer)
        try:
            original = await self.bus.js.get_msg(stream, seq)
            payload, subject = bytes(original.data or b""), original.subject or "?"
        except Exception as exc:
            payload, subject = b"", f"<{stream} seq {seq}: {exc}>"
        request_id = None
        with contextlib.suppress(Exception):
            request_id = codec.decode(payload).request_id
        letter = DeadLetter(
            request_id=request_id,
            original_subject=subject,
            stage=stage,
            reason=f"the {stage.value if stage else consumer} stage failed {advisory.get('deliveries')} times "
            f"(max_deliver); last errors are in that stage's worker logs",
            payload=payload[:65536],
            deliveries=advisory.get("deliveries"),
        )
        await self.bus.publish(self.s.dlq, letter, f"dlq:{stream}:{seq}:{consumer}")

    # ------------------------------------------------------------------ sweeper

    async def _sweeper(self, stop: asyncio.Event) -> None:
        interval = self.bus.settings.sweep_interval_s
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
            if stop.is_set():
                return
            try:
                await self.sweep()
            except Exception:
                log.exception("sweep failed")

    async def sweep(self) -> None:
        """Look at every open record (services/aggregator/records_bucket.py): publish what a crash
        left unpublished, give up on a hidden test split that never came, and end stuck requests."""
        await self.kv()  # the bucket exists
        if self._open is None:
            self._open = OpenRecords(self.bus.js, self.s.kv_requests)
        keys = await self._open.refresh()
        now = utcnow()
        for key in keys:
            record, _ = await self.get(key)
            if record is None or (record.verdict_published and record.report_published):
                self._open.forget(key)  # gone, or done (written before records said so)
                continue
            if record.verdict is not None:
                if not record.verdict_published or (record.report and not record.report_published):
                    async with self._hold(key):
                        # A crash after the record's write: its final view first, then the rest.
                        await self._put_status(key, record.public_view_json(), record.revision)
                        published = await self._publish_owed(record)
                        if published:
                            await self._mark(key, *published)
                elif record.report is None and now - record.updated_at > self._limit("bench"):
                    await self.update(key, _give_up_on_test)
                continue
            if now - record.updated_at > self._limit(record.stage):
                stage = record.stage or Stage.data.value
                silent = int((now - record.updated_at).total_seconds())
                await self.update(
                    key,
                    lambda r, stage=stage, silent=silent: _claim(
                        r, error_verdict(r, stage, f"no progress for {silent} s: the request was stuck")
                    ),
                )

    def _limit(self, stage: str | None) -> timedelta:
        cfg = self.bus.settings
        timeout = {
            Stage.train.value: cfg.train_timeout_s,
            Stage.bench.value: 2 * cfg.bench_timeout_s,
            Stage.judge.value: cfg.judge_time_budget_s + cfg.judge_request_timeout_s,
        }.get(stage or "", cfg.data_timeout_s)
        return timedelta(seconds=timeout + cfg.stuck_grace_s)


# ---------------------------------------------------------------------- pure record transitions


def _view_revision(value: bytes | None) -> int:
    """The record revision a stored public view shows (0: none, or a view from before views said)."""
    if not value:
        return 0
    try:
        return RequestStatusView.model_validate_json(value).revision
    except ValueError:
        return 0


async def _after_a_turn() -> None:
    """Let the tasks started beside this one go first: nats-py writes what was published at its
    flusher's next turn, so a write that encodes something large before publishing would
    otherwise hold up a verdict published just before it."""
    await asyncio.sleep(0)


@dataclass
class _Queued:
    """An update waiting for its request's next write."""

    mutate: Callable[[RequestRecord], bool | None]
    #: Create the record if there is none.
    create: bool
    #: The request's first event: its record most likely does not exist yet (a create, no read first).
    new: bool
    #: Set once the write is done (the caller waits for it, or a message's ack does).
    done: asyncio.Future[RequestRecord | None]
    #: Whoever queued it sees it through: a message that comes back if this write, or what the
    #: write publishes, fails (or an update that can claim nothing: progress). A write made only of
    #: such updates marks the verdict and report published in the write that claims them (one
    #: write less a request); the sweeper's updates mark them once they are out (`_write`).
    retried: bool = False
    #: A redelivered message or a dead letter: its last handling may have died between the write
    #: that marked the verdict published and the publishing, so what is marked is published again
    #: (the verdict and report streams keep one message per subject).
    again: bool = False


def _promise(record: RequestRecord) -> list[str]:
    """Mark the verdict and the report the record owes as published (before they are); their flags."""
    flags = []
    for flag, owed in (("verdict_published", record.verdict), ("report_published", record.report)):
        if owed is not None and not getattr(record, flag):
            setattr(record, flag, True)
            flags.append(flag)
    return flags


def _unchanged(record: RequestRecord) -> bool:
    """No change of its own (a write of what is owed alone)."""
    return False


def _all_of(mutations: list[Callable[[RequestRecord], bool | None]]) -> Callable[[RequestRecord], bool]:
    """One mutation applying ``mutations`` in order: False only when none of them changed anything."""

    def apply(record: RequestRecord) -> bool:
        changed = [mutate(record) is not False for mutate in mutations]  # every one, no short cut
        return any(changed)

    return apply


class _Lingering:
    """Writes owed per request, each written once ``delay_s()`` after it was first owed, however
    often it is owed meanwhile (``write(key)`` takes what is owed then). A timer until then, not a
    task that sleeps: most are stopped (``forget``: written with the request's next event) long
    before they fire, and a cancelled task costs a wake-up of its own. ``most``: at most that many
    keys wait; owing one more writes the one that waited longest at once. ``flush`` on stop: what
    is still waiting is written at once, not lost with the process (best effort)."""

    def __init__(self, delay_s: Callable[[], float], write: Callable[[str], Awaitable[None]],
                 *, most: int | None = None) -> None:
        self._delay_s, self._write, self._most = delay_s, write, most
        #: In the order they were first owed (a dict keeps it), so the oldest is the first.
        self._waiting: dict[str, asyncio.TimerHandle] = {}
        #: The writes of the timers that fired, under way.
        self.tasks: set[asyncio.Task[None]] = set()

    def owe(self, key: str) -> None:
        if key not in self._waiting:
            self._waiting[key] = asyncio.get_running_loop().call_later(self._delay_s(), self._fire, key)
            if self._most is not None and len(self._waiting) > self._most:
                oldest = next(iter(self._waiting))
                self._waiting[oldest].cancel()
                self._fire(oldest)

    def _fire(self, key: str) -> None:
        del self._waiting[key]  # owed again from now on: a write of its own
        task = asyncio.create_task(self._write(key))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def forget(self, key: str) -> None:
        """What was owed for ``key`` was written another way: its timer is stopped, rather than left
        to wake for nothing (a pre-check failure's request owes its arrival and a view, each
        written with its next event: wake-ups by the burst)."""
        handle = self._waiting.pop(key, None)
        if handle is not None:
            handle.cancel()

    async def flush(self, keys: list[str]) -> None:
        for handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.gather(*(self._write(key) for key in keys))

    async def settled(self) -> None:
        """Once every write owed now has fired and is done (tests)."""
        while self._waiting or self.tasks:
            await asyncio.sleep(0.01)
            await asyncio.gather(*self.tasks, return_exceptions=True)


class _Contention(Exception):
    """Every compare-and-set of a record lost."""


def _claim(record: RequestRecord, verdict: Any) -> None:
    """Set the verdict unless one is already claimed: the first writer wins, forever."""
    if record.verdict is not None:
        return
    record.verdict = verdict
    record.status = verdict.status
    record.final_decision = verdict.final_decision
    record.failed_stage = verdict.failed_stage


def _timing(record: RequestRecord, stage: str) -> StageTiming:
    return record.stages.setdefault(stage, StageTiming())


def _on_request(record: RequestRecord, event: EvalRequested) -> None:
    record.task = event.context.task
    record.submitted_at = event.context.submitted_at


def _ran(timing: StageTiming, run: StageRun | None) -> None:
    """A stage's start and attempt as its result tells them (a stage over within a second announces
    no start: shared/runtime.py). The earliest start stands: a long stage's announced start came
    a second after the handler's, and a retry's start is not the stage's."""
    if run is None:
        return
    timing.attempts = max(timing.attempts, run.attempt)
    if timing.started_at is None or run.started_at < timing.started_at:
        timing.started_at = run.started_at


def _on_stage_result(record: RequestRecord, event: DataResult | TrainResult | BenchResult) -> None:
    stage = RESULT_STAGE[type(event)].value
    timing = _timing(record, stage)
    _ran(timing, event.run)
    timing.finished_at = event.emitted_at
    timing.ok = event.ok
    if record.verdict is None:
        record.status = "running"
        record.stage = Stage.judge.value if not event.ok else _next_stage(stage)


def _next_stage(stage: str) -> str:
    order = [Stage.data.value, Stage.train.value, Stage.bench.value, Stage.judge.value]
    return order[min(order.index(stage) + 1, len(order) - 1)]


def _on_test(record: RequestRecord, event: BenchResult) -> None:
    record.test_received = True
    record.benchmark_test = event.benchmark
    record.benchmark_test_error = None if event.ok else (event.error or "the test split failed")


def _on_judge(record: RequestRecord, event: JudgeResult) -> None:
    timing = _timing(record, Stage.judge.value)
    _ran(timing, event.run)
    timing.finished_at = event.emitted_at
    timing.ok = True
    record.judge = event
    _claim(record, verdict_from_judge(event))


def _on_cancel(record: RequestRecord, event: CancelRequested) -> None:
    record.cancel_requested = True
    _claim(record, cancelled_verdict(record, event.reason))


def _on_dead_letter(record: RequestRecord, event: DeadLetter) -> None:
    stage = event.stage.value if event.stage else record.stage
    _claim(record, error_verdict(record, stage, event.reason))


def _on_progress(record: RequestRecord, event: Progress) -> bool:
    if record.terminal:
        return False  # nothing to write
    stage = event.stage.value
    timing = _timing(record, stage)
    if event.state == "started":
        timing.attempts += 1
        timing.started_at = timing.started_at or event.emitted_at
    record.status = "running"
    record.stage = stage
    record.progress = event
    return True


def _give_up_on_test(record: RequestRecord) -> None:
    if record.report is None and not record.test_received:
        record.test_received = True
        record.benchmark_test_error = "the hidden test split's result never arrived"


def _stage_of_consumer(prefix: str, consumer: str) -> Stage | None:
    name = consumer.removeprefix(f"{prefix}-").split("-")[0]
    try:
        return Stage(name)
    except ValueError:
        return None
