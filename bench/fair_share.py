"""Fair share across campaigns: a campaign that submits one request behind another's thirty.

Stand-in tools (the trainer sleeps ``--steps`` x ``--step-s``), a real nats-server, one worker
process per stage and one train worker. Campaign A submits ``--queue`` requests at once (they
queue at the train stage); then campaign B submits one, half way through one of A's trainings (A's
second), as a request that comes at a random moment does on average. B's wait is from its publish
to its verdict, and from the end of its data stage to the start of its training, counted in
training durations (the median train stage time of A's requests). Run twice in this one process:
with the ``fair_share`` setting off (arrival order, what ftbus did before shared/lanes.py) and on.
Targets, on: B's verdict within 2 training durations (the one under way when B arrives, then B's
own, and the light stages), and at most 1 at the train stage. Then the cost of one pick with 1 and
with ``--lanes`` busy lanes.

    python bench/fair_share.py [--queue 30] [--steps 30] [--step-s 0.1] [--json]
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

TARGET_TRAININGS = 2.0


async def late_campaign_wait(args: argparse.Namespace, root: Path, fair_share: bool) -> dict[str, float]:
    """B's wait for its verdict and at the train stage, a training's duration (s), and how many of
    A's verdicts came before B's."""
    async with Stand(root, concurrency={"train": 1}, settings={"fair_share": fair_share}, log_level="WARNING") as stand:
        sub, verdicts = await stand.verdicts()
        queued = []
        for i in range(args.queue):
            rid = f"a{i:02d}-{secrets.token_hex(3)}"
            ws = workspace(root / "ws" / rid, steps=args.steps, step_s=args.step_s, salt=rid)
            queued.append(await stand.upload(ws, rid, campaign="campaign-a"))
        rid_b = f"b00-{secrets.token_hex(3)}"
        late = await stand.upload(workspace(root / "ws" / rid_b, steps=args.steps, step_s=args.step_s, salt=rid_b),
                                  rid_b, campaign="campaign-b")
        await asyncio.gather(*(stand.publish(event) for event in queued))
        print(f"fair_share={fair_share}: campaign A queued {args.queue}", file=sys.stderr)
        ids = {event.request_id for event in queued}

        def trained() -> list[tuple[float, float]]:
            return sorted(stage["train"] for rid, stage in stand.spans().items() if rid in ids and "train" in stage)

        # A's first training done, its second begun (the timing lines come from the worker process)
        while not trained():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        started, ended = trained()[0]
        # B arrives half way through a training of A's, as a request that comes at a random moment
        # does on average.
        await asyncio.sleep(max(0.0, ended + (ended - started) / 2 - time.time()))
        submitted = time.time()
        await stand.publish(late)
        before_b = 0
        while True:
            rid, at, _ = await asyncio.wait_for(verdicts.get(), timeout=1800)
            if rid == rid_b:
                break
            before_b += 1
        await sub.unsubscribe()
        await asyncio.sleep(0.5)  # the timing lines are flushed within FLUSH_S
        times, spans = stand.stage_times(), stand.spans()
        training_s = median([times[e.request_id]["train"] for e in queued if "train" in times[e.request_id]])
    result = {"wait_s": at - submitted, "queue_s": spans[rid_b]["train"][0] - spans[rid_b]["data"][1],
              "training_s": training_s, "before": before_b}
    print(f"fair_share={fair_share}: B waited {result['wait_s']:.1f} s for its verdict, {result['queue_s']:.1f} s "
          f"at the train stage (trainings of {training_s:.1f} s), {before_b} of A's verdicts before it",
          file=sys.stderr)
    return result


async def pick_ms(root: Path, lanes: int, picks: int) -> float:
    """The median time of one pick (list the lanes, order them, fetch from the first) with ``lanes``
    busy lanes on a local nats-server; beside it the plain fetch of arrival order costs one round trip."""
    from ftbus.embedded import EmbeddedServer
    from shared.bus import Bus
    from shared.lanes import Lanes
    from shared.settings import Settings
    from shared.streams import ensure_stream, lanes_stream_config

    server = EmbeddedServer(root / "nats", log_file=root / "nats-server.log")
    url = server.start()
    try:
        settings = Settings(home=root / "home", nats_url=url, log_level="WARNING")  # type: ignore[call-arg]
        bus = await Bus.connect(settings, name="bench-fair-share")
        try:
            stage = Lanes(bus, "train")
            await ensure_stream(bus.js, lanes_stream_config(bus.subjects, settings, "train"))
            for i in range(lanes):
                name = f"campaign-{i:04d}"
                await stage.ensure_lane(name)
                for j in range(-(-picks // lanes)):  # enough for every pick
                    await bus.publish_payload(bus.subjects.lane("train", name), b"{}", f"{name}-{j}")
            times = []
            for _ in range(picks):
                t0 = time.perf_counter()
                msgs = await stage.take(1)
                times.append(time.perf_counter() - t0)
                assert len(msgs) == 1, "a pick found nothing"
                await msgs[0].ack()
        finally:
            await bus.close()
    finally:
        server.stop()
    return median(times) * 1000


async def measure(args: argparse.Namespace, root: Path) -> list[dict[str, object]]:
    off = await late_campaign_wait(args, root / "off", fair_share=False)
    on = await late_campaign_wait(args, root / "on", fair_share=True)
    one = await pick_ms(root / "pick-1", 1, 20)
    many = await pick_ms(root / "pick-1000", args.lanes, 20)
    rows: list[dict[str, object]] = [{
        "measure": f"one pick (list the lanes, fetch from the first), 1 lane vs {args.lanes} busy lanes (ms, median)",
        "value": f"{one:.1f} vs {many:.1f}", "target": None, "met": None}]
    for label, got in (("fair_share off (arrival order, before)", off), ("fair_share on (lanes, after)", on)):
        trainings, queued = got["wait_s"] / got["training_s"], got["queue_s"] / got["training_s"]
        is_on = label.startswith("fair_share on")
        rows.append({
            "measure": f"B's verdict behind A's {args.queue}, {label}",
            "value": f"{got['wait_s']:.1f} s = {trainings:.1f} trainings of {got['training_s']:.1f} s; "
                     f"{got['before']:.0f} of A's verdicts first",
            "target": f"<= {TARGET_TRAININGS:g} trainings" if is_on else None,
            "met": trainings <= TARGET_TRAININGS if is_on else None,
        })
        rows.append({
            "measure": f"B's wait at the train stage, {label}",
            "value": f"{got['queue_s']:.1f} s = {queued:.1f} trainings",
            "target": "<= 1 training (the one under way)" if is_on else None,
            "met": queued <= 1.0 if is_on else None,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queue", type=int, default=30, help="campaign A's requests (default 30)")
    parser.add_argument("--steps", type=int, default=30, help="stand-in training steps (default 30)")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per stand-in step (default 0.1)")
    parser.add_argument("--lanes", type=int, default=1000, help="busy lanes for the cost of a pick (default 1000)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON (bench/table.py)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftbus-fair-") as tmp:
        with stdout_to_stderr():  # --json: only the rows on stdout
            rows = asyncio.run(measure(args, Path(tmp)))
    emit(rows, args.json, "fair share: a late campaign behind a queue")


if __name__ == "__main__":
    main()
