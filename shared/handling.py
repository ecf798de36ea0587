"""What a stage's handler is given and returns: its context for one message, and what it publishes.

A handler takes the event and a :class:`StageContext`, and returns its results: plain events of its
stage's result type, which the worker publishes on ``<stage>.completed`` or ``<stage>.failed`` by
their ``ok`` (shared/runtime.py), plus an :class:`Outgoing` for any event outside its results.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from runners.base import Runner
from shared import codec
from shared.artifacts import ArtifactStore
from shared.bus import Bus
from shared.consumer import Slot
from shared.events import Progress, RequestContext
from shared.settings import Settings
from shared.subjects import Subjects

if TYPE_CHECKING:
    from shared.stagespec import StageSpec


@dataclass(frozen=True)
class Outgoing:
    """One event published on a subject of its own: the stage's worker makes one of each result its
    handler returns (``<stage>.completed`` or ``<stage>.failed``), and a handler returns one itself
    for an event outside its results (the bench stage's test split on ``bench.test``: it must be
    among its spec's ``emits``). ``kind`` completes its de-duplication id."""

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
    stage: str
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
    #: The stage's row of the pipeline table (its record name, its timeout); None for a worker
    #: built without one (the aggregator's consumers).
    row: StageSpec | None = None
    #: Which handling of the request at this stage this is (1 for the first), as the attempts record
    #: counts them (shared/attempts.py): a delivery that never reached a handler, or met a live
    #: attempt, takes no number. 0 when given: the delivery count stands in (a worker that leaves
    #: the count to the server).
    attempt: int = 0

    def __post_init__(self) -> None:
        self.attempt = self.attempt or self.deliveries

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

    @property
    def record_name(self) -> str:
        """The stage's name in records and verdicts (its row's ``record_name``)."""
        return self.row.record_name if self.row is not None else self.stage

    def timeout(self, context: RequestContext) -> float:
        """How long one run of this stage's candidate code may take for this request: its row's
        timeout, lowered by the request if it asks (``StageSpec.timeout_in``)."""
        if self.row is None:
            raise ValueError(f"the {self.stage} worker has no row of the pipeline table, so no timeout")
        return self.row.timeout_in(self.settings, context.timeouts)

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
        event = Progress(request_id=self.request_id, stage=self.stage, state=state, attempt=self.attempt,  # type: ignore[arg-type]
                         **fields)
        await self.bus.publish_core(self.subjects.progress(self.request_id), event)


#: A handler: the event and its context in, the events to publish out (results, and Outgoing extras).
Handler = Callable[[Any, StageContext], Awaitable[Sequence[BaseModel | Outgoing]]]
