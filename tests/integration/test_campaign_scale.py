"""Issue 50, item 5: one owner's campaign of 100,000 candidates on a real nats-server. The record keeps
its counts and its last RECENT_ENTRIES entries, so it stays one size; every judged candidate's entry
is a key of its own, which a redelivered judgement still finds; `ftbus campaign NAME` reads the one
record, and the dashboard's read of every campaign passes over the entries.

The 100,000 entries are written directly (core publishes on the bucket's subjects), not judged one by
one: the count is the point, not the judge's speed.
"""

from __future__ import annotations

import asyncio
import json

from shared.bus import Bus
from shared.campaigns import RECENT_ENTRIES, CampaignEntry, CampaignRecord, CampaignStore, entry_key, record_after
from shared.events import CampaignCheck, TaskSpec
from shared.kv_scan import latest
from shared.online_testing import OnlineState
from shared.settings import Settings
from tests.integration.test_delivery import run_ftbus

CANDIDATES = 100_000
NAME = "big-search"
#: A hang guard for the server to store the entries, not a timing: a quiet machine takes seconds.
STORE_GUARD_S = 300.0


def entry(i: int) -> CampaignEntry:
    return CampaignEntry(request_id=f"r{i:06d}", index=i, level=1e-9, accepted=i % 5_000 == 0,
                         summary=f"not distinguishable from the incumbent (candidate {i})")


async def test_a_campaign_of_100000_candidates_keeps_one_record_of_one_size(bus: Bus, settings: Settings) -> None:
    await bus.ensure_topology()
    bucket = bus.subjects.kv_campaigns
    stream = f"KV_{bucket}"
    before = (await bus.js.stream_info(stream)).state.messages
    entries = [entry(i) for i in range(1, CANDIDATES + 1)]
    for i, e in enumerate(entries):
        await bus.nc.publish(f"$KV.{bucket}.{entry_key(NAME, e.request_id)}", e.model_dump_json().encode())
        if i % 5_000 == 0:
            await bus.nc.flush()
    await bus.nc.flush()
    async with asyncio.timeout(STORE_GUARD_S):
        while (await bus.js.stream_info(stream)).state.messages < before + CANDIDATES:
            await asyncio.sleep(0.2)  # waiting on the server's own count, not for a time

    accepted = [e for e in entries if e.accepted]
    record = CampaignRecord(name=NAME, benchmark="tiny-arith", base_model="tiny-standin", owner=None,
                            state=OnlineState(tests=CANDIDATES), incumbent=accepted[-1].request_id,
                            history=entries[-RECENT_ENTRIES:], accepted_history=accepted[-RECENT_ENTRIES:],
                            judged=CANDIDATES, accepted=len(accepted))
    store = CampaignStore(bus)
    stored = await store.put(record)
    size = len(stored.model_dump_json())

    # The 100,001st candidate, judged and written by compare-and-set as the judge writes it.
    task = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", campaign=NAME)
    check = CampaignCheck(campaign=NAME, index=CANDIDATES + 1, level=1e-9, alpha=0.05, procedure=record.procedure,
                          incumbent=record.incumbent, summary="not distinguishable from the incumbent")
    read = await store.get(NAME)
    assert read is not None and read.judged == CANDIDATES
    after = await store.put(record_after(read, "r100001", task, check, None))
    assert after.judged == CANDIDATES + 1 and len(after.history) == RECENT_ENTRIES
    assert abs(len(after.model_dump_json()) - size) < 1_000  # one entry in, the oldest one out
    assert size < 64_000, size  # far below the server's 1 MB, whatever the count

    # An entry from long ago: not in the record, found under its own key (a redelivery's lookup).
    old = await store.entry(after, "r000017")
    assert old is not None and old.index == 17
    assert await store.entry(after, "r999999") is None

    # `ftbus campaign NAME --json`, the real executable: the one record, its counts and its window.
    code, out, err = await run_ftbus(settings, "campaign", NAME, "--json")
    assert code == 0, err[-3000:]
    shown = json.loads(out)
    assert (shown["judged"], shown["accepted"], len(shown["history"])) == (CANDIDATES + 1, 20, RECENT_ENTRIES)
    assert shown["history"][-1]["request_id"] == "r100001" and shown["incumbent"] == "r100000"
    code, out, err = await run_ftbus(settings, "campaign", NAME)
    assert code == 0, err[-3000:]
    assert f"{CANDIDATES + 1} judged, the last {RECENT_ENTRIES} shown" in " ".join(out.split())

    # The dashboard's read of every campaign: the records (one-token keys) alone, not 100,000 entries.
    records = await latest(bus.js, bucket, keys="*")
    assert [change.key for change in records] == [NAME]
