"""The stage worker runtime: how every service consumes its events (docs/design.md, §5).

One durable pull consumer per stage, shared by every worker of that stage (the server balances
the load). For each message:

- undecodable or invalid  -> a DeadLetter on ``ftbus.dlq`` (with the request id when readable), term();
- cancelled request       -> ack, nothing published (a cancel this worker heard is skipped at once;
                             one only the status record knows, which is read once the handler
                             has run a second, stops the handler as a cancel mid-run does);
- already done (redelivery after a crash between store and ack) -> republish the stored result, ack
                             (looked up on redeliveries and on old messages: a fresh first delivery
                             has nothing stored);
- handler returns         -> results stored under (request_id, stage), published with
                             ``Nats-Msg-Id = <request_id>:<stage>:<kind>``, then ack. A candidate's
                             failure is such a result: published and acked, never retried;
- handler raises          -> an infrastructure error: nak with backoff, up to ``max_deliver``;
                             after that the server's MAX_DELIVERIES advisory reaches the aggregator.

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

from shared import codec
from shared.artifacts import ArtifactStore
from shared.bus import Bus
from shared.consumer import Slot, consume
from shared.events import CancelRequested, DeadLetter, Progress, Stage, StageRun
from shared.logs import bound, get_logger
from shared.records import RequestStatusView
from shared.runner import LocalRunner, Runner, reap_orphans
from shared.settings import Settings
from shared.subjects import Subjects, msg_id
from shared.tasks import together

log = get_logger("ftbus.runtime")


@dataclass(frozen=True)
class Outgoing:
    """One event a handler wants published. ``kind`` completes its de-duplication id.

    ``stored``: False when the handler works this event out again from its message alone, at once
    and the same way (a pre-check's refusal, a judgement by the rules): a redelivery then runs the
    handler again rather than reading a stored copy, and the hop saves the store's write. Anything
    that ran candidate code, trained, or asked an LLM is stored (IdempotencyStore)."""

    subject: str
    event: BaseModel
    kind: str
    stored: bool = True

    @functools.cached_property
    def payload(self) -> bytes:
        """The event encoded, once: the same bytes are published and stored (IdempotencyStore)."""
        return codec.encode(self.event)


@dataclass
class StageContext:
    bus: Bus
    stage: Stage
    request_id: str
    artifacts: ArtifactStore
    runner: Runner
    deliveries: int
    #: The stage's folder of working folders (``<work>/<stage>``): see :attr:`workdir`.
    workdirs: Path
    subject: str = ""
    slot: Slot | None = None
    #: Set by :meth:`ack_after`: the message is acked once this is done, not when the handler returns.
    acked_after: asyncio.Future[Any] | None = None
    #: Whether the handler asked for its working folder (only then is it looked for, and deleted, after).
    workdir_used: bool = False
    #: When the handler started (its results say so: :class:`~shared.events.StageRun`).
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: What announces this message's start (the worker's policies: progress ``started``); see
    #: :meth:`announce`. None: nothing to announce.
    announcer: Callable[[], Awaitable[None]] | None = None
    #: Whether the start was announced (then its end is too: ``finished``, ``failed``).
    announced: bool = False
    #: What the handler found, said on this message's ``stage finished`` line (:meth:`tell`).
    told: dict[str, Any] = field(default_factory=dict)

    @property
    def workdir(self) -> Path:
        """This message's working folder, made by the handler if it needs one, deleted once the
        message is done. Most light messages never ask, and cost no look at the disk after."""
        self.workdir_used = True
        return self.workdir_path

    @property
    def workdir_path(self) -> Path:
        """The working folder's path, whether or not the handler asked for it (worked out only
        when asked: most messages never are)."""
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

    def ack_after(self, written: asyncio.Future[Any]) -> None:
        """Ack this message once ``written`` is done (nak it if that fails), rather than when the
        handler returns: the handler's work is left to finish later (the aggregator writes an event
        that ends nothing with its request's next one), and this handler's place goes to the next
        message meanwhile. Until then the message is unacked, so a crash redelivers it."""
        self.acked_after = written

    def tell(self, **facts: Any) -> None:
        """Facts of this handling (a refusal's reason, the judge's decision) for the log line that
        ends it, ``stage finished``, rather than a line of their own: a quick handling logs one
        line, and a line costs a light stage about as much as its handler (bench/precheck_burst.py)."""
        self.told.update(facts)

    async def announce(self) -> None:
        """Announce this message's start, once. The worker does it when the handler has run for
        ``StageWorker.FIRST_LOOK_S``, or sooner when the handler reports progress of its own: a
        handler over sooner (a pre-check, a judgement by the rules, each of the aggregator's
        events) announces nothing, and its result tells its start instead (``StageRun``). That
        keeps four progress messages off each quick request (bench/precheck_burst.py), and
        nobody can watch a stage that lasts milliseconds anyway."""
        if self.announced:
            return
        self.announced = True
        if self.announcer is not None:
            await self.announcer()

    async def progress(self, state: str = "running", **fields: Any) -> None:
        """Progress for clients and dashboards (core NATS, at most once); the start goes first."""
        if not self.announced and state != "started":
            await self.announce()
        event = Progress(request_id=self.request_id, stage=self.stage, state=state, **fields)  # type: ignore[arg-type]
        await self.bus.publish_core(self.subjects.progress(self.request_id), event)


Handler = Callable[[Any, StageContext], Awaitable[list[Outgoing]]]


@dataclass(frozen=True)
class Delivery:
    """What the server says of this delivery of a message."""

    #: 1 on the first delivery to this consumer, more on each redelivery.
    count: int
    #: Seconds since the message was stored in its stream (by this worker's clock).
    age_s: float

    @classmethod
    def of(cls, msg: Msg) -> Delivery:
        try:
            meta = msg.metadata
        except Exception:  # not a JetStream message (nats-py raises on a plain reply subject)
            return cls(1, 0.0)
        stored = meta.timestamp
        age = (datetime.now(UTC) - stored).total_seconds() if stored.tzinfo else 0.0
        return cls(meta.num_delivered, age)


def _stage_key(request_id: str, stage: Stage) -> str:
    return f"{request_id}.{stage.value}"


# ---------------------------------------------------------------------------- policies
#
# What a consumer does around its handler is a list of small policies, each one job. A stage
# worker has all three; the aggregator none (it must see cancelled requests, keeps no results of
# its own, and announces nothing).


class Policy:
    """Hooks around one message's handling; each defaults to doing nothing."""

    async def start(self, worker: StageWorker) -> None:
        """The worker starts (before any message)."""

    async def stop(self) -> None:
        """The worker stops."""

    async def lookup(self, worker: StageWorker, request_id: str, delivery: Delivery) -> Any:
        """Read what :meth:`skip` decides from (a KV entry, say). The policies look one after the
        other; only IdempotencyStore goes to the server, and only on a redelivery or an old message,
        which keeps the round trip off every hop (docs/design.md, §9). A second policy that reads
        the server would have both reads run at once."""
        return None

    async def skip(self, worker: StageWorker, request_id: str, looked: Any = None) -> bool:
        """True: the message needs no handling (it is acked as it is). ``looked``: what
        :meth:`lookup` returned. The policies decide in their order."""
        return False

    async def started(self, ctx: StageContext) -> None:
        """The handler's start is announced: it has run for ``StageWorker.FIRST_LOOK_S``, or reported
        progress sooner (:meth:`StageContext.announce`). A handler over sooner is not announced."""

    async def beat(self, worker: StageWorker, request_id: str) -> None:
        """Once the handler has run for ``StageWorker.FIRST_LOOK_S`` (beside it, not before it), then
        at every heartbeat while it runs. A handler that ends sooner gets no beat at all."""

    def acts_on(self, outgoing: list[Outgoing]) -> bool:
        """Whether :meth:`done` has anything to do for these events (False: it is not called)."""
        return type(self).done is not Policy.done

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        """The handler returned; its events are about to be published (beside this)."""

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        """The events are published and the message acked (whether or not its start was announced)."""

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        """The handler raised: the message is naked for another attempt."""


