"""The benchmark stage's decision: screen the candidate on validation, confirm it on the hidden pool.

After the validation split, the stage calls ``shared.decision.decide`` with the candidate's and the
base model's per-item validation scores, the owner's state (KV ``<prefix>_owners``) and the
benchmark's confirmation pool (evaluation/splits.py: the items between validation and test). The
pool is served on demand: ``decide`` asks for pool items as its betting test goes on, and only then
does the stage run the candidate on them, in jobs that double (64, 128, 256, ... items), so a
confirmation that stops early costs few items and a long one few model loads. The base model is
scored on the whole pool once and cached, as baselines are. Everything about the pool (its runs'
logs, the base model's pool scores, the full decision) goes to the private store, which agents and
the judge cannot read; the validation result carries only the owner's view (``DecisionView``).

In a campaign with an incumbent, the reference is the incumbent, not the base model: the candidate is
screened against the incumbent's validation scores (the campaign record's) and confirmed against the
incumbent's scores on the same pool items, which the stage gets by running the incumbent's trained
outputs (the record names them) on each pool job the candidate runs. Those runs are cached privately
per incumbent and pool range: an owner's candidates start from the same cursor, so the second and
later ones of a campaign find the incumbent's scores there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from evaluation.inference import InferenceConfig
from evaluation.registry import BenchmarkItem, BenchmarkSpec
from evaluation.splits import SplitManifest, pool_batch, pool_order
from shared.artifacts import ArtifactStore
from shared.campaigns import CampaignStore, foreign_owner
from shared.confirmation import BATCH
from shared.decision import CandidateFailedOnPool, Decision, OwnerState, decide, item_outcomes, paired_outcomes
from shared.events import BenchmarkScores, BenchResult, DecisionView, TaskSpec, TrainResult, WorkspaceFile
from shared.handling import Outgoing, StageContext
from shared.logs import get_logger
from shared.owners import SHARED_OWNER, OwnerConflict, OwnerStore

log = get_logger("ftbus.benchmark")

@dataclass(frozen=True)
class Reference:
    """What a candidate is decided against: the base model, or its campaign's incumbent."""

    #: In words: "the base model", "the incumbent <id>".
    name: str
    #: Its validation scores, which the candidate's are paired with.
    scores: BenchmarkScores
    #: The incumbent's request id and trained outputs; None and empty for the base model.
    incumbent: str | None = None
    outputs: list[WorkspaceFile] = field(default_factory=list)


#: Whose run: the candidate's, the base model's, or the campaign incumbent's (its ``Reference``).
Scored = Literal["candidate", "base"] | Reference
#: Scores a manifest's items with one of them; None when the run failed.
ScoreItems = Callable[[SplitManifest, Scored, str], Awaitable[BenchmarkScores | None]]
#: Compare-and-set attempts on the owner's state before the request is retried as an infrastructure error.
OWNER_ATTEMPTS = 20
REFERENCE = "the base model"


class PoolRunFailed(RuntimeError):
    """The base model's pool run failed, or a run left items unscored: the decision cannot be made now
    (an infrastructure error: retried). The candidate's own failed run is CandidateFailedOnPool."""


