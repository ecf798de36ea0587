"""`make bench`, part 2: a soak of fast requests, and every service's memory per 1,000 requests.

One nats-server, every stage as its own `ftbus worker` process, the stand-in toolchain, and
``--requests`` requests (default 1,000: mostly passes, with data and training failures mixed in)
kept ``--in-flight`` at a time. Each service's resident memory (VmRSS) is sampled after a warm-up
and then every ``--every`` requests; the growth per 1,000 requests is the slope of a least-squares
line through the samples after the warm-up. Exits 1 when a service grows more than
``--max-growth-mb`` per 1,000 requests, or when a verdict is not what its workspace asks for.

    python bench/soak.py [--requests 1000] [--in-flight 12] [--max-growth-mb 20]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chaos.cluster import Cluster  # noqa: E402
from chaos.load import EXPECTED, TASK, workspace  # noqa: E402
from chaos.services import Services, leftovers, standin_assets, standin_toolchain  # noqa: E402
from ftbus.client import Client  # noqa: E402
from shared.logs import setup_logging  # noqa: E402
from shared.settings import Settings  # noqa: E402

MB = 2**20


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of (requests, bytes)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


async def soak(args: argparse.Namespace, root: Path) -> int:
    cluster = Cluster(root / "nats", size=1, sync_interval="2m")
    cluster.start()
    cluster.wait_ready()
    prefix = "soak" + secrets.token_hex(3)
    settings = {
        "nats_url": cluster.url, "subject_prefix": prefix, "home": str(root / "home"),
        "assets_dir": str(standin_assets(root / "assets")), "toolchain_bin": str(standin_toolchain(root / "bin")),
        "sandbox": "local", "dashboard_in_up": "false", "log_format": "json", "log_level": "WARNING",
        # The stand-in lm_eval is a command, not a harness a warm engine can import (as chaos/run.py).
        "bench_engine": "cold",
        "ack_wait_s": 30, "heartbeat_s": 5, "sweep_interval_s": 5,
    }
    services = Services(root / "logs", settings, per_stage=1, concurrency=args.concurrency)
    services.start()
    client = await Client(settings=Settings(**{k: v for k, v in settings.items() if k != "dashboard_in_up"})).connect()
    samples: dict[str, list[tuple[int, int]]] = {s.name: [] for s in services.all}
    done = 0
    outcomes: dict[str, int] = {}
    wrong: list[str] = []
    kinds = ["pass"] * 8 + ["data_fail", "train_fail"]
    sem = asyncio.Semaphore(args.in_flight)
    started = time.monotonic()

    def sample() -> None:
        for service in services.all:
            rss = service.rss_bytes()
            if rss is not None:
                samples[service.name].append((done, rss))

    async def one(i: int) -> None:
        nonlocal done
        async with sem:
            kind = kinds[i % len(kinds)]
            ws = workspace(root / "ws" / f"{i}", kind, step_s=0.0, steps=2)
            rid = await client.submit(ws, TASK)
            verdict = await client.wait(rid, timeout_s=600)
            key = f"{verdict.status}/{verdict.final_decision}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if not EXPECTED[kind].matches(verdict):
                # A soak of a broken pipeline measures nothing: say so, and fail.
                wrong.append(f"{rid} ({kind}): {key}, failed_stage {verdict.failed_stage}, {verdict.execution[:200]}")
            done += 1
            if done == args.warmup or (done > args.warmup and done % args.every == 0):
                sample()
            if done % 100 == 0:
                rate = done / (time.monotonic() - started)
                print(f"  {done} requests, {rate:.1f}/s", file=sys.stderr, flush=True)

    try:
        await asyncio.gather(*(one(i) for i in range(args.requests)))
        sample()
    finally:
        await client.close()
        services.stop()
        cluster.stop()
    elapsed = time.monotonic() - started
    left = leftovers(root)

    print(f"\nsoak: {args.requests} requests in {elapsed:.0f} s ({args.requests / elapsed:.1f}/s); outcomes: "
          + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())))
    print(f"{'service':<12} {'RSS after warm-up':>18} {'RSS at end':>11} {'growth / 1,000 req':>19}")
    worst = 0.0
    for name, points in samples.items():
        after = [p for p in points if p[0] >= args.warmup]
        growth = slope(after) * 1000 / MB
        worst = max(worst, growth)
        first = after[0][1] / MB if after else float("nan")
        last = after[-1][1] / MB if after else float("nan")
        print(f"{name:<12} {first:>15.1f} MB {last:>8.1f} MB {growth:>+16.2f} MB")
    growths = {name: slope([p for p in points if p[0] >= args.warmup]) for name, points in samples.items()}
    if growths:  # the largest grower's curve: a cache filling up flattens, a leak does not
        name = max(growths, key=lambda n: growths[n])
        curve = [f"{n}: {rss / MB:.1f}" for n, rss in samples[name] if n >= args.warmup]
        print(f"{name} RSS (MB) by requests done: " + ", ".join(curve))
    if left:
        print(f"leftover processes: {left}")
    if wrong:
        print(f"{len(wrong)} verdicts not what their workspace asks for, e.g.:\n  " + "\n  ".join(wrong[:5]))
    ok = worst <= args.max_growth_mb and not left and not wrong
    print(f"largest growth {worst:+.2f} MB per 1,000 requests (limit {args.max_growth_mb} MB): "
          f"{'flat' if ok else 'GROWING'}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=2, help="messages per worker process")
    parser.add_argument("--warmup", type=int, default=100, help="requests before the first sample")
    parser.add_argument("--every", type=int, default=50, help="requests between samples")
    parser.add_argument("--max-growth-mb", type=float, default=20.0)
    args = parser.parse_args()
    setup_logging("console", "WARNING")
    with tempfile.TemporaryDirectory(prefix="ftbus-soak-") as tmp:
        return asyncio.run(soak(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