class IdempotencyStore(Policy):
    """Stores what the handler published under (request_id, stage); a redelivery after a crash
    between store and ack republishes it instead of running the stage again."""

    #: A first delivery younger than this reads no stored result (see :meth:`lookup`).
    FRESH_S = 30.0

    async def lookup(self, worker: StageWorker, request_id: str, delivery: Delivery) -> bytes | None:
        if delivery.count <= 1 and delivery.age_s < self.FRESH_S:
            # A result is stored only by handling this message, and every handling after the first
            # is a redelivery: a fresh first delivery has nothing stored, and the round trip would
            # sit on every hop. An old one may be a replay (the durable consumer recreated, which
            # delivers the whole stream again as first deliveries): it looks, so that nothing is
            # trained twice. (The same request submitted again after the de-duplication window is
            # a fresh first delivery: it runs the stage again, and the aggregator, whose record is
            # already final, publishes no second verdict.)
            return None
        bus = worker.bus
        kv = await bus.kv(bus.subjects.kv_stage_results(worker.stage))
        try:
            entry = await kv.get(_stage_key(request_id, worker.stage))
        except KeyNotFoundError:
            return None
        return entry.value or None

    async def skip(self, worker: StageWorker, request_id: str, looked: Any = None) -> bool:
        if not looked:
            return False
        bus = worker.bus
        for subject, kind, payload in msgpack.unpackb(looked, raw=False):
            await bus.publish_payload(subject, payload, msg_id(request_id, worker.stage.value, kind))
        log.info("stage already done, republished its stored result")
        return True

    def acts_on(self, outgoing: list[Outgoing]) -> bool:
        # Nothing to store for events worked out again from the message, the same way (Outgoing).
        return not outgoing or any(out.stored for out in outgoing)

    async def done(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        # One turn of the event loop first: the events, published just before, reach the socket
        # ahead of this write (the next stage waits for them, nobody waits for this).
        await asyncio.sleep(0)
        kv = await ctx.bus.kv(ctx.subjects.kv_stage_results(ctx.stage))
        packed = msgpack.packb([[o.subject, o.kind, o.payload] for o in outgoing], use_bin_type=True)
        await kv.put(_stage_key(ctx.request_id, ctx.stage), packed)


class SkipCancelled(Policy):
    """A cancelled request is skipped, and its running work killed: on the cancel event (core
    NATS), and, since a worker cut off from the server misses that, on the status record. The
    record is read once the handler has run for ``StageWorker.FIRST_LOOK_S``, beside it rather than
    before it, and at every heartbeat: found cancelled, the handler is stopped as by a cancel
    event, so nothing is published. A handler over sooner (a pre-check, a rule judgement) reads
    nothing: its result, if the request was cancelled meanwhile, reaches a record whose verdict is
    already claimed, and the next stage makes its own look (bench/precheck_burst.py: one round
    trip less per stage and request)."""

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

    async def lookup(self, worker: StageWorker, request_id: str, delivery: Delivery) -> bool:
        return request_id in self._seen

    async def skip(self, worker: StageWorker, request_id: str, looked: Any = None) -> bool:
        if looked:
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
    """Started / finished / failed / retrying progress events for clients and dashboards: the end
    of what was announced as started (a quick handler's result says it all: StageContext.announce)."""

    async def started(self, ctx: StageContext) -> None:
        await ctx.progress("started", message=f"attempt {ctx.deliveries}")

    async def finished(self, ctx: StageContext, outgoing: list[Outgoing]) -> None:
        if not ctx.announced:
            return
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

    ``policies`` say what happens around the handler (default: :func:`stage_policies`);
    ``dead_letter`` says which unreadable messages this consumer dead-letters (default: all).
    """

    #: How long a handler runs before the policies' first look (``Policy.beat``): the look is a
    #: round trip, and most light handlers are over sooner.
    FIRST_LOOK_S = 1.0

    def __init__(
        self,
        bus: Bus,
        stage: Stage,
        handler: Handler,
        expected: tuple[type[BaseModel], ...],
        *,
        concurrency: int = 1,
        device_slots: int | None = None,
        runner: Runner | None = None,
        stream: str | None = None,
        durable: str | None = None,
        filters: Sequence[str],
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
        settings = bus.settings
        toolchain = settings.toolchain_path()
        self.runner = runner or LocalRunner(
            settings.passthrough_env, path_prefix=[toolchain] if toolchain else []
        )
        self.stream = stream or bus.subjects.stream_events
        self._workdirs = settings.work / stage.value
        self.durable = durable or bus.subjects.durable(stage)
        self.filters = list(filters)
        self.policies: tuple[Policy, ...] = tuple(stage_policies() if policies is None else policies)
        self.dead_letter = dead_letter
        #: Log every message's start and end at INFO (a stage's runs); off: at DEBUG (the
        #: aggregator's several events per request, which log what they change themselves).
        self._note = log.info if log_each else log.debug
        self._running: dict[str, asyncio.Task[list[Outgoing]]] = {}
        #: Whether a handler may be stopped alone (:meth:`cancel_running`, by SkipCancelled): then it
        #: runs as a task of its own. Else it is awaited in its message's task (the aggregator: a
        #: task less per event), which a stopping worker still cancels.
        self._cancellable = any(isinstance(policy, SkipCancelled) for policy in self.policies)
        self._cancelled: set[str] = set()
        self._cleanups: set[asyncio.Task[None]] = set()
        #: Messages whose ack waits for their handler's later work (StageContext.ack_after).
        self._acks_owed: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        orphans = await asyncio.to_thread(reap_orphans)
        if orphans:
            log.warning("killed candidate processes left by a dead worker", pids=orphans)
        for policy in self.policies:
            await policy.start(self)
        log.info("worker started", stage=self.stage.value, concurrency=self.concurrency, durable=self.durable)
        try:
            # On stop, do not finish a training that may take hours: the loops are cancelled (the
            # runner kills its process tree) and the message naked, so another worker takes it.
            await consume(self.bus, self.stream, self.durable, self.filters, self._process, stop,
                          concurrency=self.concurrency, device_slots=self.device_slots, what=self.stage.value)
        finally:
            for policy in self.policies:
                await policy.stop()
            if self._cleanups:  # working folders still being deleted
                await asyncio.gather(*self._cleanups, return_exceptions=True)
            log.info("worker stopped", stage=self.stage.value)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait (a while) for the acks still owed (StageContext.ack_after), once whatever they wait
        for is done or given up (the aggregator flushes its lingering writes on stop). A message
        whose ack never went out is redelivered: nothing is lost, only done twice."""
        if self._acks_owed:
            await asyncio.wait(list(self._acks_owed), timeout=timeout_s)

    def cancel_running(self, request_id: str, reason: str) -> None:
        """Kill this worker's running handling of ``request_id``, as a cancel (acked, not retried);
        nothing on a worker without SkipCancelled, whose handlers are not cancelled one by one."""
        task = self._running.get(request_id)
        if task is not None and not task.done():
            with bound(request_id=request_id, stage=self.stage.value):
                log.info("cancelling the running stage", reason=reason)
            self._cancelled.add(request_id)
            task.cancel()

    # ------------------------------------------------------------------ one message

    async def _process(self, msg: Msg, slot: Slot | None = None) -> None:
        delivery = Delivery.of(msg)
        deliveries = delivery.count
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
        with bound(request_id=request_id, stage=self.stage.value):
            for policy in self.policies:
                if await policy.skip(self, request_id, await policy.lookup(self, request_id, delivery)):
                    await msg.ack()
                    return
            await self._handle(msg, event, deliveries, slot)

    async def _handle(self, msg: Msg, event: Any, deliveries: int, slot: Slot | None = None) -> None:
        request_id: str = event.request_id
        ctx = StageContext(
            self.bus, self.stage, request_id, await self.bus.artifacts(), self.runner, deliveries,
            self._workdirs, subject=msg.subject, slot=slot,
        )
        ctx.announcer = functools.partial(self._announce, ctx)
        try:
            await self._handle_in(ctx, msg, event)
        finally:
            # Once the results are out and the message acked, off the event loop, and without
            # holding up this loop's next message (a training's outputs take a while to delete).
            # Handlers make the folder only when they need one: the light messages (the
            # aggregator's events, a pre-check, a judgement) never ask for it, and cost neither a
            # look at the disk nor a thread.
            if ctx.workdir_used and (workdir := ctx.workdir_path).exists():
                task = asyncio.create_task(asyncio.to_thread(_cleanup, workdir))
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)

    async def _handle_in(self, ctx: StageContext, msg: Msg, event: Any) -> None:
        request_id, deliveries = ctx.request_id, ctx.deliveries
        handling: Awaitable[list[Outgoing]] = self.handler(event, ctx)
        if self._cancellable:  # a task of its own, so that a cancel stops it alone
            handling = self._running[request_id] = asyncio.create_task(handling)  # type: ignore[arg-type]
        heartbeat = _Heartbeat(self, msg, ctx)  # its first look announces the start
        returned = False
        try:
            outgoing = await handling
            returned = True
        except asyncio.CancelledError:
            if request_id in self._cancelled:
                # The user cancelled it: the aggregator publishes the verdict; the work is over.
                log.info("stage cancelled by request")
                await msg.ack()
                if ctx.announced:
                    await ctx.progress("failed", message="cancelled")
                return
            # This worker is shutting down: let another one take the message at once.
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
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
            heartbeat.stop()
            if not returned:  # else awaited once the results are out: it can only end, not beat again
                await heartbeat.ended()
        _stamp(outgoing, ctx)
        try:
            # The stored result and the published events go out together, then the ack. Either
            # order is safe: a redelivery finds the stored result and republishes it, or runs the
            # stage again, and the de-duplication ids keep a second copy off the stream.
            # The events are sent first: the next stage waits for them, nobody waits for the store.
            await together(
                *(self._send(out, request_id, behind=n > 0) for n, out in enumerate(outgoing)),
                *(policy.done(ctx, outgoing) for policy in self.policies if policy.acts_on(outgoing)),
            )
            if ctx.acked_after is None:
                await msg.ack()
            else:
                self._ack_when_done(msg, ctx.acked_after, deliveries)
        except Exception:
            log.exception("publishing results failed, will retry")
            with contextlib.suppress(Exception):
                await msg.nak(delay=self._backoff(deliveries))
            return
        finally:
            await heartbeat.ended()
        for policy in self.policies:
            await policy.finished(ctx, outgoing)
        # One line for a quick handling (its start was never announced, nor logged), so it says
        # which delivery of what it was and how long it took.
        self._note("stage finished", **{**ctx.told, "delivery": deliveries, "subject": msg.subject,
                   "seconds": round((datetime.now(UTC) - ctx.started_at).total_seconds(), 3),
                   "published": [o.subject for o in outgoing]})

    def _ack_when_done(self, msg: Msg, written: asyncio.Future[Any], deliveries: int) -> None:
        async def ack() -> None:
            try:
                await written
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await msg.nak()  # stopping: another worker takes it over at once
                raise
            except Exception:
                log.exception("the handler's later work failed, will retry")
                with contextlib.suppress(Exception):
                    await msg.nak(delay=self._backoff(deliveries))
                return
            with contextlib.suppress(Exception):  # a lost ack: the message comes back, done twice
                await msg.ack()

        task = asyncio.create_task(ack())
        self._acks_owed.add(task)
        task.add_done_callback(self._acks_owed.discard)

    async def _send(self, out: Outgoing, request_id: str, *, behind: bool) -> None:
        """Publish one of the handler's events. ``behind``: let the ones before it reach the socket
        before encoding this one (the first is the one the next stage waits for: the benchmark's
        validation result goes before its test result, which only the aggregator reads)."""
        if behind:
            await asyncio.sleep(0)
        await self.bus.publish_payload(out.subject, out.payload, msg_id(request_id, self.stage.value, out.kind))

    def _backoff(self, deliveries: int) -> float:
        steps = self.bus.settings.retry_backoff_s or [1.0]
        return float(steps[min(deliveries - 1, len(steps) - 1)])

    async def _announce(self, ctx: StageContext) -> None:
        """The policies' ``started`` (progress is best effort: the stage runs on if it fails).
        Called once, by :meth:`StageContext.announce`; the start is logged then too."""
        self._note("stage started", delivery=ctx.deliveries, subject=ctx.subject)
        try:
            for policy in self.policies:
                await policy.started(ctx)
        except Exception as exc:
            log.warning("announcing the start failed", error=str(exc))

    async def _dead_letter(self, msg: Msg, reason: str, request_id: str | None, deliveries: int) -> None:
        seq = msg.metadata.sequence.stream if msg.metadata else 0
        with bound(request_id=request_id or "-", stage=self.stage.value):
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