class StagePool:
    """The confirmation pool of one request, as ``decide`` draws it (shared.decision.Pool).

    ``decide`` runs in a thread and calls :meth:`differences`; each call runs on the stage's event
    loop (``score_items``), the thread waiting for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, order: list[tuple[str, BenchmarkItem]],
                 spec: BenchmarkSpec, max_items: int, score_items: ScoreItems,
                 reference: Reference | None = None, cache: ArtifactStore | None = None,
                 run_key: str = "") -> None:
        self.loop = loop
        self.order = order
        self.spec = spec
        self.max_items = max_items
        self.score_items = score_items
        self.size = len(order)
        self.candidate: dict[int, float] = {}
        #: The reference's pool scores: the base model's (the whole pool, once) or the incumbent's
        #: (the candidate's jobs' items, each job cached in ``cache``).
        self.incumbent = reference if reference is not None and reference.incumbent is not None else None
        self.reference: dict[str, float] | None = None if self.incumbent is None else {}
        self.cache = cache
        self.run_key = run_key
        self.next_job = BATCH

    def differences(self, start: int, stop: int) -> Sequence[float]:
        return asyncio.run_coroutine_threadsafe(self._differences(start, stop), self.loop).result()

    async def _differences(self, start: int, stop: int) -> list[float]:
        stop = min(stop, self.size)
        if self.reference is None:
            whole = pool_batch(self.spec, 0, self.size, self.max_items, self.order)
            self.reference = await self._scores(whole, "base", label="baseline-pool")
        missing = [p for p in range(start, stop) if p not in self.candidate]
        if missing:
            first = missing[0]
            last = min(self.size, max(stop, first + self.next_job))
            self.next_job *= 2
            batch = pool_batch(self.spec, first, last, self.max_items, self.order)
            label = f"pool-{first:05d}-{last:05d}"
            scored = await self._scores(batch, "candidate", label=label)
            for position in range(first, last):
                self.candidate[position] = scored[self._key(position)]
            if self.incumbent is not None:
                self.reference.update(await self._incumbent_scores(batch, f"incumbent-{label}"))
        return [self.candidate[p] - self.reference[self._key(p)] for p in range(start, stop)]

    async def _incumbent_scores(self, manifest: SplitManifest, label: str) -> dict[str, float]:
        """The incumbent on a pool job's items: from the private cache, else run (and cached)."""
        assert self.incumbent is not None and self.incumbent.incumbent is not None
        ids = json.dumps([self.spec.name, self.spec.version, manifest.item_ids, self.run_key], sort_keys=True)
        name = (f"cache/incumbent/{self.incumbent.incumbent}/"
                f"{hashlib.sha256(ids.encode()).hexdigest()}/scores.json")
        ref = await self.cache.stat(name) if self.cache is not None else None
        if ref is not None and self.cache is not None:
            return {k: float(v) for k, v in json.loads(await self.cache.get_bytes(ref)).items()}
        scored = await self._scores(manifest, self.incumbent, label=label)
        if self.cache is not None:
            await self.cache.put_bytes(name, json.dumps(scored, sort_keys=True).encode())
        return scored

    def _key(self, position: int) -> str:
        subset, item = self.order[position]
        return f"{subset}/{item.id}"

    async def _scores(self, manifest: SplitManifest, who: Scored, *,
                      label: str) -> dict[str, float]:
        scores = await self.score_items(manifest, who, label)
        if scores is None and who == "candidate":
            # The candidate ran on validation, so what failed here is its run on hidden items.
            raise CandidateFailedOnPool(f"the candidate's run {label} on the confirmation pool failed")
        if scores is None:
            whose = "the base model's" if who == "base" else f"{who.name}'s"  # type: ignore[union-attr]
            raise PoolRunFailed(f"{whose} run {label} on the confirmation pool failed")
        scored = item_outcomes(scores)
        missing = [k for s, ids in manifest.item_ids.items() for i in ids if (k := f"{s}/{i}") not in scored]
        if missing:
            raise PoolRunFailed(f"the confirmation pool's run {label} scored no {missing[:3]}")
        return scored


def view(decision: Decision, owner: str, level: float | None, reference: Reference) -> DecisionView:
    """What the owner may see: the pool numbers only of a confirmed candidate."""
    confirmed = decision.better
    return DecisionView(
        answer=decision.answer, summary=decision.summary, reference=reference.name, incumbent=reference.incumbent,
        owner=owner, validation_items=decision.validation_items,
        validation_difference=decision.validation_difference,
        screened=decision.screened, level=level if decision.screened else None,
        estimate=decision.estimate if confirmed else None,
        estimate_low=decision.estimate_low if confirmed else None,
        estimate_high=decision.estimate_high if confirmed else None,
        pool_items=decision.pool_items if confirmed else None,
        pool_note=decision.pool_note,
    )


def owner_of(request_owner: str | None) -> str:
    """The identity whose budget a request spends: the submitting NATS identity where the server names
    it, else the one budget every unnamed request shares (so that none escapes it)."""
    return request_owner or SHARED_OWNER


async def reference_for(bus: object, task: TaskSpec, owner: str | None, baseline: BenchmarkScores) -> Reference:
    """The campaign's incumbent where the request names a campaign of its owner's, on the same benchmark
    and base model, whose record names the incumbent's trained outputs; else the base model (the judge
    then compares with the incumbent on validation: docs/judge.md, "Campaigns")."""
    base = Reference(REFERENCE, baseline)
    if task.campaign is None:
        return base
    record = await CampaignStore(bus).get(task.campaign)
    if (record is None or record.incumbent is None or record.incumbent_scores is None or not record.incumbent_outputs
            or (record.benchmark, record.base_model) != (task.benchmark, task.base_model)
            or foreign_owner(record, owner) is not None):
        return base
    return Reference(f"the incumbent {record.incumbent}", record.incumbent_scores, record.incumbent,
                     list(record.incumbent_outputs))


