"""Retention: every stream, bucket and object store the topology creates has the configured limit."""

from __future__ import annotations

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
