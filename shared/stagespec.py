"""A stage's wiring, declared beside its handler (each ``services/<stage>/`` module's ``SPEC``).

A spec is one row of the pipeline table (``ftbus/stages.py``): what its durable consumer reads
(``consumes``), which events it accepts, what it publishes (``emits``), its handler and how it runs,
and what the rest of the system needs to know of it: its result type (its worker publishes each
result on ``<stage>.completed`` or ``<stage>.failed`` by its ``ok``), its name in the record and the
verdict (``record_name``, under which its results carry its run), how long one run may take
(``timeout``: the only place it is kept), what its NATS user may touch (``grants``) and the stage
that follows it (``next``). The CLI, each consumer's filters and accepted types, the aggregator's
record transitions and sweeper, the judge's view of the stages' runs, the permission generator and
the progress views derive from the table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel

from runners.base import Runner, reap_orphans
from runners.choice import make_runner
from runners.limit import LimitedRunner
from runners.metered import MeteredRunner
from runners.quota import with_quota
from shared.attempts import AttemptLimit
from shared.events import FailedStage, Timeouts
from shared.logs import get_logger
from shared.runtime import Handler, Policy, StageWorker, stage_policies
from shared.settings import Settings
from shared.subjects import Subjects

if TYPE_CHECKING:
    from shared.bus import Bus

log = get_logger("ftbus.stage")

SubjectsOf = Callable[[Subjects], list[str]]
#: What a stage reads, given the whole pipeline (the aggregator reads every stage's results).
ReadsOf = Callable[[Subjects, Sequence["StageSpec"]], list[str]]


@dataclass(frozen=True)
class Grant:
    """One place a stage's NATS user may use beyond what every stage worker gets: ``why`` it does (the
    comment above its rules in deploy/nats/accounts.conf), and whether it also writes there."""

    why: str
    write: bool = True


@dataclass(frozen=True)
class Grants:
    """What a stage's NATS user may touch besides what every stage worker gets (its consumer, its
    results, dead letters, progress, the public view, its own results bucket): ftbus/permissions.py
    writes its rules from these, and denies it every place not granted. Texts may name subjects as
    ``{s.<name>}`` (a :class:`~shared.subjects.Subjects`), filled in for the prefix generated for."""

    #: What its user is, for the comment above it (a stage of ftbus's own says more than its words).
    note: str = ""
    #: The artifacts store (workspaces, data, validation logs).
    artifacts: Grant = Grant("artifacts: read and write")
    #: The trained outputs' store (``ftbus_models``).
    models: Grant | None = None
    #: The training checkpoints' store (``ftbus_checkpoints``: resume state, never for agents).
    checkpoints: Grant | None = None
    #: The private store (test-split logs and baselines).
    private: Grant | None = None
    #: The workers-only cache store (content-addressed caches: whoever writes them is trusted by all).
    cache: Grant | None = None
    #: Why the cache store is denied to it, where that says more than the common reason.
    no_cache: str = ""
    #: The campaigns bucket (validation data only), read and compare-and-set write.
    campaigns: Grant | None = None
    #: The owners' error budgets (shared/owners.py), read and compare-and-set write.
    owners: Grant | None = None


@dataclass(frozen=True)
class StageSpec:
    #: Its name: a :class:`~shared.events.Stage` for ftbus's own stages, any short name for another.
    stage: str
    #: How progress views name it.
    label: str
    #: The events it handles; None: the results of the stages it reads (:meth:`accepted`).
    accepts: tuple[type[BaseModel], ...] | None = None
    #: None for the aggregator, whose handler belongs to its instance.
    handler: Handler | None = None
    #: What its durable consumer reads; None: the results of the stages whose ``next`` it is (and,
    #: with ``judges_failures``, every stage's failures): see :meth:`reads`.
    consumes: ReadsOf | None = None
    #: What it publishes; None: its result's subjects (:meth:`subjects`). A stage that publishes an
    #: event outside its results returns it as an ``Outgoing`` on a subject listed here.
    emits: SubjectsOf | None = None
    #: It reads every stage's failures (the judge).
    judges_failures: bool = False
    #: It runs candidate code: its worker gets the sandbox runner (``make_runner``), and refuses to
    #: start where the sandbox cannot run.
    sandboxed: bool = False
    #: The disk its runs may fill in their working folder (a setting's value), watched by the quota
    #: runner (runners/quota.py); None: not watched.
    disk_quota: Callable[[Settings], int] | None = None
    #: Runs of candidate code one worker makes at once (a setting's value; runners/limit.py), for a
    #: stage that handles more messages at once than it runs programs; None: one per message.
    run_limit: Callable[[Settings], int] | None = None
    #: A service's own entry point (the aggregator's); by default one worker of this spec.
    entry: Callable[[Bus, asyncio.Event, int, Sequence[StageSpec]], Awaitable[None]] | None = None
    #: Messages one worker handles at once unless told otherwise (``stage_concurrency``,
    #: ``--concurrency``): many for a light stage, which mostly waits on the server, one for a
    #: stage that holds a GPU (scale those with workers).
    concurrency: int = 1
    #: Its handler holds a device (a GPU) for part of its work and says when that part is over
    #: (``ctx.device_done()``): ``concurrency`` is then the device slots, and the worker runs two
    #: messages per slot, so that the next one starts as the last one's device work ends instead
    #: of after its uploads (shared/consumer.py).
    device_phase: bool = False
    #: Its workers take requests round-robin across campaigns (shared/lanes.py), with the
    #: ``fair_share`` setting on: a stage where requests wait long enough for the order to matter.
    fair_share: bool = False
    #: Policies its worker runs besides :func:`shared.runtime.stage_policies` and the attempt
    #: count (shared/attempts.py), e.g. the bench worker's warm engine, stopped when the worker stops.
    extra_policies: Callable[[], Sequence[Policy]] = tuple
    # ---- what the rest of the pipeline knows of it
    #: The event it publishes on ``<stage>.completed`` (and ``<stage>.failed``); None: it
    #: publishes no stage result (the aggregator).
    result: type[BaseModel] | None = None
    #: It publishes the candidate's failures there on ``<stage>.failed`` (the judge judges them).
    fails: bool = True
    #: Its name in the record and in a verdict's ``failed_stage`` (the reference evaluator's words).
    record_name: str = FailedStage.aggregate
    #: How messages name it ("ERROR in the data processing stage").
    words: str = ""
    #: What its NATS user may touch (ftbus/permissions.py): by default only the artifacts store.
    grants: Grants = Grants()
    #: How long one run of its candidate code may take (a setting); a request may lower it, never
    #: raise it (``Timeouts``, by record name: :meth:`timeout_in`). The one place a stage's timeout
    #: is kept: its handler asks ``ctx.timeout(context)``, the sweeper :meth:`limit`.
    timeout: Callable[[Settings], float] = lambda settings: settings.data_timeout_s
    #: Runs of candidate code one handling makes one after the other (the bench stage's two splits):
    #: the sweeper waits that many timeouts.
    serial_runs: int = 1
    #: The stage that reads its results when it succeeded; None: the end of the line.
    next: str | None = None

    def timeout_in(self, settings: Settings, timeouts: Timeouts) -> float:
        """One run's limit for a request: the setting, lowered if the request asks (never raised)."""
        setting = self.timeout(settings)
        requested = timeouts.of(self.record_name)
        return min(setting, requested) if requested else setting

    def limit(self, settings: Settings) -> float:
        """How long a request may stay in this stage: its runs one after the other (the sweeper's
        limit, before its grace)."""
        return self.serial_runs * self.timeout(settings)

    def leads_to(self, pipeline: Sequence[StageSpec]) -> list[StageSpec]:
        """The rows whose results it reads in ``pipeline``: those whose ``next`` it is, and with
        ``judges_failures`` every row that fails."""
        return [spec for spec in pipeline if spec.result is not None
                and (spec.next == self.stage or (self.judges_failures and spec.fails))]

    def accepted(self, pipeline: Sequence[StageSpec]) -> tuple[type[BaseModel], ...]:
        """The events its worker decodes: ``accepts``, else the result types of the rows it reads."""
        if self.accepts is not None:
            return self.accepts
        return tuple(dict.fromkeys(spec.result for spec in self.leads_to(pipeline) if spec.result is not None))

    def reads(self, s: Subjects, pipeline: Sequence[StageSpec]) -> list[str]:
        """The subjects its consumer reads, in ``pipeline``."""
        if self.consumes is not None:
            return self.consumes(s, pipeline)
        reads = [s.completed(spec.stage) for spec in pipeline if spec.next == self.stage and spec.result is not None]
        if self.judges_failures:
            reads += [s.failed(spec.stage) for spec in pipeline if spec.result is not None and spec.fails]
        return reads

    def publishes(self, s: Subjects) -> list[str]:
        """The subjects it publishes its events on."""
        return self.emits(s) if self.emits is not None else self.subjects(s)

    def subjects(self, s: Subjects) -> list[str]:
        """Where its results are published: ``<stage>.completed``, and ``<stage>.failed`` if it fails."""
        if self.result is None:
            return []
        return [s.completed(self.stage), *([s.failed(self.stage)] if self.fails else [])]

    def concurrency_in(self, settings: Settings, override: int | None = None) -> int:
        """How many messages a worker of this stage handles at once: ``override`` (``--concurrency``),
        else the ``stage_concurrency`` setting, else the stage's own default."""
        if override is not None:
            return max(1, override)
        return max(1, settings.stage_concurrency.get(self.stage, self.concurrency))

    async def run(self, bus: Bus, stop: asyncio.Event, concurrency: int | None,
                  pipeline: Sequence[StageSpec]) -> None:
        """Run this stage until ``stop`` as a stage of ``pipeline`` (every stage's spec: what this
        one reads follows from it). ``concurrency``: messages handled at once, None for
        :meth:`concurrency_in`'s answer."""
        concurrency = self.concurrency_in(bus.settings, concurrency)
        if self.entry is not None:
            await self.entry(bus, stop, concurrency, pipeline)
            return
        runner = None
        if self.sandboxed:
            # A worker of this host that died left its candidate's processes running: kill them first.
            orphans = await asyncio.to_thread(reap_orphans)
            if orphans:
                log.warning("killed candidate processes left by a dead worker", pids=orphans, stage=self.stage)
            runner = make_runner(bus.settings, self.stage)
        if runner is not None and self.disk_quota is not None:
            settings = bus.settings
            runner = with_quota(runner, max_bytes=self.disk_quota(settings), max_files=settings.run_max_files,
                                poll_s=settings.quota_poll_s)
        if runner is not None and self.run_limit is not None:
            runner = LimitedRunner(runner, self.run_limit(bus.settings))
        if runner is not None:
            runner = MeteredRunner(runner, self.stage)  # its runs counted by how they ended
        await self.worker(bus, pipeline, concurrency=concurrency, runner=runner).run(stop)

    def worker(self, bus: Bus, pipeline: Sequence[StageSpec], *, concurrency: int = 1, runner: Runner | None = None,
               policies: Sequence[Policy] | None = None) -> StageWorker:
        """This stage's worker in ``pipeline``, its consumer filtered on what the stage reads there.
        A stage that runs candidate code must be given its runner (the sandbox: runners/choice.py)."""
        assert self.handler is not None, f"{self.stage} has no plain handler"
        if self.sandboxed and runner is None:
            raise ValueError(f"the {self.stage} stage runs candidate code: give its worker a runner")
        filters = self.reads(bus.subjects, pipeline)
        if not filters:  # a consumer without filters would read every stage's events
            raise ValueError(f"the {self.stage} stage reads nothing in this pipeline: no stage leads to it")
        if policies is None:
            policies = (*stage_policies(), AttemptLimit(), *self.extra_policies())
        slots = concurrency if self.device_phase else None
        return StageWorker(bus, self.stage, self.handler, self.accepted(pipeline),
                           concurrency=2 * concurrency if self.device_phase else concurrency,
                           device_slots=slots, runner=runner, filters=filters, policies=policies, row=self,
                           fair_share=self.fair_share and bus.settings.fair_share)
