"""The stage worker runtime: how every service consumes its events (docs/design.md, §5).

One durable pull consumer per stage, shared by every worker of that stage (the server balances
the load). For each message:

- undecodable or invalid  -> a DeadLetter on ``ftbus.dlq`` (with the request id when readable), term();
- cancelled request       -> ack, nothing published (a cancel this worker heard is skipped; a stage
                             that runs candidate code reads the request's status first, and again at
                             every heartbeat, so a cancel it did not hear stops it too);
- already done (redelivery after a crash between store and ack) -> republish the stored result, ack
                             (looked up before every handling of a stage that runs candidate code,
                             and on every redelivery of the others);
- handler returns         -> results stored under (request_id, stage), published with
                             ``Nats-Msg-Id = <request_id>:<stage>:<kind>``, then ack. A candidate's
                             failure is such a result: published and acked, never retried;
- handler raises          -> an infrastructure error: nak with backoff, up to ``max_deliver``
                             attempts: counted by a stage's worker (shared/attempts.py), else by the
                             server, whose MAX_DELIVERIES advisory reaches the aggregator.

While a handler runs, ``in_progress()`` is sent every ``heartbeat_s`` so that ack_wait only
expires when the worker is really gone, and the message then goes to another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from pydantic import BaseModel

from runners.base import Runner
from shared import codec
from shared.artifacts import ArtifactStore
from shared.bus import Bus
from shared.consumer import UNLIMITED, Slot, consume
from shared.events import CancelRequested, DeadLetter, Progress, Stage, StageRun
from shared.logs import bound, get_logger
from shared.records import RequestStatusView
from shared.settings import Settings
from shared.subjects import Subjects, msg_id
from shared.tasks import cancel_until_done

log = get_logger("ftbus.runtime")


@dataclass(frozen=True)
class Outgoing:
    """One event a handler wants published. ``kind`` completes its de-duplication id."""

    subject: str
    event: BaseModel
    kind: str

    @functools.cached_property
    def payload(self) -> bytes:
        """The event encoded: the same bytes are published and stored (IdempotencyStore)."""
        return codec.encode(self.event)


@dataclass
class StageContext:
    bus: Bus
    stage: Stage
    request_id: str
    artifacts: ArtifactStore
    #: What runs candidate code; None for a stage that runs none (the judge, the aggregator).
    runner: Runner | None
    deliveries: int
    #: The stage's folder of working folders (``<work>/<stage>``): see :attr:`workdir`.
    workdirs: Path
    subject: str = ""
    slot: Slot | None = None
    #: Whether the handler asked for its working folder (only then is it looked for, and deleted, after).
    workdir_used: bool = False
    #: When the handler started (its results say so: :class:`~shared.events.StageRun`).
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: What the handler found, said on this message's ``stage finished`` line (:meth:`tell`).
    told: dict[str, Any] = field(default_factory=dict)

    @property
    def workdir(self) -> Path:
        """This message's working folder, made by the handler if it needs one, deleted once the
        message is done."""
        self.workdir_used = True
        return self.workdir_path

    @property
    def workdir_path(self) -> Path:
        """The working folder's path, whether or not the handler asked for it."""
        return self.workdirs / f"{self.request_id}-{self.deliveries}"

    @property
    def settings(self) -> Settings:
        return self.bus.settings

    @property
    def subjects(self) -> Subjects:
        return self.bus.subjects

    def device_done(self) -> None:
        """This message's device work (the GPU run) is over: the worker may fetch its next message
        while this one finishes (uploads, results). A no-op for a stage without device slots."""
        if self.slot is not None:
            self.slot.release()

    def tell(self, **facts: Any) -> None:
        """Facts of this handling (a refusal's reason, the judge's decision) for the log line that
        ends it, ``stage finished``: one line says what the handling found."""
        self.told.update(facts)

    async def progress(self, state: str = "running", **fields: Any) -> None:
        """Progress for clients and dashboards (core NATS, at most once), saying which attempt it is."""
        event = Progress(request_id=self.request_id, stage=self.stage, state=state, attempt=self.deliveries,  # type: ignore[arg-type]
                         **fields)
        await self.bus.publish_core(self.subjects.progress(self.request_id), event)


