"""Create the topology, or wait until it exists: the jobs of a deployment's init steps.

    python -m ftbus.topology create    # as admin: streams, KV buckets, object stores (idempotent)
    python -m ftbus.topology wait      # as a stage's own user: until every stream is there

Kubernetes runs ``create`` in the topology job and ``wait`` in each worker's init container
(deploy/k8s/); the restricted users may look streams up but not create them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from shared.bus import Bus
from shared.settings import Settings
from shared.subjects import topology_stream_names


async def create(settings: Settings) -> None:
    bus = await Bus.connect(settings, name="ftbus-topology")
    try:
        await bus.ensure_topology()
    finally:
        await bus.close()


async def ready(settings: Settings) -> bool:
    bus = await Bus.connect(settings, name="ftbus-wait-topology")
    try:
        for name in topology_stream_names(bus.subjects):
            await bus.js.stream_info(name)
        return True
    finally:
        await bus.close()


async def wait(settings: Settings, attempts: int = 360, every_s: float = 5.0) -> bool:
    for _ in range(attempts):
        try:
            if await ready(settings):
                return True
        except Exception as exc:
            print(f"waiting for the ftbus topology: {exc!r}", file=sys.stderr, flush=True)
        await asyncio.sleep(every_s)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["create", "wait"])
    parser.add_argument("--attempts", type=int, default=360, help="wait: how many looks (5 s apart)")
    args = parser.parse_args(argv)
    settings = Settings()
    if args.action == "create":
        asyncio.run(create(settings))
        print("ftbus topology ready", flush=True)
        return 0
    ok = asyncio.run(wait(settings, args.attempts))
    print("ftbus topology ready" if ok else "ftbus topology not found: is the topology job done?", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
