"""Orchestration overhead per request, beside five raw JetStream hops on the same server.

One request at a time through the whole pipeline (real nats-server, every stage its own process,
the stand-in tools: bench/standin_pipeline.py): its time from the request's publish to its
verdict's arrival, minus the time its stages spent in their handlers (the stages' own work). What
remains is what ftbus adds: consumers, acks, the idempotency and status records, progress, the
aggregator and the verdict. The same again with every stage in one process (the layout of
`ftbus up`), where no hop wakes another process.

Beside it, a message through five raw JetStream pull consumers (fetch, publish to the next
subject, ack) on the same server, one connection per hop, three ways:
- back to back, all five in one process (the issue's first comparison);
- back to back, each in a process of its own, the way the stages run;
- each in a process of its own, holding every message (idle) as long as the corresponding stage
  worked, the held time not counted: each hop process then sleeps between messages as a stage
  worker does, and wakes as slowly. This is the transport's floor for the pipeline's own hops,
  and the target's yardstick (docs/design.md, §9).

    python bench/overhead.py [--requests 12] [--hops 40] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import Stand, emit, median, stdout_to_stderr, workspace  # noqa: E402
from shared.tasks import cancel_until_done  # noqa: E402

TARGET_RATIO = 3.0


#: Header in which held raw hops add up the seconds they held a message (their "stage work").
HELD = "Bench-Held"


async def raw_hop(url: str, prefix: str, i: int, stop: asyncio.Event, conns: list[object] | None = None,
                  ready: asyncio.Event | None = None, hold_s: float | None = None) -> None:
    """One raw hop: fetch from ``<prefix>.<i>``, publish to ``<prefix>.<i+1>``, ack; until ``stop``.

    ``hold_s``: hold each message that long first, idle, as a stage waits on its tools, and add the
    time really held to the message's HELD header (the receiver subtracts it, as the pipeline's
    overhead subtracts its stages' work)."""
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    if conns is not None:
        conns.append(nc)
    hjs = nc.jetstream()
    await hjs.add_consumer(prefix.upper(), api.ConsumerConfig(
        durable_name=f"hop{i}", ack_policy=api.AckPolicy.EXPLICIT, filter_subject=f"{prefix}.{i}"))
    psub = await hjs.pull_subscribe_bind(f"hop{i}", prefix.upper())
    if ready is not None:
        ready.set()
    try:
        while not stop.is_set():
            try:
                msgs = await psub.fetch(1, timeout=2)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                if hold_s is None:
                    await hjs.publish(f"{prefix}.{i + 1}", msg.data)
                else:
                    held = time.perf_counter()
                    if hold_s > 0:
                        await asyncio.sleep(hold_s)
                    held = time.perf_counter() - held + float((msg.headers or {}).get(HELD, "0"))
                    await hjs.publish(f"{prefix}.{i + 1}", msg.data, headers={HELD: repr(held)})
                await msg.ack()
    finally:
        if conns is None:
            await nc.close()