Handler = Callable[[Any, StageContext], Awaitable[list[Outgoing]]]


def _deliveries(msg: Msg) -> int:
    """1 on the first delivery of ``msg`` to this consumer, more on each redelivery."""
    try:
        return int(msg.metadata.num_delivered)
    except Exception:  # not a JetStream message (nats-py raises on a plain reply subject)
        return 1


def _stage_key(request_id: str, stage: Stage) -> str:
    return f"{request_id}.{stage}"


# ---------------------------------------------------------------------------- policies
#
# What a consumer does around its handler is a list of small policies, each one job. A stage
# worker has all three; the aggregator none (it must see cancelled requests, keeps no results of
# its own, and announces nothing).


class Policy:
    """Hooks around one message's handling; each defaults to doing nothing."""

    #: True: this policy counts the attempts (the consumer's ``max_deliver`` is then unlimited).
    counts_attempts = False

    async def start(self, worker: StageWorker) -> None:
        """The worker starts (before any message)."""

    async def stop(self) -> None:
        """The worker stops."""

    async def skip(self, worker: StageWorker, request_id: str, deliveries: int) -> bool:
        """True: the message needs no handling (it is acked as it is). Every policy is asked, at once."""
        return False

    async def claim(self, worker: StageWorker, msg: Msg, request_id: str, deliveries: int) -> bool:
        """Before the handler: False when the policy settled the message (naked, terminated) instead."""
        return True

    async def started(self, ctx: StageContext) -> None:
        """The handler starts."""

    async def beat(self, worker: StageWorker, request_id: str) -> None:
        """At every heartbeat while the handler runs."""

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        """The handler returned; its events are being published (beside this)."""

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        """The events are published and the message acked."""

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        """The handler raised, or its results were not published: the message is naked for another attempt."""

    async def abandoned(self, ctx: StageContext) -> None:
        """The handling was cancelled: by request (acked), or this worker stops (naked)."""


class IdempotencyStore(Policy):
    """Stores what the handler published under (request_id, stage); a redelivery after a crash
    between store and ack republishes it instead of running the stage again.

    A stage that runs candidate code looks before every handling: a first delivery may be a replay
    (the durable consumer recreated delivers the stream again, as first deliveries), and nothing
    must be trained twice. The others look on redeliveries only."""

    async def skip(self, worker: StageWorker, request_id: str, deliveries: int) -> bool:
        if deliveries <= 1 and not worker.runs_candidate_code:
            return False
        bus = worker.bus
        kv = await bus.kv(bus.subjects.kv_stage_results(worker.stage))
        try:
            entry = await kv.get(_stage_key(request_id, worker.stage))
        except KeyNotFoundError:
            return False
        if not entry.value:
            return False
        for subject, kind, payload in msgpack.unpackb(entry.value, raw=False):
            await bus.publish_payload(subject, payload, msg_id(request_id, worker.stage, kind))
        log.info("stage already done, republished its stored result")
        return True

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        kv = await ctx.bus.kv(ctx.subjects.kv_stage_results(ctx.stage))
        packed = msgpack.packb([[o.subject, o.kind, o.payload] for o in outgoing], use_bin_type=True)
        await kv.put(_stage_key(ctx.request_id, ctx.stage), packed)


