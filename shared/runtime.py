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
- handler returns         -> its results routed by the stage's row: each on ``<stage>.completed`` or
                             ``<stage>.failed`` by its ``ok``, stamped with the stage's run under its
                             record name (and ``failed_stage`` when the handler named none); stored
                             under (request_id, stage), published with
                             ``Nats-Msg-Id = <request_id>:<stage>:<kind>``, then ack. A candidate's
                             failure is such a result: published and acked, never retried;
- handler raises          -> an infrastructure error: nak with backoff, up to ``max_deliver``
                             attempts: counted by a stage's worker (shared/attempts.py), else by the
                             server, whose MAX_DELIVERIES advisory reaches the aggregator.

While a handler runs, ``in_progress()`` is sent every ``heartbeat_s`` so that ack_wait only
expires when the worker is really gone, and the message then goes to another worker.

What a handler is given and returns is shared/handling.py; what happens around it (the stored
result, cancels, progress), shared/policies.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from pydantic import BaseModel

from runners.base import Runner
from shared import codec
from shared.bus import Bus
from shared.consumer import UNLIMITED, Slot, consume
from shared.events import DeadLetter, StageRun
from shared.handling import Handler, Outgoing, StageContext
from shared.lanes import Lanes
from shared.logs import bound, get_logger
from shared.policies import (
    AnnounceProgress,
    IdempotencyStore,
    Policy,
    SkipCancelled,
    is_cancelled,
    stage_policies,
)
from shared.subjects import msg_id
from shared.tasks import cancel_until_done

if TYPE_CHECKING:
    from shared.stagespec import StageSpec

#: Importable from here as before the split (shared/handling.py, shared/policies.py).
__all__ = [
    "AnnounceProgress",
    "Handler",
    "IdempotencyStore",
    "Outgoing",
    "Policy",
    "SkipCancelled",
    "StageContext",
    "StageWorker",
    "always_dead_letter",
    "is_cancelled",
    "never_dead_letter",
    "route",
    "stage_policies",
]

log = get_logger("ftbus.runtime")


def _deliveries(msg: Msg) -> int:
    """1 on the first delivery of ``msg`` to this consumer, more on each redelivery."""
    try:
        return int(msg.metadata.num_delivered)
    except Exception:  # not a JetStream message (nats-py raises on a plain reply subject)
        return 1


#: Whether this consumer dead-letters an unreadable message on ``subject``: None to do it, or the
#: reason it does not (logged; the message is then terminated).
DeadLetterRule = Callable[[str], "str | None"]


def always_dead_letter(subject: str) -> str | None:
    return None


def never_dead_letter(subject: str) -> str | None:
    return "a dead letter that cannot be read is dropped (it would loop back to the dead-letter stream)"


# ---------------------------------------------------------------------------- the worker


class StageWorker:
    """Consumes one stage's messages (``concurrency`` at a time in this process) with its handler.

    ``runner``: what runs candidate code (the sandbox: runners/choice.py), None for a stage
    that runs none. ``row``: the stage's row of the pipeline table, which names its results' record
    and timeout (:meth:`StageSpec.worker` gives it); without one, the stage's name stands in.
    ``policies`` say what happens around the handler (default: :func:`stage_policies`);
    ``dead_letter`` says which unreadable messages this consumer dead-letters (default: all).
    ``fair_share``: take messages round-robin across campaigns (shared/lanes.py), not in arrival order.
    """

    def __init__(
        self,
        bus: Bus,
        stage: str,
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
        row: StageSpec | None = None,
        fair_share: bool = False,
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
        self.row = row
        #: Its stage's lanes, where a fair-share stage's requests wait by campaign; None: arrival order.
        self.lanes = Lanes(bus, stage) if fair_share else None
        if fair_share and not any(policy.counts_attempts for policy in self.policies):
            # A lane's consumer delivers without limit (the server's count would end a request with
            # no advisory the aggregator reads): the attempt count is what ends it.
            raise ValueError(f"{stage}: a fair-share worker needs a policy that counts attempts (AttemptLimit)")
        #: Log every message's start and end at INFO (a stage's runs); off: at DEBUG (the
        #: aggregator's several events per request, which log what they change themselves).
        self._note = log.info if log_each else log.debug
        self._running: dict[str, asyncio.Task[Sequence[BaseModel | Outgoing]]] = {}
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
            if self.lanes is not None:  # fair share: round-robin across campaigns (shared/lanes.py)
                await self.lanes.run(stop, self.durable, self.filters, self._process, concurrency=self.concurrency,
                                     device_slots=self.device_slots, what=self.stage)
            else:
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
            attempt = next((n for policy in self.policies if (n := policy.attempt(request_id))), 0)
            ctx = StageContext(
                self.bus, self.stage, request_id, await self.bus.artifacts(), self.runner, deliveries,
                self._workdirs, subject=msg.subject, slot=slot, row=self.row, attempt=attempt,
            )
            try:
                await self._handle(ctx, msg, event)
            finally:
                for policy in self.policies:
                    policy.ended(ctx)
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
            returned = await handling
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
            for policy in self.policies:
                await policy.cancelled(ctx)
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
        outgoing = [route(item, event, ctx) for item in returned]
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


def route(item: BaseModel | Outgoing, incoming: Any, ctx: StageContext) -> Outgoing:
    """Where one of a handler's events goes (the handler read ``incoming``): a result on
    ``<stage>.completed``, or on ``<stage>.failed`` when it says the candidate failed (``ok``); an
    :class:`Outgoing` where it says. Before its payload is encoded (Outgoing.payload, once), a result
    is stamped: the stage's record name as ``failed_stage`` if it failed and the handler named no
    other, and its run under that name beside the earlier stages' (StageRun), so that the record's
    timeline holds a stage's start and attempts even when its progress messages (at most once) were
    lost, and the judge reads every stage's run without naming the stages."""
    event = _stamped(item.event if isinstance(item, Outgoing) else item, incoming, ctx)
    if isinstance(item, Outgoing):
        return dataclasses.replace(item, event=event)
    ok = getattr(event, "ok", True)
    s = ctx.subjects
    return Outgoing(s.completed(ctx.stage) if ok else s.failed(ctx.stage), event, "completed" if ok else "failed")


def _stamped(event: BaseModel, incoming: Any, ctx: StageContext) -> BaseModel:
    fields = type(event).model_fields
    if "runs" not in fields:
        return event
    run = StageRun(started_at=ctx.started_at, attempt=ctx.attempt, outcome=getattr(event, "outcome", None))
    update: dict[str, Any] = {"runs": {**getattr(incoming, "runs", {}), ctx.record_name: run}}
    if "ok" in fields and not event.ok and getattr(event, "failed_stage", None) is None:
        update["failed_stage"] = ctx.record_name
    return event.model_copy(update=update)


def _cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
