"""Reading a small artifact (a config, a log): ftbus's store against nats-py's own get().

The stages read several small objects per request (the workspace's files, the judge's config and
logs). nats-py's ``ObjectStore.get`` reads every object through an ordered consumer, created for
the read and kept by the server for minutes after it; ``ObjectStoreArtifacts.get_bytes`` reads an
object of one chunk with two message gets (shared/object_artifacts.py). This measures, per read of a
1.5 KB object on a real nats-server: this process's CPU, the server's CPU, the wall time, and the
consumers left on the store's stream afterwards.

    .venv/bin/python bench/artifact_reads.py [--reads 300] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import emit, process_cpu_s, stdout_to_stderr  # noqa: E402


async def measure(reads: int, root: Path) -> list[dict[str, object]]:
    from ftbus.embedded import EmbeddedServer
    from shared.bus import Bus
    from shared.object_artifacts import ObjectStoreArtifacts
    from shared.settings import Settings

    server = EmbeddedServer(root / "nats", log_file=root / "nats-server.log")
    url = server.start()
    bus = await Bus.connect(Settings(home=root / "home", nats_url=url, log_level="WARNING"), name="bench-reads")
    rows: list[dict[str, object]] = []
    try:
        store = await ObjectStoreArtifacts.open(bus.js, "bench_reads")
        raw = await bus.js.object_store("bench_reads")
        ref = await store.put_bytes("req/train.yaml", os.urandom(1500))

        async def nats_py_get() -> None:
            await raw.get(ref.name)

        async def ftbus_get() -> None:
            await store.get_bytes(ref)

        ways: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("nats-py get() (an ordered consumer per read)", nats_py_get),
            ("ftbus get_bytes (two message gets)", ftbus_get),
        ]
        for what, read in ways:
            before = (await bus.js.stream_info("OBJ_bench_reads")).state.consumer_count
            own, srv, wall = time.process_time(), process_cpu_s(server.pid), time.perf_counter()
            for _ in range(reads):
                await read()
            own_ms = (time.process_time() - own) / reads * 1000
            srv_ms = (process_cpu_s(server.pid) - srv) / reads * 1000
            wall_ms = (time.perf_counter() - wall) / reads * 1000
            left = (await bus.js.stream_info("OBJ_bench_reads")).state.consumer_count - before
            rows.append({"measure": f"read of a 1.5 KB artifact, {what}",
                         "value": f"{own_ms:.2f} ms client + {srv_ms:.2f} ms server CPU, {wall_ms:.2f} ms wall; "
                                  f"{left} consumers left on the server by {reads} reads",
                         "target": None, "met": None})
    finally:
        await bus.close()
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=300, help="reads each way")
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftbus-reads-") as tmp, stdout_to_stderr():
        rows = asyncio.run(measure(args.reads, Path(tmp)))
    emit(rows, args.json, "reading small artifacts")


if __name__ == "__main__":
    main()