def run_key(device: str, backend: str, inference: InferenceConfig) -> str:
    """What, besides the model and the items, a cached pool run depends on."""
    parts = [device, backend, inference.model_dump(mode="json")]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


async def decide_on_pool(
    *, bus: object, spec: BenchmarkSpec, max_items: int, candidate: BenchmarkScores, reference: Reference,
    owner: str, score_items: ScoreItems, private_put: Callable[[bytes], Awaitable[object]],
    cache: ArtifactStore | None = None, run_key: str = "",
) -> DecisionView:
    """Decide (shared.decision.decide) and record the owner's next state by compare-and-set; a lost
    one decides again at the state as it is now (the pool's scores are kept: nothing runs twice). A
    candidate the validation screen does not pass reads and writes no owner state."""
    cand, ref, strata = paired_outcomes(candidate, reference.scores)
    # The screen and "worse" need no owner state and no pool: a candidate the screen does not pass
    # is decided here, without reading the owner's budget (it spends none of it).
    unscreened = decide(cand, ref, OwnerState(owner=owner), benchmark=spec.name, pool=None, strata=strata,
                        reference_name=reference.name)
    if not unscreened.screened:
        await private_put(unscreened.model_dump_json(indent=1).encode())
        log.info("decided", answer=unscreened.answer, owner=owner, screened=False, reference=reference.name)
        return view(unscreened, owner, None, reference)
    order = await asyncio.to_thread(pool_order, spec, max_items)
    pool = (StagePool(asyncio.get_running_loop(), order, spec, max_items, score_items, reference, cache, run_key)
            if order else None)
    owners = OwnerStore(bus)
    for _ in range(OWNER_ATTEMPTS):
        state, revision = await owners.get(owner)
        level = state.next_level()
        decision = await asyncio.to_thread(decide, cand, ref, state, benchmark=spec.name, pool=pool,
                                           strata=strata, reference_name=reference.name)
        if decision.owner_after != state:
            try:
                await owners.put(decision.owner_after, revision)
            except OwnerConflict:
                log.info("owner_conflict", owner=owner)
                continue
        await private_put(decision.model_dump_json(indent=1).encode())
        log.info("decided", answer=decision.answer, owner=owner, screened=decision.screened,
                 pool_items=decision.pool_items, level=level, pool_failure=decision.pool_failure,
                 reference=reference.name)
        return view(decision, owner, level, reference)
    raise RuntimeError(f"owner {owner}: {OWNER_ATTEMPTS} concurrent confirmations won its state's compare-and-set")


async def with_decision(ctx: StageContext, event: TrainResult, spec: BenchmarkSpec,
                         results: list[BenchResult | Outgoing], score_items: ScoreItems, run_key: str = "",
                         ) -> list[BenchResult | Outgoing]:
    """The validation result with its decision (services/benchmark/confirm.py): better than, not
    distinguishable from, or worse than the base model (or the campaign's incumbent), confirmed on the
    hidden pool."""
    validation = results[0]
    if (not isinstance(validation, BenchResult) or not validation.ok or validation.benchmark is None
            or validation.baseline is None):
        return results
    private = await ctx.bus.private_artifacts()

    async def keep(data: bytes) -> object:
        return await private.put_bytes(f"{event.request_id}/decision.json", data)

    reference = await reference_for(ctx.bus, event.context.task, event.context.owner, validation.baseline.baseline)
    try:
        decision = await decide_on_pool(
            bus=ctx.bus, spec=spec, max_items=spec.max_items(ctx.settings.bench_max_items),
            candidate=validation.benchmark, reference=reference, owner=owner_of(event.context.owner),
            score_items=score_items, private_put=keep, cache=private, run_key=run_key)
    except ValueError as exc:
        # Validation scores that cannot be paired: the verdict says why, nothing is called better.
        log.warning("no decision", error=str(exc))
        return results
    return [validation.model_copy(update={"decision": decision}), *results[1:]]