async def _hop_process(url: str, prefix: str, i: int, hold_s: float | None) -> None:
    """``--hop``: one raw hop in this process until SIGTERM."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    ready = asyncio.Event()
    task = asyncio.create_task(raw_hop(url, prefix, i, stop, ready=ready, hold_s=hold_s))
    await ready.wait()
    print("ready", flush=True)
    await stop.wait()
    await cancel_until_done([task])


async def raw_hops(url: str, messages: int, hops: int = 5, *, processes: bool = False,
                   payload_bytes: int = 200, holds: Sequence[float] | None = None) -> list[float]:
    """Seconds for one message through ``hops`` raw pull consumers, one message at a time: all in
    this process, or (``processes``) each in a process of its own. ``holds``: hop i holds each
    message ``holds[i]`` seconds, idle (processes only); the seconds held are not counted."""
    import nats
    from nats.js import api

    prefix = "raw" + secrets.token_hex(3)
    admin = await nats.connect(url)
    js = admin.jetstream()
    await js.add_stream(api.StreamConfig(name=prefix.upper(), subjects=[f"{prefix}.>"],
                                         storage=api.StorageType.FILE))
    conns: list[object] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    procs: list[asyncio.subprocess.Process] = []
    if processes:
        for i in range(hops):
            hold = [] if holds is None else ["--hold", repr(holds[i])]
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--hop", str(i), "--url", url, "--prefix", prefix, *hold,
                stdout=asyncio.subprocess.PIPE))
        for proc in procs:
            assert proc.stdout is not None
            await asyncio.wait_for(proc.stdout.readline(), timeout=60)  # "ready"
    else:
        tasks = [asyncio.create_task(raw_hop(url, prefix, i, stop, conns)) for i in range(hops)]
    arrived: asyncio.Queue[float] = asyncio.Queue()

    async def on_end(msg: Any) -> None:
        arrived.put_nowait(time.perf_counter() - float((msg.headers or {}).get(HELD, "0")))

    sub = await admin.subscribe(f"{prefix}.{hops}", cb=on_end)
    await asyncio.sleep(0.5)
    times = []
    try:
        for n in range(messages):
            start = time.perf_counter()
            await js.publish(f"{prefix}.0", b"x" * payload_bytes)
            end = await asyncio.wait_for(arrived.get(), timeout=30)
            if n >= 3:  # warm-up
                times.append(end - start)
    finally:
        stop.set()
        await cancel_until_done(tasks)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_stream(prefix.upper())
        for nc in [*conns, admin]:
            await nc.close()  # type: ignore[attr-defined]
    return times


STAGES = ("data", "train", "bench", "judge")


async def request_overheads(stand: Stand, root: Path, requests: int,
                            tag: str) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """(overheads, wall times, each stage's handler times) in seconds of ``requests`` requests sent
    one at a time, after two for warm-up; each one's per-hop timeline goes to stderr."""
    sub, verdicts = await stand.verdicts()
    overheads: list[float] = []
    walls: list[float] = []
    stage_work: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for n in range(requests + 2):
        rid = f"{tag}{n}-{secrets.token_hex(3)}"
        ws = workspace(root / "ws" / rid, steps=1, step_s=0.01, salt=rid)
        event = await stand.upload(ws, rid)
        start = time.time()
        await stand.publish(event)
        while True:  # a verdict the stream refused as a repeat still reaches core subscribers
            got, at, _ = await asyncio.wait_for(verdicts.get(), timeout=120)
            if got == rid:
                break
        await asyncio.sleep(0.3)  # the last stage's timing line is written after its return
        times = stand.stage_times()[rid]
        work = sum(times.values())
        if n >= 2:  # warm-up: imports, first connections, the baseline cache
            for stage in STAGES:
                stage_work[stage].append(times[stage])
            walls.append(at - start)
            overheads.append(at - start - work)
            spans = stand.spans()[rid]
            marks = [("publish", start), *((f"{st}", spans[st]) for st in STAGES)]
            prev, gaps = start, []
            for name, span in marks[1:]:
                gaps.append(f"->{name} {1000 * (span[0] - prev):.1f}")
                prev = span[1]
            gaps.append(f"->verdict {1000 * (at - prev):.1f}")
            for name in STAGES:
                gaps.append(f"[{name} {1000 * (spans[name][1] - spans[name][0]):.0f}]")
            print(f"{tag} gaps ms:", " ".join(gaps), file=sys.stderr)
    await sub.unsubscribe()
    return overheads, walls, stage_work


async def measure(requests: int, hops_messages: int, root: Path) -> list[dict[str, object]]:
    async with Stand(root / "apart") as stand:
        raw = await raw_hops(stand.settings.nats_url, hops_messages)
        raw_apart = await raw_hops(stand.settings.nats_url, hops_messages, processes=True)
        overheads, walls, stage_work = await request_overheads(stand, root, requests, "ovh")
        # The same hops again, each holding its message as long as its stage worked (the fifth,
        # the aggregator's, not at all), so that every hop process sleeps between messages as a
        # stage worker does. A process that has slept for a tenth of a second wakes slower than
        # one in a tight loop: this is the transport's floor for the pipeline's hops.
        holds = [median(stage_work[stage]) for stage in STAGES] + [0.0]
        raw_held = await raw_hops(stand.settings.nats_url, requests + 3, processes=True, holds=holds)
    async with Stand(root / "together", one_process=True) as stand:
        together, _, _ = await request_overheads(stand, root, requests, "one")
    # What fair share (shared/lanes.py) costs a request at its two GPU stages: the same, in arrival order.
    async with Stand(root / "arrival", settings={"fair_share": False}) as stand:
        arrival, _, _ = await request_overheads(stand, root, requests, "fcfs")
    # What the metrics (shared/metrics.py: every worker's /metrics, the queue polls) cost a request.
    async with Stand(root / "unmetered", settings={"metrics_enabled": False}) as stand:
        unmetered, _, _ = await request_overheads(stand, root, requests, "nometrics")
    raw_ms = median(raw) * 1000
    apart_ms = median(raw_apart) * 1000
    held_ms = median(raw_held) * 1000
    over_ms = median(overheads) * 1000
    together_ms = median(together) * 1000
    arrival_ms = median(arrival) * 1000
    unmetered_ms = median(unmetered) * 1000
    held_ratio = over_ms / held_ms
    return [
        {"measure": "5 raw JetStream hops, one process, back to back (median)", "value": f"{raw_ms:.2f} ms",
         "target": None, "met": None},
        {"measure": "5 raw JetStream hops, a process each, back to back (median)", "value": f"{apart_ms:.2f} ms",
         "target": None, "met": None},
        {"measure": "5 raw JetStream hops, a process each, idle between messages as the stages are (median)",
         "value": f"{held_ms:.2f} ms", "target": None, "met": None},
        {"measure": "request wall time, stand-in tools (median)", "value": f"{median(walls) * 1000:.0f} ms",
         "target": None, "met": None},
        {"measure": "overhead per request outside stage work (median)", "value": f"{over_ms:.1f} ms",
         "target": None, "met": None},
        {"measure": "overhead vs the raw hops idle as the stages are", "value": f"{held_ratio:.1f}x",
         "target": f"<= {TARGET_RATIO:.0f}x", "met": held_ratio <= TARGET_RATIO},
        {"measure": "overhead vs the raw hops back to back, one process (the issue's first comparison)",
         "value": f"{over_ms / raw_ms:.1f}x", "target": None, "met": None},
        {"measure": "overhead vs the raw hops back to back, a process each", "value": f"{over_ms / apart_ms:.1f}x",
         "target": None, "met": None},
        {"measure": "overhead with fair_share off (train and bench in arrival order, no lanes)",
         "value": f"{arrival_ms:.1f} ms, {arrival_ms / held_ms:.1f}x the idle raw hops; fair share adds "
                  f"{over_ms - arrival_ms:.1f} ms", "target": None, "met": None},
        {"measure": "overhead with metrics off (no /metrics, no queue polls)",
         "value": f"{unmetered_ms:.1f} ms; the metrics add {over_ms - unmetered_ms:.1f} ms", "target": None,
         "met": None},
        {"measure": "overhead, every stage in one process (ftbus up)",
         "value": f"{together_ms:.1f} ms, {together_ms / held_ms:.1f}x the idle raw hops", "target": None,
         "met": None},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--hops", type=int, default=40, help="messages through the raw hops")
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    parser.add_argument("--hop", type=int, help=argparse.SUPPRESS)  # one raw hop's own process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--hold", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hop is not None:
        asyncio.run(_hop_process(args.url, args.prefix, args.hop, args.hold))
        return
    with tempfile.TemporaryDirectory(prefix="ftbus-overhead-") as tmp:
        with stdout_to_stderr():  # --json: only the rows on stdout
            rows = asyncio.run(measure(args.requests, args.hops, Path(tmp)))
    emit(rows, args.json, "orchestration overhead")


if __name__ == "__main__":
    main()
