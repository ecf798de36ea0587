"""ensure_topology on a live server: idempotent, follows changed settings, refuses what it cannot change."""

from __future__ import annotations

from unittest import mock

import pytest
from nats.js import api

from shared.bus import Bus
from shared.settings import Settings
from shared.streams import TopologyMismatch


async def test_a_second_worker_changes_nothing_and_a_changed_setting_is_applied(settings: Settings) -> None:
    bus = await Bus.connect(settings)
    try:
        await bus.ensure_topology()
        with mock.patch.object(bus.js, "update_stream", wraps=bus.js.update_stream) as update:
            await bus.ensure_topology()  # what every worker does at start: no change, no update
            assert update.await_count == 0
        changed = settings.model_copy(update={"event_max_age_s": settings.event_max_age_s / 2,
                                              "duplicate_window_s": 120.0})
        bus.settings = changed
        await bus.ensure_topology()
        info = await bus.js.stream_info(bus.subjects.stream_events)
        assert abs(info.config.max_age - changed.event_max_age_s) <= 1
        assert abs(info.config.duplicate_window - 120.0) <= 1
    finally:
        await bus.close()


async def test_a_stream_that_cannot_be_changed_in_place_is_an_error_not_ignored(settings: Settings) -> None:
    bus = await Bus.connect(settings)
    try:
        s = bus.subjects
        # An older deployment made the DLQ stream in memory; file storage cannot be switched in place.
        await bus.js.add_stream(api.StreamConfig(name=s.stream_dlq, subjects=[s.dlq], storage=api.StorageType.MEMORY))
        with pytest.raises(TopologyMismatch, match="storage is memory, configured file"):
            await bus.ensure_topology()
    finally:
        await bus.js.delete_stream(bus.subjects.stream_dlq)
        await bus.close()


async def test_only_a_missing_bucket_is_created(settings: Settings) -> None:
    bus = await Bus.connect(settings)
    try:
        kv = await bus.kv(f"{settings.subject_prefix}_probe")  # missing: created
        await kv.put("k", b"v")
        with mock.patch.object(bus.js, "key_value", side_effect=TimeoutError("nats: timeout")), \
                mock.patch.object(bus.js, "create_key_value") as create:
            bus._kv.clear()
            with pytest.raises(TimeoutError):
                await bus.kv(f"{settings.subject_prefix}_other")
            assert create.await_count == 0  # a timeout is not a missing bucket
    finally:
        await bus.close()


async def test_the_deployment_init_steps_create_then_find_the_topology(settings: Settings) -> None:
    """What the k8s topology job and each worker's init container run (deploy/k8s/)."""
    from ftbus import topology

    assert await topology.wait(settings, attempts=1, every_s=0) is False  # nothing yet: a worker waits
    await topology.create(settings)
    await topology.create(settings)  # idempotent: a re-run job does no harm
    assert await topology.wait(settings, attempts=1, every_s=0) is True
