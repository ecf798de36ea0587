"""The aggregator: the only stateful service.

It keeps one record per request in the requests KV bucket, updated from every stage event
(status, stage, timings, progress), publishes the verdict (no test results) when the judge is
done, and the report (with them) when the hidden test split is in as well. Dead letters, the
server's MAX_DELIVERIES advisories, cancellations and stuck requests become error or cancelled
verdicts naming the stage.

Each event is one compare-and-set of its request's record (services/aggregator/store.py), then the
record's public view, then the outbox (the verdict and report it owes, published and then marked:
services/aggregator/outbox.py), then the ack. A crash anywhere redelivers the event, and the
sweeper (services/aggregator/sweeper.py) finishes what no event will come back for: any number of
aggregator workers, crashing at any point, publish exactly one verdict per request (the verdict
stream's one-message-per-subject rule enforces it a second time).

What it knows of the stages comes from the pipeline table (ftbus/stages.py), given to it at start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from services.aggregator import transitions as t
from services.aggregator.advisories import follow_advisories
from services.aggregator.outbox import Outbox
from services.aggregator.retention import Retention
from services.aggregator.store import RecordStore
from services.aggregator.sweeper import Sweeper
from shared import codec, metrics
from shared.bus import Bus
from shared.events import (
    BenchResult,
    CancelRequested,
    DeadLetter,
    EvalRequested,
    JudgeResult,
    Progress,
    Stage,
    StageResult,
)
from shared.logs import get_logger
from shared.policies import MetricsPolicy
from shared.records import RequestRecord
from shared.runtime import Outgoing, StageContext, StageWorker, always_dead_letter, never_dead_letter
from shared.stagespec import StageSpec
from shared.tasks import cancel_until_done

log = get_logger("ftbus.aggregator")



class Aggregator:
    def __init__(self, bus: Bus, pipeline: Sequence[StageSpec], *, concurrency: int = 1) -> None:
        self.bus = bus
        self.s = bus.subjects
        self.concurrency = concurrency
        #: The pipeline's rows, by stage name.
        self.pipeline = tuple(pipeline)
        self.rows: dict[str, StageSpec] = {spec.stage: spec for spec in pipeline}
        #: Whose result each subject carries: a stage's completed and failed subjects.
        self._results: dict[str, StageSpec] = {
            subject: spec for spec in pipeline for subject in spec.subjects(self.s)
        }
        #: The stage that judges every failure (the one whose result is the judge's).
        self.judge = next((spec.stage for spec in pipeline if spec.result is JudgeResult), Stage.judge)
        self.store = RecordStore(bus)
        self.outbox = Outbox(bus, self.store)
        self.sweeper = Sweeper(bus, self.store, self.apply, self.rows)
        self.retention = Retention(bus, self.store)

    def accepts(self) -> tuple[type, ...]:
        """What its event consumer reads: the request, cancels and every stage's result."""
        results = [spec.result for spec in self.rows.values() if spec.result is not None]
        return (EvalRequested, CancelRequested, *dict.fromkeys(results))

    # ------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event) -> None:
        s = self.s
        durable = s.durable(Stage.aggregate)
        # Three consumers, one handler, no stage policies but the metrics: the aggregator must see
        # cancelled requests, and it stores and announces nothing. Each consumer's concurrency follows its
        # stream's traffic: about five events a request, one test-split result, and a dead letter
        # now and then.
        consumers = [
            (s.stream_events, durable, s.event_stream_subjects(list(self.rows)), self.accepts(),
             self._dead_letters_here, self.concurrency),
            (s.stream_test, f"{durable}-test", [s.bench_test], (BenchResult,), always_dead_letter,
             max(1, self.concurrency // 4)),
            (s.stream_dlq, f"{durable}-dlq", [s.dlq], (DeadLetter,), never_dead_letter, min(2, self.concurrency)),
        ]
        workers = [
            StageWorker(self.bus, Stage.aggregate, self.on_event, accepts, concurrency=loops,
                        stream=stream, durable=name, filters=filters, policies=(MetricsPolicy(),),
                        dead_letter=rule, log_each=False)
            for stream, name, filters, accepts, rule, loops in consumers
        ]
        progress_sub = await self.bus.nc.subscribe(s.progress())
        # Follows until the others stop (then it is cancelled: its subscription has no end of its own).
        progress = asyncio.create_task(self._follow_progress(progress_sub))
        tasks = [
            *(asyncio.create_task(worker.run(stop)) for worker in workers),
            asyncio.create_task(follow_advisories(self.bus, stop)),
            asyncio.create_task(self.sweeper.run(stop)),
            asyncio.create_task(self.retention.run(stop)),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_until_done([*tasks, progress])
            with contextlib.suppress(Exception):
                await progress_sub.unsubscribe()

    def _dead_letters_here(self, subject: str) -> str | None:
        """None when no stage worker consumes ``subject``, so that the aggregator must dead-letter it.

        An unreadable event bound for a stage is dead-lettered by that stage's workers, naming that
        stage; were the aggregator to do it too, the two letters would race to name the stage of
        the error verdict. The aggregator dead-letters only what it alone reads (judge results,
        cancels, subjects nobody consumes).
        """
        reader = next((spec for spec in self.rows.values()
                       if spec.stage != Stage.aggregate and subject in spec.reads(self.s, self.pipeline)), None)
        return None if reader is None else f"the {reader.stage} stage dead-letters it"

    # ------------------------------------------------------------------ events

    async def on_event(self, event: Any, ctx: StageContext) -> list[Outgoing]:
        rid = event.request_id
        change = self._transition(event, ctx.subject)
        if change is None:
            log.warning("ignoring an event on a subject where it does not belong",
                        event_type=type(event).__name__, subject=ctx.subject, request_id=rid)
            return []
        if isinstance(event, DeadLetter):
            metrics.dead_letter(event.stage)
        if rid is None:  # a dead letter whose request could not be read
            log.warning("dead letter without a readable request id", reason=event.reason)
            return []
        await self.apply(rid, change)
        return []

    def _transition(self, event: Any, subject: str) -> t.Transition | None:
        """What ``event`` does to its record; None when it is not believed: an event counts only on
        its own subject (a JudgeResult published on data.completed is the data stage's dead letter,
        not a verdict)."""
        s = self.s
        if isinstance(event, EvalRequested) and s.is_request(subject):
            return lambda r: t.on_request(r, event)
        if isinstance(event, CancelRequested) and subject == s.cancel:
            return lambda r: t.on_cancel(r, event, self.rows.get(r.stage or ""))
        if isinstance(event, DeadLetter) and subject == s.dlq:
            return lambda r: t.on_dead_letter(r, event, self.rows.get(event.stage or r.stage or ""))
        if isinstance(event, BenchResult) and event.split == "test":
            return (lambda r: t.on_test(r, event)) if subject == s.bench_test else None
        row = self._results.get(subject)
        if row is None or type(event) is not row.result:
            return None
        if isinstance(event, JudgeResult):
            return lambda r: t.on_judge(r, event, row)
        assert isinstance(event, StageResult)
        return lambda r: t.on_stage_result(r, event, row, self.judge)

    async def apply(self, request_id: str, change: t.Transition, *, create: bool = True) -> RequestRecord | None:
        """Apply ``change`` to the record (one compare-and-set), write its public view, then publish
        what it owes. The final view goes before the verdict: whoever has the verdict then finds it
        in `ftbus status`. A change that changed nothing still publishes what is owed (a
        redelivery after a crash between the write and the publishing)."""
        async with self.store.hold(request_id):
            record, changed = await self.store.update(request_id, change, create=create)
            if record is None:
                return None
            if changed or t.owed(record):
                await self.store.put_view(record)
            return await self.outbox.deliver(record)

    async def _follow_progress(self, subscription: Any) -> None:
        """Write each stage's running progress into its record, one after the other. Progress
        travels as core messages (at most once): nobody waits for its write, and one lost (a write
        that fails, or messages the subscription dropped while the writes lagged) is no loss: the
        next one, or the stage's result, writes what it said."""
        async for msg in subscription.messages:
            try:
                event = codec.decode(msg.data, Progress)
            except codec.CodecError:
                continue
            if event.state not in ("running", "retrying"):
                # A handling's start and end are for watchers (`ftbus watch`, the dashboard's live
                # views): the record takes a stage's start from its first progress of its own (every
                # stage that runs a while reports one as its work begins) or from its result
                # (StageRun), and its end from its result.
                continue
            await self._write_progress(event)

    async def _write_progress(self, event: Progress) -> None:
        try:
            await self.apply(event.request_id, lambda r: t.on_progress(r, event), create=False)
        except Exception as exc:
            log.warning("progress not written; the stage's next event writes the record",
                        request_id=event.request_id, error=str(exc))
