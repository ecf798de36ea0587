"""The stage worker runtime: how every service consumes its events (DESIGN.md, "Delivery rules").

One durable pull consumer per stage, shared by every worker of that stage (the server balances
the load). For each message:

- undecodable or invalid  -> a DeadLetter on ``ftbus.dlq`` (with the request id when readable), term();
- cancelled request       -> ack, nothing published;
- already done (redelivery after a crash between store and ack) -> republish the stored result, ack;
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
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import nats
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from pydantic import BaseModel

from shared import codec
from shared.artifacts import ArtifactStore
from shared.bus import Bus
from shared.events import CancelRequested, DeadLetter, Progress, Stage
from shared.logs import bound, get_logger
from shared.records import RequestStatusView
from shared.retry import retry_transient
from shared.runner import LocalRunner, Runner, reap_orphans
from shared.settings import Settings
from shared.subjects import Subjects, msg_id

log = get_logger("ftbus.runtime")


@dataclass(frozen=True)
class Outgoing:
    """One event a handler wants published. ``kind`` completes its de-duplication id."""

    subject: str
    event: BaseModel
    kind: str


@dataclass
class StageContext:
    bus: Bus
    stage: Stage
    request_id: str
    artifacts: ArtifactStore
    runner: Runner
    deliveries: int
    workdir: Path
    subject: str = ""

    @property
    def settings(self) -> Settings:
        return self.bus.settings

    @property
    def subjects(self) -> Subjects:
        return self.bus.subjects

    async def progress(self, state: str = "running", **fields: Any) -> None:
        event = Progress(request_id=self.request_id, stage=self.stage, state=state, **fields)  # type: ignore[arg-type]
        await self.bus.publish_core(self.subjects.progress(self.request_id), event)


Handler = Callable[[Any, StageContext], Awaitable[list[Outgoing]]]


def _stage_key(request_id: str, stage: Stage) -> str:
    return f"{request_id}.{stage.value}"


class StageWorker:
    """Runs ``concurrency`` message loops of one stage in this process.

    ``remember_results``: store what the handler published, for idempotent redelivery.
    ``skip_cancelled``: skip cancelled requests and kill a running one on cancel (stages; not the
    aggregator, which must record the cancel). ``announce``: publish started/finished progress.
    ``dead_letter_undecodable``: dead-letter unreadable messages (or decide per subject).
    """

    def __init__(
        self,
        bus: Bus,
        stage: Stage,
        handler: Handler,
        expected: tuple[type[BaseModel], ...],
        *,
        concurrency: int = 1,
        runner: Runner | None = None,
        stream: str | None = None,
        durable: str | None = None,
        filters: Sequence[str] | None = None,
        remember_results: bool = True,
        skip_cancelled: bool = True,
        announce: bool = True,
        dead_letter_undecodable: bool | Callable[[str], bool] = True,
    ) -> None:
        self.bus = bus
        self.stage = stage
        self.handler = handler
        self.expected = expected
        self.concurrency = max(1, concurrency)
        settings = bus.settings
        toolchain = settings.toolchain_path()
        self.runner = runner or LocalRunner(
            settings.passthrough_env, path_prefix=[toolchain] if toolchain else []
        )
        self.stream = stream or bus.subjects.stream_events
        self.durable = durable or bus.subjects.durable(stage)
        self.filters = list(filters or bus.subjects.stage_filters(stage))
        self.remember_results = remember_results
        self.skip_cancelled = skip_cancelled
        self.announce = announce
        self.dead_letter_undecodable = dead_letter_undecodable
        self._running: dict[str, asyncio.Task[list[Outgoing]]] = {}
        self._cancelled: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        orphans = await asyncio.to_thread(reap_orphans)
        if orphans:
            log.warning("killed candidate processes left by a dead worker", pids=orphans)
        await retry_transient(lambda: self.bus.ensure_consumer(self.stream, self.durable, self.filters), self.durable)
        # Stages kill a cancelled request's work; the aggregator must not: it has to record the cancel.
        cancel_sub = (
            await self.bus.nc.subscribe(self.bus.subjects.cancel, cb=self._on_cancel) if self.skip_cancelled else None
        )
        log.info("worker started", stage=self.stage.value, concurrency=self.concurrency, durable=self.durable)
        loops = [asyncio.create_task(self._loop(stop, i)) for i in range(self.concurrency)]
        stopping = asyncio.create_task(stop.wait())
        try:
            # On stop, do not finish a training that may take hours: cancel it (the runner kills
            # its process tree) and nak the message, so another worker takes it over at once.
            done, _ = await asyncio.wait([*loops, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping and task.exception():
                    raise task.exception()  # type: ignore[misc]
        finally:
            stopping.cancel()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if cancel_sub is not None:
                with contextlib.suppress(Exception):
                    await cancel_sub.unsubscribe()
            log.info("worker stopped", stage=self.stage.value)

    async def _loop(self, stop: asyncio.Event, index: int) -> None:
        psub = await self.bus.js.pull_subscribe_bind(self.durable, self.stream)
        try:
            while not stop.is_set():
                try:
                    msgs = await psub.fetch(1, timeout=2)
                except nats.errors.TimeoutError:
                    continue  # nothing to do: normal control flow
                except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                    await asyncio.sleep(1)
                    continue
                except Exception as exc:
                    log.warning("fetch failed", stage=self.stage.value, error=str(exc))
                    await asyncio.sleep(1)
                    continue
                for msg in msgs:
                    await self._process(msg, stop)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    # ------------------------------------------------------------------ one message

    async def _process(self, msg: Msg, stop: asyncio.Event) -> None:
        deliveries = msg.metadata.num_delivered if msg.metadata else 1
        try:
            event = codec.decode(msg.data, self.expected)
        except codec.CodecError as err:
            # A callable decides by subject: a consumer that reads another stage's input leaves
            # the dead letter (and the stage it names) to that stage's own workers.
            dead_letter = self.dead_letter_undecodable
            if callable(dead_letter):
                dead_letter = dead_letter(msg.subject)
            if dead_letter:
                await self._dead_letter(msg, err.reason, err.request_id, deliveries)
            elif callable(self.dead_letter_undecodable):
                log.info("unreadable message, dead-lettered by its stage", reason=err.reason, subject=msg.subject)
                await msg.term()
            else:
                log.error("dropping an unreadable message", reason=err.reason, subject=msg.subject)
                await msg.term()
            return
        request_id: str = event.request_id
        with bound(request_id=request_id, stage=self.stage.value):
            if self.skip_cancelled and await self._is_cancelled(request_id):
                log.info("request was cancelled, skipping")
                await msg.ack()
                return
            if self.remember_results and await self._republish_stored(request_id):
                log.info("stage already done, republished its stored result")
                await msg.ack()
                return
            await self._handle(msg, event, deliveries, stop)

    async def _handle(self, msg: Msg, event: Any, deliveries: int, stop: asyncio.Event) -> None:
        request_id: str = event.request_id
        artifacts = await self.bus.artifacts()
        workdir = self.bus.settings.work / self.stage.value / f"{request_id}-{deliveries}"
        ctx = StageContext(
            self.bus, self.stage, request_id, artifacts, self.runner, deliveries, workdir, subject=msg.subject
        )
        log.info("stage started", delivery=deliveries, subject=msg.subject)
        if self.announce:
            await ctx.progress("started", message=f"attempt {deliveries}")
        heartbeat = asyncio.create_task(self._heartbeat(msg, request_id))
        task = asyncio.create_task(self.handler(event, ctx))
        self._running[request_id] = task
        try:
            outgoing = await task
        except asyncio.CancelledError:
            if request_id in self._cancelled:
                # The user cancelled it: the aggregator publishes the verdict; the work is over.
                log.info("stage cancelled by request")
                await msg.ack()
                await ctx.progress("failed", message="cancelled")
                return
            # This worker is shutting down: let another one take the message at once.
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        except Exception as exc:
            delay = self._backoff(deliveries)
            log.exception("infrastructure error, will retry", delay_s=delay, delivery=deliveries)
            if self.announce:
                await ctx.progress("retrying", message=f"{type(exc).__name__}: {exc}"[:500])
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay)
            return
        finally:
            self._running.pop(request_id, None)
            self._cancelled.discard(request_id)
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            _cleanup(workdir)
        try:
            if self.remember_results:
                await self._store(request_id, outgoing)
            for out in outgoing:
                await self.bus.publish(out.subject, out.event, msg_id(request_id, self.stage.value, out.kind))
            await msg.ack()
        except Exception:
            log.exception("publishing results failed, will retry")
            with contextlib.suppress(Exception):
                await msg.nak(delay=self._backoff(deliveries))
            return
        if self.announce:
            ok = all(not out.kind.endswith("failed") for out in outgoing)
            await ctx.progress("finished" if ok else "failed", message=", ".join(o.kind for o in outgoing))
            log.info("stage finished", published=[o.subject for o in outgoing])

    def _backoff(self, deliveries: int) -> float:
        steps = self.bus.settings.retry_backoff_s or [1.0]
        return float(steps[min(deliveries - 1, len(steps) - 1)])

    async def _heartbeat(self, msg: Msg, request_id: str) -> None:
        interval = min(self.bus.settings.heartbeat_s, self.bus.settings.ack_wait_s / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                await msg.in_progress()
                # A cancel is a core NATS message: one sent while this worker was cut off (a node
                # failover, a SIGSTOP) never arrives. The status record keeps it: look there too.
                if self.skip_cancelled and await self._is_cancelled(request_id):
                    self._cancel_running(request_id, "cancelled (seen in the status record)")
            except Exception as exc:  # a lost connection: the next beat may get through
                log.warning("heartbeat failed", error=str(exc))

    # ------------------------------------------------------------------ helpers

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

    async def _is_cancelled(self, request_id: str) -> bool:
        kv = await self.bus.kv(self.bus.subjects.kv_status)
        try:
            entry = await kv.get(request_id)
        except KeyNotFoundError:
            return False
        if not entry.value:
            return False
        view = RequestStatusView.model_validate_json(entry.value)
        return view.cancel_requested or view.status == "cancelled"

    async def _store(self, request_id: str, outgoing: list[Outgoing]) -> None:
        kv = await self.bus.kv(self.bus.subjects.kv_stage_results(self.stage))
        packed = msgpack.packb([[o.subject, o.kind, codec.encode(o.event)] for o in outgoing], use_bin_type=True)
        await kv.put(_stage_key(request_id, self.stage), packed)

    async def _republish_stored(self, request_id: str) -> bool:
        kv = await self.bus.kv(self.bus.subjects.kv_stage_results(self.stage))
        try:
            entry = await kv.get(_stage_key(request_id, self.stage))
        except KeyNotFoundError:
            return False
        if not entry.value:
            return False
        for subject, kind, payload in msgpack.unpackb(entry.value, raw=False):
            event = codec.decode(payload)
            await self.bus.publish(subject, event, msg_id(request_id, self.stage.value, kind))
        return True

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            event = codec.decode(msg.data, CancelRequested)
        except codec.CodecError:
            return  # the aggregator dead-letters bad control messages
        self._cancel_running(event.request_id, event.reason)

    def _cancel_running(self, request_id: str, reason: str) -> None:
        task = self._running.get(request_id)
        if task is not None and not task.done():
            with bound(request_id=request_id, stage=self.stage.value):
                log.info("cancelling the running stage", reason=reason)
            self._cancelled.add(request_id)
            task.cancel()


def _cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
