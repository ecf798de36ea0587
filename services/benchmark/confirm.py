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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from evaluation.registry import BenchmarkItem, BenchmarkSpec
from evaluation.splits import SplitManifest, pool_batch, pool_order
from shared.confirmation import BATCH
from shared.decision import CandidateFailedOnPool, Decision, OwnerState, decide
from shared.events import BenchmarkScores, BenchResult, DecisionView, TrainResult
from shared.handling import Outgoing, StageContext
from shared.logs import get_logger
from shared.owners import SHARED_OWNER, OwnerConflict, OwnerStore

log = get_logger("ftbus.benchmark")

#: Scores a manifest's items with the candidate (``base=False``) or the base model; None when the run failed.
ScoreItems = Callable[[SplitManifest, bool, str], Awaitable[BenchmarkScores | None]]
#: Compare-and-set attempts on the owner's state before the request is retried as an infrastructure error.
OWNER_ATTEMPTS = 20
REFERENCE = "the base model"


class PoolRunFailed(RuntimeError):
    """The base model's pool run failed, or a run left items unscored: the decision cannot be made now
    (an infrastructure error: retried). The candidate's own failed run is CandidateFailedOnPool."""


def item_scores(scores: BenchmarkScores) -> dict[str, float]:
    """``<subset>/<item>`` -> the item's mean score, higher better (a lower-is-better metric flipped)."""
    means = scores.item_means()
    return means if scores.higher_is_better else {k: 1.0 - v for k, v in means.items()}


