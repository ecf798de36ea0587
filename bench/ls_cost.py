"""Listing requests (`ftbus ls`, `Client.requests()`) with many of them on the server.

The public status bucket keeps a view of every request for ``record_max_age_s`` (30 days), so a
busy team's `ftbus ls` reads thousands of them. This fills the bucket on a real nats-server with
``--requests`` public views (finished requests, each with its five stages' timings) and measures
the listing's wall time two ways:

- the way it reads now: every key's latest value in one pass (shared/kv_scan.py ``latest``);
- the way it read before: a key listing, then a read of each view, one round trip each.

    .venv/bin/python bench/ls_cost.py [--requests 5000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import emit, median, stdout_to_stderr  # noqa: E402


def finished_view(rid: str) -> bytes:
    from shared.events import Progress, Stage, TaskSpec, utcnow
    from shared.records import RequestStatusView, StageTiming

    now = utcnow()
    timing = StageTiming(started_at=now, finished_at=now, ok=True, attempts=1)
    view = RequestStatusView(
        request_id=rid, status="completed", stage="judge",
        task=TaskSpec(base_model="Qwen/Qwen2.5-0.5B", benchmark="gsm8k"), submitted_at=now, updated_at=now,
        stages={stage.value: timing for stage in Stage if stage != Stage.aggregate},
        progress=Progress(request_id=rid, stage=Stage.judge, state="finished", message="judge_result"),
        final_decision=True,
    )
    return view.model_dump_json().encode()


async def _wall_ms(step: Callable[[], Awaitable[Any]], runs: int = 3) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = await step()
        times.append((time.perf_counter() - start) * 1000)
    return median(times), result


async def measure(requests: int, root: Path) -> list[dict[str, object]]:
    from ftbus.client import Client
    from ftbus.embedded import EmbeddedServer
    from shared.bus import Bus
    from shared.kv_scan import list_keys
    from shared.records import RequestStatusView
    from shared.settings import Settings

    server = EmbeddedServer(root / "nats", log_file=root / "nats-server.log")
    url = server.start()
    settings = Settings(home=root / "home", nats_url=url, log_level="WARNING")
    bus = await Bus.connect(settings, name="bench-ls")
    try:
        await bus.ensure_topology()
        kv = await bus.kv(bus.subjects.kv_status)
        size = len(finished_view("r0"))
        batch = 200
        for start in range(0, requests, batch):
            await asyncio.gather(*(kv.put(f"20261201-000000-{n:08x}", finished_view(f"20261201-000000-{n:08x}"))
                                   for n in range(start, min(requests, start + batch))))
        print(f"bucket: {requests} public views ({size} bytes each)", file=sys.stderr)

        async def one_read_each() -> list[RequestStatusView]:
            views = []
            for key in await list_keys(bus.js, bus.subjects.kv_status):
                entry = await kv.get(key)
                views.append(RequestStatusView.model_validate_json(entry.value or b""))
            return views

        async with Client(settings=settings) as client:
            now_ms, listed = await _wall_ms(client.requests)
        before_ms, read = await _wall_ms(one_read_each)
        assert len(listed) == len(read) == requests, (len(listed), len(read))
    finally:
        await bus.close()
        server.stop()

    what = f"`ftbus ls`, {requests:,} requests on the server"
    return [
        {"measure": f"{what}: one pass over the bucket (median of 3)", "value": f"{now_ms:.0f} ms",
         "target": None, "met": None},
        {"measure": f"{what}: a read per request, as before (median of 3)", "value": f"{before_ms:.0f} ms",
         "target": None, "met": None},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="public views in the bucket")
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftbus-ls-") as tmp, stdout_to_stderr():
        rows = asyncio.run(measure(args.requests, Path(tmp)))
    emit(rows, args.json, "listing requests")


if __name__ == "__main__":
    main()