class SkipCancelled(Policy):
    """A cancelled request is skipped, and its running work killed: on the cancel event (core
    NATS), and, since a worker cut off from the server misses that, on the request's status: a
    stage that runs candidate code reads it before it starts, and every stage at each heartbeat."""

    #: Cancels heard on the core subject that this worker remembers (the status record says it too).
    MEMORY = 1024

    def __init__(self) -> None:
        self._worker: StageWorker | None = None
        self._sub: Any = None
        self._seen: dict[str, None] = {}

    async def start(self, worker: StageWorker) -> None:
        self._worker = worker
        self._sub = await worker.bus.nc.subscribe(worker.bus.subjects.cancel, cb=self._on_cancel)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def skip(self, worker: StageWorker, request_id: str, deliveries: int) -> bool:
        if request_id in self._seen or (worker.runs_candidate_code and await is_cancelled(worker.bus, request_id)):
            log.info("request was cancelled, skipping")
            return True
        return False

    async def beat(self, worker: StageWorker, request_id: str) -> None:
        if await is_cancelled(worker.bus, request_id):
            worker.cancel_running(request_id, "cancelled (seen in the status record)")

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            event = codec.decode(msg.data, CancelRequested)
        except codec.CodecError:
            return  # the aggregator dead-letters bad control messages
        self._seen[event.request_id] = None
        while len(self._seen) > self.MEMORY:
            self._seen.pop(next(iter(self._seen)))
        if self._worker is not None:
            self._worker.cancel_running(event.request_id, event.reason)


class AnnounceProgress(Policy):
    """Started / finished / failed / retrying progress events for clients and dashboards."""

    async def started(self, ctx: StageContext) -> None:
        await ctx.progress("started", message=f"attempt {ctx.deliveries}")

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        ok = all(not out.kind.endswith("failed") for out in outgoing)
        await ctx.progress("finished" if ok else "failed", message=", ".join(o.kind for o in outgoing))

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        await ctx.progress("retrying", message=f"{type(exc).__name__}: {exc}"[:500])


def stage_policies() -> tuple[Policy, ...]:
    """What every stage worker does around its handler."""
    return (SkipCancelled(), IdempotencyStore(), AnnounceProgress())


#: Whether this consumer dead-letters an unreadable message on ``subject``: None to do it, or the
#: reason it does not (logged; the message is then terminated).
DeadLetterRule = Callable[[str], "str | None"]


def always_dead_letter(subject: str) -> str | None:
    return None


def never_dead_letter(subject: str) -> str | None:
    return "a dead letter that cannot be read is dropped (it would loop back to the dead-letter stream)"


async def is_cancelled(bus: Bus, request_id: str) -> bool:
    kv = await bus.kv(bus.subjects.kv_status)
    try:
        entry = await kv.get(request_id)
    except KeyNotFoundError:
        return False
    if not entry.value:
        return False
    view = RequestStatusView.model_validate_json(entry.value)
    return view.cancel_requested or view.status == "cancelled"


# ---------------------------------------------------------------------------- the worker


