"""A stage's wiring, declared beside its handler (each ``services/<stage>/`` module's ``SPEC``).

What its durable consumer reads (``consumes``), which events it accepts, what it publishes
(``emits``), its handler, and how it runs. The pipeline (``ftbus/stages.py``) is the list of these:
the CLI's stages, each consumer's subject filters and the progress views' order and labels are all
derived from it, not kept elsewhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel

from shared.events import Stage
from shared.quota import with_quota
from shared.runner import Runner
from shared.runtime import Handler, Policy, StageWorker, stage_policies
from shared.settings import Settings
from shared.stage_runner import make_runner
from shared.subjects import Subjects

if TYPE_CHECKING:
    import asyncio

    from shared.bus import Bus

SubjectsOf = Callable[[Subjects], list[str]]


@dataclass(frozen=True)
class StageSpec:
    stage: Stage
    #: How progress views name it.
    label: str
    consumes: SubjectsOf
    accepts: tuple[type[BaseModel], ...]
    emits: SubjectsOf
    #: None for the aggregator, whose handler belongs to its instance.
    handler: Handler | None
    #: It runs candidate code: its worker gets the sandbox runner (``make_runner``), and refuses to
    #: start where the sandbox cannot run.
    sandboxed: bool = False
    #: The disk its runs may fill in their working folder (a setting's value), watched by the quota
    #: runner (shared/quota.py); None: not watched.
    disk_quota: Callable[[Settings], int] | None = None
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
    #: Policies its worker runs besides :func:`shared.runtime.stage_policies` (e.g. the bench
    #: worker's warm engine, stopped when the worker stops).
    extra_policies: Callable[[], Sequence[Policy]] = tuple

    def concurrency_in(self, settings: Settings, override: int | None = None) -> int:
        """How many messages a worker of this stage handles at once: ``override`` (``--concurrency``),
        else the ``stage_concurrency`` setting, else the stage's own default."""
        if override is not None:
            return max(1, override)
        return max(1, settings.stage_concurrency.get(self.stage.value, self.concurrency))

    async def run(self, bus: Bus, stop: asyncio.Event, concurrency: int | None = None,
                  pipeline: Sequence[StageSpec] = ()) -> None:
        """Run this stage until ``stop``; ``pipeline`` is every stage's spec (the aggregator reads it).
        ``concurrency``: messages handled at once, None for :meth:`concurrency_in`'s answer."""
        concurrency = self.concurrency_in(bus.settings, concurrency)
        if self.entry is not None:
            await self.entry(bus, stop, concurrency, pipeline)
            return
        runner = make_runner(bus.settings, self.stage.value) if self.sandboxed else None
        if runner is not None and self.disk_quota is not None:
            settings = bus.settings
            runner = with_quota(runner, max_bytes=self.disk_quota(settings), max_files=settings.run_max_files,
                                poll_s=settings.quota_poll_s)
        await self.worker(bus, concurrency=concurrency, runner=runner).run(stop)

    def worker(self, bus: Bus, *, concurrency: int = 1, runner: Runner | None = None,
               policies: Sequence[Policy] | None = None) -> StageWorker:
        """This stage's worker, its consumer filtered on what the stage consumes."""
        assert self.handler is not None, f"{self.stage.value} has no plain handler"
        if policies is None:
            policies = (*stage_policies(), *self.extra_policies())
        slots = concurrency if self.device_phase else None
        return StageWorker(bus, self.stage, self.handler, self.accepts,
                           concurrency=2 * concurrency if self.device_phase else concurrency,
                           device_slots=slots, runner=runner, filters=self.consumes(bus.subjects), policies=policies)
