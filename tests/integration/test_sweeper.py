"""The aggregator's sweeper on a real nats-server: it reads the records still open, never the
finished ones the bucket keeps for a month, and it still ends stuck requests and publishes what a
crash left unpublished (services/aggregator/open_records.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ftbus.stages import BY_STAGE, PIPELINE
from services.aggregator.open_records import OpenRecords
from services.aggregator.service import Aggregator
from services.aggregator.verdicts import build_report, cancelled_verdict
from shared import codec
from shared.bus import Bus
from shared.events import Stage, utcnow
from shared.records import RequestRecord, RequestStatusView


def finished(rid: str) -> RequestRecord:
    record = RequestRecord(request_id=rid, status="cancelled", stage="data")
    record.verdict = cancelled_verdict(record, "test", BY_STAGE[Stage.data])
    record.verdict_published = record.report_published = True
    return record


def stuck(rid: str) -> RequestRecord:
    """A request in its data stage that nothing has touched for two days."""
    return RequestRecord(request_id=rid, status="running", stage="data", updated_at=utcnow() - timedelta(days=2))


async def test_the_sweep_reads_open_records_only_and_still_ends_what_it_must(bus: Bus) -> None:
    aggregator = Aggregator(bus, PIPELINE)
    records = await aggregator.store.bucket()
    s = bus.subjects
    for n in range(40):
        await records.create(f"done{n}", finished(f"done{n}").stored_json())
    await records.create("stuck", stuck("stuck").stored_json())
    await records.create("stuck-too", stuck("stuck-too").stored_json())
    unpublished = RequestRecord(request_id="unpublished", status="cancelled", stage="train")
    unpublished.verdict = cancelled_verdict(unpublished, "asked", BY_STAGE[Stage.train])
    unpublished.report = build_report(unpublished)  # claimed and written, then the aggregator died
    await records.create("unpublished", unpublished.stored_json())

    verdicts: list[str] = []

    async def on_verdict(msg: Any) -> None:
        verdicts.append(codec.decode(msg.data).request_id)

    sub = await bus.nc.subscribe(s.verdict(), cb=on_verdict)
    read: list[str] = []
    get = aggregator.store.get

    async def counted_get(request_id: str) -> Any:
        read.append(request_id)
        return await get(request_id)

    aggregator.store.get = counted_get  # type: ignore[method-assign]

    await aggregator.sweeper.sweep()
    assert sorted(set(read)) == ["stuck", "stuck-too", "unpublished"], "the sweep read finished records"
    await bus.nc.flush()
    for rid in ("stuck", "stuck-too"):
        record = await get(rid)
        assert record is not None and record.status == "error" and record.verdict_published
        assert "the request was stuck" in (record.verdict.execution if record.verdict else "")
    record = await get("unpublished")
    assert record is not None and record.verdict_published and record.report_published
    view = RequestStatusView.model_validate_json((await (await bus.kv(s.kv_status)).get("unpublished")).value)
    assert view.status == "cancelled" and view.revision > 0, "a crash's lost final view is written"
    assert sorted(verdicts) == ["stuck", "stuck-too", "unpublished"]

    # Nothing open is left: the next sweep reads only what was written since, and no record.
    read.clear()
    await aggregator.sweeper.sweep()
    assert read == []
    await sub.unsubscribe()


async def test_open_records_follow_each_keys_latest_write(bus: Bus) -> None:
    aggregator = Aggregator(bus, PIPELINE)
    records = await aggregator.store.bucket()
    bucket = bus.subjects.kv_requests
    tracker = OpenRecords(bus.js, bucket)
    assert await tracker.refresh() == [] and tracker.last_read == 0, "an empty bucket"
    await records.create("a", stuck("a").stored_json())
    revision = await records.create("b", stuck("b").stored_json())
    assert sorted(await tracker.refresh()) == ["a", "b"]
    await records.update("b", finished("b").stored_json(), revision)
    await records.create("c", stuck("c").stored_json())
    assert sorted(await tracker.refresh()) == ["a", "c"]
    assert tracker.last_read == 2, "a refresh reads only the writes since the last one"
    assert sorted(await tracker.refresh()) == ["a", "c"] and tracker.last_read == 0
    # A fresh tracker (an aggregator that starts) reads every key's latest write once.
    fresh = OpenRecords(bus.js, bucket)
    assert sorted(await fresh.refresh()) == ["a", "c"] and fresh.last_read == 3
