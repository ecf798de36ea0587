"""Retention: every stream, bucket and object store the topology creates has the configured limit;
the models store's sweep keeps each leaderboard's best and each campaign's incumbent."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.bus import Bus
from shared.events import Stage
from shared.settings import Settings


async def test_the_topology_applies_the_retention_settings(settings: Settings) -> None:
    day = 86400.0
    cfg = settings.model_copy(update={"event_max_age_s": 2 * day, "artifact_max_age_s": 3 * day,
                                      "cache_max_age_s": 4 * day, "record_max_age_s": 5 * day,
                                      "result_max_age_s": 6 * day})
    bus = await Bus.connect(cfg)
    try:
        await bus.ensure_topology()
        s = bus.subjects

        async def max_age(stream: str) -> float:
            return (await bus.js.stream_info(stream)).config.max_age or 0.0

        assert await max_age(s.stream_events) == 2 * day
        assert await max_age(s.stream_test) == 2 * day
        for stream in (s.stream_verdicts, s.stream_reports, s.stream_dlq):
            assert await max_age(stream) == 6 * day, stream
        for bucket in (s.kv_requests, s.kv_status, *(s.kv_stage_results(stage) for stage in Stage)):
            assert await max_age(f"KV_{bucket}") == 5 * day, bucket
        assert await max_age(f"OBJ_{s.object_store}") == 3 * day
        assert await max_age(f"OBJ_{s.object_store_private}") == 3 * day
        assert await max_age(f"OBJ_{s.object_store_cache}") == 4 * day
        # Trained outputs: no age limit of the server's; the aggregator's sweep expires them.
        assert await max_age(f"OBJ_{s.object_store_models}") == 0.0
    finally:
        await bus.close()

    # A changed setting reaches the streams that exist already.
    changed = cfg.model_copy(update={"result_max_age_s": 7 * day})
    bus = await Bus.connect(changed)
    try:
        await bus.ensure_topology()
        assert (await bus.js.stream_info(bus.subjects.stream_verdicts)).config.max_age == 7 * day
    finally:
        await bus.close()


async def _scored(bus: Bus, rid: str, value: float, submitted: datetime, benchmark: str = "tiny-arith") -> None:
    """A finished request: its record with a completed verdict scoring ``value``, its outputs stored."""
    from shared.events import BenchmarkScores, TaskSpec, Verdict, VerdictResult
    from shared.records import RequestRecord

    scores = BenchmarkScores(primary_metric="exact_match", primary_value=value)
    verdict = Verdict(request_id=rid, status="completed", execution="", return_checking="", code="",
                      final_decision=True, result=VerdictResult(benchmark=scores))
    record = RequestRecord(request_id=rid, status="completed", submitted_at=submitted, verdict=verdict,
                           task=TaskSpec(base_model="tiny-standin", benchmark=benchmark))
    await (await bus.kv(bus.subjects.kv_requests)).put(rid, record.stored_json())
    models = await bus.models_artifacts()
    await models.put_bytes(f"{rid}/output/adapter_model.safetensors", rid.encode())


async def test_the_leaders_outputs_survive_an_age_sweep_that_removes_the_others(settings: Settings) -> None:
    from services.aggregator.retention import Retention
    from services.aggregator.store import RecordStore
    from shared.retention import EXPIRED_MARKER, ExpiredMarker

    cfg = settings.model_copy(update={"artifact_max_age_s": 3600.0})
    bus = await Bus.connect(cfg)
    try:
        await bus.ensure_topology()
        models = await bus.models_artifacts()
        t0 = datetime.now(UTC)
        await _scored(bus, "leader", 0.9, t0)
        await _scored(bus, "second", 0.5, t0 + timedelta(seconds=1))
        await _scored(bus, "other-board", 0.1, t0, benchmark="tiny-sentiment")  # leads its own board
        retention = Retention(bus, RecordStore(bus))
        assert await retention.sweep() == []  # all young: nothing goes
        later = time.time() + 2 * 3600
        assert await retention.sweep(now=later) == ["second"]
        assert await models.stat("leader/output/adapter_model.safetensors") is not None
        assert await models.stat("other-board/output/adapter_model.safetensors") is not None
        assert await models.stat("second/output/adapter_model.safetensors") is None
        marker_ref = await models.stat(f"second/{EXPIRED_MARKER}")
        assert marker_ref is not None
        marker = ExpiredMarker.model_validate_json(await models.get_bytes(marker_ref))
        assert marker.max_age_s == 3600.0 and marker.expired_at.timestamp() == pytest.approx(later)

        # A better candidate replaces the leader, whose outputs then go at the next sweep (its
        # record may be gone by then: its ranking was kept beside its outputs).
        await (await bus.kv(bus.subjects.kv_requests)).delete("leader")
        await _scored(bus, "better", 0.95, t0 + timedelta(seconds=2))
        fresh = Retention(bus, RecordStore(bus))  # another aggregator, knowing nothing yet
        assert await fresh.sweep(now=later) == ["leader"]
        assert await models.stat("better/output/adapter_model.safetensors") is not None
        # Markers go with the verdicts they explain.
        await fresh.sweep(now=later + cfg.result_max_age_s + 3600)
        assert await models.stat(f"second/{EXPIRED_MARKER}") is None
    finally:
        await bus.close()


async def test_a_campaigns_incumbent_survives_the_age_sweep_as_a_leader_does(settings: Settings) -> None:
    """The benchmark stage runs a campaign's incumbent on pool items to confirm the next candidate
    against it (services/benchmark/confirm.py): its outputs stay while it is the incumbent."""
    from services.aggregator.retention import Retention
    from services.aggregator.store import RecordStore
    from shared.campaigns import CampaignRecord, CampaignStore

    cfg = settings.model_copy(update={"artifact_max_age_s": 3600.0})
    bus = await Bus.connect(cfg)
    try:
        await bus.ensure_topology()
        models = await bus.models_artifacts()
        t0 = datetime.now(UTC)
        await _scored(bus, "board-leader", 0.9, t0)
        await _scored(bus, "incumbent", 0.5, t0 + timedelta(seconds=1))
        await _scored(bus, "neither", 0.4, t0 + timedelta(seconds=2))
        await CampaignStore(bus).put(CampaignRecord(name="mine", benchmark="tiny-arith", base_model="tiny-standin",
                                                    incumbent="incumbent"))
        removed = await Retention(bus, RecordStore(bus)).sweep(now=time.time() + 2 * 3600)
        assert removed == ["neither"]
        assert await models.stat("incumbent/output/adapter_model.safetensors") is not None
    finally:
        await bus.close()


async def test_pull_of_an_expired_model_says_it_expired_and_when(settings: Settings, tmp_path: Path) -> None:
    from ftbus.client import Client
    from ftbus.pull import ModelExpired, pull
    from services.aggregator.retention import Retention
    from services.aggregator.store import RecordStore
    from tests.integration.test_pull import publish_trained

    bus = await Bus.connect(settings)
    try:
        await bus.ensure_topology()
        await publish_trained(bus, "old")  # a verdict without a score: it leads nothing
        swept_at = time.time() + settings.artifact_max_age_s + 60
        await Retention(bus, RecordStore(bus)).sweep(now=swept_at)
        async with Client(settings=settings) as client:
            with pytest.raises(ModelExpired) as expired:
                await pull(client, "old", tmp_path / "m")
        when = datetime.fromtimestamp(swept_at, UTC)  # the sweep's own time: no midnight between two clocks
        assert str(expired.value).startswith(f"the trained outputs of old expired on {when:%Y-%m-%d}")
        assert "14 days (artifact_max_age_s)" in str(expired.value)
        assert list(tmp_path.iterdir()) == []
    finally:
        await bus.close()


async def test_the_sweep_removes_the_checkpoints_of_ended_requests_only(settings: Settings) -> None:
    """A killed worker's checkpoints outlive its training: the sweep removes them once the request
    has its verdict (or its record is long gone), never while it may still resume."""
    from services.aggregator.retention import Retention
    from services.aggregator.store import RecordStore
    from shared.records import RequestRecord

    bus = await Bus.connect(settings)
    try:
        await bus.ensure_topology()
        checkpoints = await bus.checkpoint_artifacts()
        records = await bus.kv(bus.subjects.kv_requests)
        for rid, status in (("ended", "completed"), ("running", "running")):
            await records.put(rid, RequestRecord(request_id=rid, status=status).stored_json())  # type: ignore[arg-type]
        for rid in ("ended", "running", "forgotten"):
            await checkpoints.put_bytes(f"{rid}/manifest.json", b"{}")
            await checkpoints.put_bytes(f"{rid}/attempt-1/checkpoint-10/optimizer.pt", b"state")
        retention = Retention(bus, RecordStore(bus))
        assert await retention.sweep_checkpoints(time.time()) == ["ended"]
        assert await checkpoints.stat("ended/manifest.json") is None
        assert await checkpoints.stat("ended/attempt-1/checkpoint-10/optimizer.pt") is None
        assert await checkpoints.stat("running/attempt-1/checkpoint-10/optimizer.pt") is not None
        # No record: kept until the record would have expired anyway.
        assert await checkpoints.stat("forgotten/manifest.json") is not None
        later = time.time() + settings.record_max_age_s + 60
        assert await retention.sweep_checkpoints(later) == ["forgotten"]
        assert await checkpoints.stat("running/manifest.json") is not None
    finally:
        await bus.close()
