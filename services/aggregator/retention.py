"""The models store's retention: trained outputs expire ``artifact_max_age_s`` after training,
except the best candidate of each leaderboard (per base model and benchmark) and each campaign's
incumbent, kept until a better one replaces it.

The models store has no age limit of the server's (it could not tell a leader from the rest): this
sweep, every ``retention_sweep_s``, lists the store's objects (metadata only), ranks each request
whose outputs are still there (``<id>/ranking.json``, written once from its record when its verdict
is out, so that a leader's place outlives its record), and removes the outputs of every request
past the age limit that leads no board and is no campaign's incumbent, leaving ``<id>/expired.json``
(when, and why) for `ftbus pull` to report. A leader's outputs are never removed, so the leaders are
always among the requests whose outputs remain: no other state is needed. Markers themselves go after
``result_max_age_s``, with the verdicts they explain.

The same pass removes training checkpoints (the checkpoints store, services/trainer/checkpoints.py)
of every request that has ended (its record is terminal), or whose record is gone and whose
checkpoints are older than ``record_max_age_s``: the trainer removes them itself when a training
ends, so these are a killed worker's leftovers or a request that never reached its verdict.

Several aggregators may sweep at once: every step is a delete or a write of the same content.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import UTC, datetime

from services.aggregator.store import RecordStore
from services.aggregator.sweeper import periodically
from shared.artifacts import ArtifactStore
from shared.bus import Bus
from shared.campaigns import CampaignStore
from shared.logs import get_logger
from shared.retention import EXPIRED_MARKER, RANKING, ExpiredMarker, Ranking, leaders

log = get_logger("ftbus.aggregator")


class Retention:
    def __init__(self, bus: Bus, store: RecordStore) -> None:
        self.bus = bus
        self.store = store
        #: Rankings read or written so far (they never change once written).
        self._rankings: dict[str, Ranking] = {}

    async def run(self, stop: asyncio.Event) -> None:
        await periodically(self.bus.settings.retention_sweep_s, stop, self.sweep, "retention sweep failed")

    async def sweep(self, now: float | None = None) -> list[str]:
        """One pass; the requests whose outputs it removed."""
        now = time.time() if now is None else now
        settings = self.bus.settings
        models = await self.bus.models_artifacts()
        objects: dict[str, dict[str, float]] = defaultdict(dict)
        for name, mtime in await models.list_objects():  # type: ignore[attr-defined]
            rid, _, rest = name.partition("/")
            objects[rid][rest] = mtime
        live = {rid: files for rid, files in objects.items() if any(f.startswith("output/") for f in files)}
        rankings = [r for rid, files in live.items() if (r := await self._ranking(models, rid, files)) is not None]
        # Every leaderboard's leader, and every campaign's incumbent: the benchmark stage runs an
        # incumbent on the confirmation pool's items to confirm the campaign's next candidates.
        kept = set(leaders(rankings).values()) | {r.incumbent for r in await CampaignStore(self.bus).records()
                                                   if r.incumbent is not None}
        removed = []
        for rid, files in live.items():
            trained = max(mtime for f, mtime in files.items() if f.startswith("output/"))
            if now - trained <= settings.artifact_max_age_s or rid in kept:
                continue
            marker = ExpiredMarker(expired_at=datetime.fromtimestamp(now, UTC),
                                   trained_at=datetime.fromtimestamp(trained, UTC),
                                   max_age_s=settings.artifact_max_age_s)
            # The marker first: a pull between the two sees the reason, never a bare absence.
            await models.put_bytes(f"{rid}/{EXPIRED_MARKER}", marker.model_dump_json().encode())
            for f in files:
                if f != EXPIRED_MARKER:
                    await models.delete(f"{rid}/{f}")
            self._rankings.pop(rid, None)
            removed.append(rid)
        for rid, files in objects.items():
            marked = files.get(EXPIRED_MARKER)
            if rid not in live and marked is not None and now - marked > settings.result_max_age_s:
                await models.delete(f"{rid}/{EXPIRED_MARKER}")
        if removed:
            log.info("trained outputs expired", requests=len(removed), kept=len(kept))
        await self.sweep_checkpoints(now)
        return removed

    async def sweep_checkpoints(self, now: float) -> list[str]:
        """Remove the checkpoints of requests that ended; the requests whose checkpoints it removed."""
        store = await self.bus.checkpoint_artifacts()
        objects: dict[str, dict[str, float]] = defaultdict(dict)
        for name, mtime in await store.list_objects():  # type: ignore[attr-defined]
            rid, _, rest = name.partition("/")
            objects[rid][rest] = mtime
        removed = []
        for rid, files in objects.items():
            try:
                record = await self.store.get(rid)
            except ValueError:  # not a request's record: not ours to judge
                continue
            ended = record.terminal if record is not None else (
                now - max(files.values()) > self.bus.settings.record_max_age_s)
            if not ended:
                continue
            for f in sorted(files, key=lambda f: f != "manifest.json"):  # the manifest first
                await store.delete(f"{rid}/{f}")
            removed.append(rid)
        if removed:
            log.info("training checkpoints removed", requests=len(removed))
        return removed

    async def _ranking(self, models: ArtifactStore, rid: str, files: dict[str, float]) -> Ranking | None:
        if rid in self._rankings:
            return self._rankings[rid]
        ranking = None
        if RANKING in files:
            ref = await models.stat(f"{rid}/{RANKING}")
            if ref is not None:
                ranking = Ranking.model_validate_json(await models.get_bytes(ref))
        else:
            ranking = await self._rank_from_record(rid)
            if ranking is not None:
                await models.put_bytes(f"{rid}/{RANKING}", ranking.model_dump_json().encode())
        if ranking is not None:
            self._rankings[rid] = ranking
        return ranking

    async def _rank_from_record(self, rid: str) -> Ranking | None:
        """From the request's record once its verdict is out; None before (or when the record is gone)."""
        record = await self.store.get(rid)
        if record is None or record.verdict is None or record.task is None:
            return None
        bench = record.verdict.result.benchmark
        scored = record.verdict.status == "completed" and bench is not None
        return Ranking(
            request_id=rid, base_model=record.task.base_model, benchmark=record.task.benchmark,
            primary_metric=bench.primary_metric if bench else None,
            higher_is_better=bench.higher_is_better if bench else True,
            value=bench.primary_value if scored and bench else None,
            submitted_at=record.submitted_at,
        )