class StageWorker:
    """Consumes one stage's messages (``concurrency`` at a time in this process) with its handler.

    ``runner``: what runs candidate code (the sandbox: runners/choice.py), None for a stage
    that runs none. ``policies`` say what happens around the handler (default:
    :func:`stage_policies`); ``dead_letter`` says which unreadable messages this consumer
    dead-letters (default: all).
    """

    def __init__(
        self,
        bus: Bus,
        stage: Stage,
        handler: Handler,
        expected: tuple[type[BaseModel], ...],
        *,
        filters: Sequence[str],
        runner: Runner | None = None,
        concurrency: int = 1,
        device_slots: int | None = None,
        stream: str | None = None,
        durable: str | None = None,
        policies: Sequence[Policy] | None = None,
        dead_letter: DeadLetterRule = always_dead_letter,
        log_each: bool = True,
    ) -> None:
        self.bus = bus
        self.stage = stage
        self.handler = handler
        self.expected = expected
        self.concurrency = max(1, concurrency)
        #: None: up to ``concurrency`` messages at once, fetched for every free handler together. A
        #: number: ``concurrency`` loops, each fetching one message at a time, share this many device
        #: slots (more loops than slots, so that a message finishing after its device work overlaps
        #: the next one's: shared/consumer.py).
        self.device_slots = device_slots
        self.runner = runner
        self.stream = stream or bus.subjects.stream_events
        self._workdirs = bus.settings.work / stage
        self.durable = durable or bus.subjects.durable(stage)
        self.filters = list(filters)
        self.policies: tuple[Policy, ...] = tuple(stage_policies() if policies is None else policies)
        self.dead_letter = dead_letter
        #: Log every message's start and end at INFO (a stage's runs); off: at DEBUG (the
        #: aggregator's several events per request, which log what they change themselves).
        self._note = log.info if log_each else log.debug
        self._running: dict[str, asyncio.Task[list[Outgoing]]] = {}
        self._cancelled: set[str] = set()
        self._cleanups: set[asyncio.Task[None]] = set()

    @property
    def runs_candidate_code(self) -> bool:
        return self.runner is not None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        for policy in self.policies:
            await policy.start(self)
        log.info("worker started", stage=self.stage, concurrency=self.concurrency, durable=self.durable)
        try:
            # On stop, do not finish a training that may take hours: the loops are cancelled (the
            # runner kills its process tree) and the message naked, so another worker takes it.
            counted_here = any(policy.counts_attempts for policy in self.policies)
            await consume(self.bus, self.stream, self.durable, self.filters, self._process, stop,
                          concurrency=self.concurrency, device_slots=self.device_slots, what=self.stage,
                          max_deliver=UNLIMITED if counted_here else None)
        finally:
            for policy in self.policies:
                await policy.stop()
            if self._cleanups:  # working folders still being deleted
                await asyncio.gather(*self._cleanups, return_exceptions=True)
            log.info("worker stopped", stage=self.stage)

    def cancel_running(self, request_id: str, reason: str) -> None:
        """Kill this worker's running handling of ``request_id``, as a cancel (acked, not retried)."""
        task = self._running.get(request_id)
        if task is not None and not task.done():
            with bound(request_id=request_id, stage=self.stage):
                log.info("cancelling the running stage", reason=reason)
            self._cancelled.add(request_id)
            task.cancel()

    # ------------------------------------------------------------------ one message

    async def _process(self, msg: Msg, slot: Slot | None = None) -> None:
        deliveries = _deliveries(msg)
        try:
            event = codec.decode(msg.data, self.expected)
        except codec.CodecError as err:
            left_alone = self.dead_letter(msg.subject)
            if left_alone is None:
                await self._dead_letter(msg, err.reason, err.request_id, deliveries)
            else:
                log.info("unreadable message not dead-lettered here", why=left_alone, reason=err.reason,
                         subject=msg.subject)
                await msg.term()
            return
        request_id: str = event.request_id
        with bound(request_id=request_id, stage=self.stage):
            # The policies look at once (the stored result, the cancel flag: two reads, one wait).
            if any(await asyncio.gather(*(policy.skip(self, request_id, deliveries) for policy in self.policies))):
                await msg.ack()
                return
            for policy in self.policies:
                if not await policy.claim(self, msg, request_id, deliveries):
                    return
            ctx = StageContext(
                self.bus, self.stage, request_id, await self.bus.artifacts(), self.runner, deliveries,
                self._workdirs, subject=msg.subject, slot=slot,
            )
            try:
                await self._handle(ctx, msg, event)
            finally:
                # Once the results are out and the message acked, off the event loop, and without
                # holding up this loop's next message (a training's outputs take a while to delete).
                if ctx.workdir_used and (workdir := ctx.workdir_path).exists():
                    task = asyncio.create_task(asyncio.to_thread(_cleanup, workdir))
                    self._cleanups.add(task)
                    task.add_done_callback(self._cleanups.discard)

    async def _handle(self, ctx: StageContext, msg: Msg, event: Any) -> None:
        request_id, deliveries = ctx.request_id, ctx.deliveries
        self._note("stage started", delivery=deliveries, subject=msg.subject)
        for policy in self.policies:
            try:
                await policy.started(ctx)
            except Exception as exc:  # progress is best effort: the stage runs on
                log.warning("announcing the start failed", error=str(exc))
        # A task of its own, so that a cancel (cancel_running) stops the handler alone.
        handling = self._running[request_id] = asyncio.create_task(self.handler(event, ctx))
        heartbeat = asyncio.create_task(self._heartbeat(msg, request_id))
        try:
            outgoing = await handling
        except asyncio.CancelledError:
            try:
                for policy in self.policies:  # before the nak: the next delivery finds the request free
                    with contextlib.suppress(Exception):
                        await policy.abandoned(ctx)
            finally:
                if request_id not in self._cancelled:
                    # This worker is shutting down: let another one take the message at once.
                    with contextlib.suppress(Exception):
                        await msg.nak()
            if request_id not in self._cancelled:
                raise
            # The user cancelled it: the aggregator publishes the verdict; the work is over.
            log.info("stage cancelled by request")
            await msg.ack()
            await ctx.progress("failed", message="cancelled")
            return
        except Exception as exc:
            delay = self._backoff(deliveries)
            log.exception("infrastructure error, will retry", delay_s=delay, delivery=deliveries)
            for policy in self.policies:
                await policy.retrying(ctx, exc)
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay)
            return
        finally:
            self._running.pop(request_id, None)
            self._cancelled.discard(request_id)
            await cancel_until_done([heartbeat])
        _stamp(outgoing, ctx)
        try:
            # The stored result and the published events go out together, then the ack. Either
            # order is safe: a redelivery finds the stored result and republishes it, or runs the
            # stage again, and the de-duplication ids keep a second copy off the stream.
            await asyncio.gather(
                *(self.bus.publish_payload(out.subject, out.payload, msg_id(request_id, self.stage, out.kind))
                  for out in outgoing),
                *(policy.done(ctx, outgoing) for policy in self.policies),
            )
            await msg.ack()
        except Exception as exc:
            log.exception("publishing results failed, will retry")
            for policy in self.policies:
                with contextlib.suppress(Exception):
                    await policy.retrying(ctx, exc)
            with contextlib.suppress(Exception):
                await msg.nak(delay=self._backoff(deliveries))
            return
        for policy in self.policies:
            await policy.finished(ctx, outgoing)
        self._note("stage finished", **{**ctx.told, "delivery": deliveries, "subject": msg.subject,
                   "seconds": round((datetime.now(UTC) - ctx.started_at).total_seconds(), 3),
                   "published": [o.subject for o in outgoing]})

    async def _heartbeat(self, msg: Msg, request_id: str) -> None:
        """While the handler runs: ``in_progress()`` every interval, so that ack_wait expires only
        when the worker is really gone, and the policies' look (a cancel in the status record)."""
        settings = self.bus.settings
        interval = min(settings.heartbeat_s, settings.ack_wait_s / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await msg.in_progress()
                for policy in self.policies:
                    await policy.beat(self, request_id)
            except Exception as exc:  # a lost connection: the next beat may get through
                log.warning("heartbeat failed", error=str(exc))

    def _backoff(self, deliveries: int) -> float:
        steps = self.bus.settings.retry_backoff_s or [1.0]
        return float(steps[min(deliveries - 1, len(steps) - 1)])

    async def _dead_letter(self, msg: Msg, reason: str, request_id: str | None, deliveries: int) -> None:
        seq = msg.metadata.sequence.stream if msg.metadata else 0
        with bound(request_id=request_id or "-", stage=self.stage):
            log.error("dead-lettering an unreadable message", reason=reason, subject=msg.subject)
        letter = DeadLetter(
            request_id=request_id,
            original_subject=msg.subject,
            stage=self.stage,
            reason=reason,
            payload=bytes(msg.data[:65536]),
            deliveries=deliveries,
        )
        await self.bus.publish(self.bus.subjects.dlq, letter, f"dlq:{self.stream}:{seq}:{self.durable}")
        await msg.term()


def _stamp(outgoing: list[Outgoing], ctx: StageContext) -> None:
    """Each result says which handling made it, and when that started (StageRun): the record's
    timeline holds a stage's start and attempts even when its progress messages (at most once) were
    lost. Before the payloads are encoded (Outgoing.payload, once)."""
    for out in outgoing:
        if "run" in type(out.event).model_fields:
            out.event.run = StageRun(started_at=ctx.started_at, attempt=ctx.deliveries)  # type: ignore[attr-defined]


def _cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