class _Heartbeat:
    """One message's heartbeat while its handler runs: nothing until the handler has run
    ``StageWorker.FIRST_LOOK_S`` (a timer, not a task: most light handlers are over sooner, and a
    task per message that slept and was then cancelled cost each hop a few percent of its CPU), then
    a task that beats: the start's announcement (StageContext.announce) and the policies' first look
    at once, then ``in_progress()`` and a look every
    ``heartbeat_s``, so that ack_wait only expires when the worker is really gone, until :meth:`stop`.

    The beats end on the flag :meth:`stop` clears, not only on the task's cancellation: Python
    3.11's ``asyncio.wait_for`` returns its result instead of raising when a cancel arrives just as
    the result does (nats-py waits for every reply with it), so a cancelled beat can come back as if
    nothing happened, and a loop that waited for its CancelledError would beat, and hold its
    message, for ever."""

    def __init__(self, worker: StageWorker, msg: Msg, ctx: StageContext) -> None:
        settings = worker.bus.settings
        self._interval = min(settings.heartbeat_s, settings.ack_wait_s / 3)
        self._worker, self._msg, self._ctx, self._request_id = worker, msg, ctx, ctx.request_id
        self._beating = True
        self._task: asyncio.Task[None] | None = None
        # The timer's callback runs in this context (contextvars): its beats log the request and stage.
        self._timer = asyncio.get_running_loop().call_later(min(self._interval, worker.FIRST_LOOK_S), self._begin)

    def _begin(self) -> None:
        if self._beating:
            self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        first = True
        while self._beating:
            try:
                if first:
                    await self._ctx.announce()
                else:
                    await self._msg.in_progress()
                for policy in self._worker.policies:
                    if not self._beating:
                        return
                    await policy.beat(self._worker, self._request_id)
            except Exception as exc:  # a lost connection: the next beat may get through
                log.warning("heartbeat failed", error=str(exc))
            first = False
            await asyncio.sleep(self._interval)

    def stop(self) -> None:
        self._beating = False
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()

    async def ended(self) -> None:
        """Once stopped: the beat under way, if any, is over."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _stamp(outgoing: list[Outgoing], ctx: StageContext) -> None:
    """Each result says which handling made it, and when that started (StageRun): the record's
    timeline reads a stage's start and attempts there when the stage was over before it was
    announced. Before the payloads are encoded (Outgoing.payload, once)."""
    for out in outgoing:
        if "run" in type(out.event).model_fields:
            out.event.run = StageRun(started_at=ctx.started_at, attempt=ctx.deliveries)  # type: ignore[attr-defined]


def _cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
