"""A burst of requests against the ideal pipeline bound, on stand-in tools whose work sleeps.

The stand-in tools sleep the way GPU work leaves the CPU free: process_data.py sleeps
``--data-s``, the stand-in trainer ``--steps`` x ``--step-s``. Each stage's time is measured first
on requests sent one at a time (the median of its handler's time, bench/standin_pipeline.py);
the ideal bound of a burst of N is then the sum of the stage times plus (N - 1) x the slowest
stage's: what a pipeline that never leaves its slowest stage idle takes. The burst's time runs
from the first request's publish to the last verdict. Real nats-server, every stage its own
process at its default concurrency; heavy stages (train, bench) one at a time per worker.

    python bench/pipelining.py [--burst 20] [--json]
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

from bench.standin_pipeline import Stand, emit, median, stdout_to_stderr, workspace  # noqa: E402

TARGET_RATIO = 1.10
WORK_STAGES = ("data", "train", "bench", "judge")


async def run_requests(stand: Stand, root: Path, n: int, tag: str, args: argparse.Namespace,
                       at_once: bool) -> tuple[float, list[str]]:
    sub, verdicts = await stand.verdicts()
    events = []
    for i in range(n):
        rid = f"{tag}{i:02d}-{secrets.token_hex(3)}"
        ws = workspace(root / "ws" / rid, data_sleep_s=args.data_s, steps=args.steps, step_s=args.step_s, salt=rid)
        events.append(await stand.upload(ws, rid))
    start = time.time()
    last = start
    if at_once:
        await asyncio.gather(*(stand.publish(e) for e in events))
        wanted, seen = {e.request_id for e in events}, set()
        while seen != wanted:
            rid, at, _ = await asyncio.wait_for(verdicts.get(), timeout=600)
            if rid in wanted:
                seen.add(rid)
                last = at
    else:
        for e in events:
            await stand.publish(e)
            while True:
                rid, last, _ = await asyncio.wait_for(verdicts.get(), timeout=120)
                if rid == e.request_id:
                    break
    await sub.unsubscribe()
    return last - start, [e.request_id for e in events]


async def measure(args: argparse.Namespace, root: Path) -> list[dict[str, object]]:
    async with Stand(root) as stand:
        await run_requests(stand, root, 2, "warm", args, at_once=False)  # imports, the baseline cache
        _, alone = await run_requests(stand, root, args.alone, "alone", args, at_once=False)
        await asyncio.sleep(0.5)
        times = stand.stage_times()
        stage_s = {st: median([times[rid][st] for rid in alone if st in times[rid]]) for st in WORK_STAGES}
        elapsed, burst_ids = await run_requests(stand, root, args.burst, "burst", args, at_once=True)
        await asyncio.sleep(0.5)
        times = stand.stage_times()
        in_burst = {st: median([times[rid][st] for rid in burst_ids if st in times[rid]]) for st in WORK_STAGES}
    slowest = max(stage_s.values())
    bound = sum(stage_s.values()) + (args.burst - 1) * slowest
    ratio = elapsed / bound
    shown = ", ".join(f"{st} {stage_s[st] * 1000:.0f}" for st in WORK_STAGES)
    shown_burst = ", ".join(f"{st} {in_burst[st] * 1000:.0f}" for st in WORK_STAGES)
    return [
        {"measure": "stage times alone (ms, median)", "value": shown, "target": None, "met": None},
        {"measure": f"stage times in the burst of {args.burst} (ms, median)", "value": shown_burst,
         "target": None, "met": None},
        {"measure": f"burst of {args.burst}: wall time vs ideal pipeline bound",
         "value": f"{elapsed:.2f} s vs {bound:.2f} s", "target": None, "met": None},
        {"measure": f"burst of {args.burst} / ideal pipeline bound", "value": f"{ratio:.2f}x",
         "target": f"<= {TARGET_RATIO:.2f}x", "met": ratio <= TARGET_RATIO},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--alone", type=int, default=4, help="requests one at a time for the stage times")
    parser.add_argument("--data-s", type=float, default=0.2, help="process_data.py sleeps this long")
    parser.add_argument("--steps", type=int, default=10, help="stand-in training steps")
    parser.add_argument("--step-s", type=float, default=0.1, help="sleep per training step")
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftbus-pipelining-") as tmp:
        with stdout_to_stderr():  # --json: only the rows on stdout
            rows = asyncio.run(measure(args, Path(tmp)))
    emit(rows, args.json, "pipelining")


if __name__ == "__main__":
    main()