class StagePool:
    """The confirmation pool of one request, as ``decide`` draws it (shared.decision.Pool).

    ``decide`` runs in a thread and calls :meth:`differences`; each call runs on the stage's event
    loop (``score_items``), the thread waiting for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, order: list[tuple[str, BenchmarkItem]],
                 spec: BenchmarkSpec, max_items: int, score_items: ScoreItems) -> None:
        self.loop = loop
        self.order = order
        self.spec = spec
        self.max_items = max_items
        self.score_items = score_items
        self.size = len(order)
        self.candidate: dict[int, float] = {}
        self.base: dict[str, float] | None = None
        self.next_job = BATCH

    def differences(self, start: int, stop: int) -> Sequence[float]:
        return asyncio.run_coroutine_threadsafe(self._differences(start, stop), self.loop).result()

    async def _differences(self, start: int, stop: int) -> list[float]:
        stop = min(stop, self.size)
        if self.base is None:
            whole = pool_batch(self.spec, 0, self.size, self.max_items, self.order)
            self.base = await self._scores(whole, base=True, label="baseline-pool")
        missing = [p for p in range(start, stop) if p not in self.candidate]
        if missing:
            first = missing[0]
            last = min(self.size, max(stop, first + self.next_job))
            self.next_job *= 2
            scored = await self._scores(pool_batch(self.spec, first, last, self.max_items, self.order),
                                        base=False, label=f"pool-{first:05d}-{last:05d}")
            for position in range(first, last):
                self.candidate[position] = scored[self._key(position)]
        return [self.candidate[p] - self.base[self._key(p)] for p in range(start, stop)]

    def _key(self, position: int) -> str:
        subset, item = self.order[position]
        return f"{subset}/{item.id}"

    async def _scores(self, manifest: SplitManifest, *, base: bool, label: str) -> dict[str, float]:
        scores = await self.score_items(manifest, base, label)
        if scores is None and not base:
            # The candidate ran on validation, so what failed here is its run on hidden items.
            raise CandidateFailedOnPool(f"the candidate's run {label} on the confirmation pool failed")
        if scores is None:
            raise PoolRunFailed(f"the base model's run {label} on the confirmation pool failed")
        scored = item_scores(scores)
        missing = [k for s, ids in manifest.item_ids.items() for i in ids if (k := f"{s}/{i}") not in scored]
        if missing:
            raise PoolRunFailed(f"the confirmation pool's run {label} scored no {missing[:3]}")
        return scored


def view(decision: Decision, owner: str, level: float | None) -> DecisionView:
    """What the owner may see: the pool numbers only of a confirmed candidate."""
    confirmed = decision.better
    return DecisionView(
        answer=decision.answer, summary=decision.summary, reference=REFERENCE, owner=owner,
        validation_items=decision.validation_items, validation_difference=decision.validation_difference,
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


async def decide_on_pool(
    *, bus: object, spec: BenchmarkSpec, max_items: int, candidate: BenchmarkScores, baseline: BenchmarkScores,
    owner: str, score_items: ScoreItems, private_put: Callable[[bytes], Awaitable[object]],
) -> DecisionView:
    """Decide (shared.decision.decide) and record the owner's next state by compare-and-set; a lost
    one decides again at the state as it is now (the pool's scores are kept: nothing runs twice). A
    candidate the validation screen does not pass reads and writes no owner state."""
    cand, base = item_scores(candidate), item_scores(baseline)
    common = sorted(cand.keys() & base.keys())
    cand, base = {k: cand[k] for k in common}, {k: base[k] for k in common}
    strata = {k: k.split("/", 1)[0] for k in common}
    # The screen and "worse" need no owner state and no pool: a candidate the screen does not pass
    # is decided here, without reading the owner's budget (it spends none of it).
    unscreened = decide(cand, base, OwnerState(owner=owner), benchmark=spec.name, pool=None, strata=strata,
                        reference_name=REFERENCE)
    if not unscreened.screened:
        await private_put(unscreened.model_dump_json(indent=1).encode())
        log.info("decided", answer=unscreened.answer, owner=owner, screened=False)
        return view(unscreened, owner, None)
    order = await asyncio.to_thread(pool_order, spec, max_items)
    pool = StagePool(asyncio.get_running_loop(), order, spec, max_items, score_items) if order else None
    owners = OwnerStore(bus)
    for _ in range(OWNER_ATTEMPTS):
        state, revision = await owners.get(owner)
        level = state.next_level()
        decision = await asyncio.to_thread(decide, cand, base, state, benchmark=spec.name, pool=pool,
                                           strata=strata, reference_name=REFERENCE)
        if decision.owner_after != state:
            try:
                await owners.put(decision.owner_after, revision)
            except OwnerConflict:
                log.info("owner_conflict", owner=owner)
                continue
        await private_put(decision.model_dump_json(indent=1).encode())
        log.info("decided", answer=decision.answer, owner=owner, screened=decision.screened,
                 pool_items=decision.pool_items, level=level, pool_failure=decision.pool_failure)
        return view(decision, owner, level)
    raise RuntimeError(f"owner {owner}: {OWNER_ATTEMPTS} concurrent confirmations won its state's compare-and-set")


async def with_decision(ctx: StageContext, event: TrainResult, spec: BenchmarkSpec,
                         results: list[BenchResult | Outgoing], score_items: ScoreItems,
                         ) -> list[BenchResult | Outgoing]:
    """The validation result with its decision (services/benchmark/confirm.py): better than, not
    distinguishable from, or worse than the base model, confirmed on the hidden pool."""
    validation = results[0]
    if (not isinstance(validation, BenchResult) or not validation.ok or validation.benchmark is None
            or validation.baseline is None):
        return results
    private = await ctx.bus.private_artifacts()

    async def keep(data: bytes) -> object:
        return await private.put_bytes(f"{event.request_id}/decision.json", data)

    try:
        decision = await decide_on_pool(
            bus=ctx.bus, spec=spec, max_items=spec.max_items(ctx.settings.bench_max_items),
            candidate=validation.benchmark, baseline=validation.baseline.baseline, owner=owner_of(event.context.owner),
            score_items=score_items, private_put=keep)
    except ValueError as exc:
        # Validation scores that cannot be paired: the verdict says why, nothing is called better.
        log.warning("no decision", error=str(exc))
        return results
    return [validation.model_copy(update={"decision": decision}), *results[1:]]
