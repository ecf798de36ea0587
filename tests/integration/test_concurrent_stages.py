"""Light stages handle many messages at once by default, and every request still gets exactly one verdict.

The data, judge and aggregator workers run at their stages' own concurrency (no override): a burst
of requests goes through them side by side, and the aggregator, which assembles one verdict from
several events of a request, handles events of the same request at once without a second verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from ftbus.stages import BY_STAGE, PIPELINE
from services.aggregator.service import Aggregator
from shared import codec
from shared.bus import Bus
from shared.events import CancelRequested, DeadLetter, Stage, TaskSpec, Verdict
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")
NO_BENCH = [Stage.data, Stage.train, Stage.judge, Stage.aggregate]


def test_light_stages_take_many_messages_at_once_heavy_ones_one() -> None:
    settings = Settings()
    assert BY_STAGE[Stage.data].concurrency_in(settings) > 1
    assert BY_STAGE[Stage.judge].concurrency_in(settings) > 1
    assert BY_STAGE[Stage.aggregate].concurrency_in(settings) > 1
    assert BY_STAGE[Stage.train].concurrency_in(settings) == 1
    assert BY_STAGE[Stage.bench].concurrency_in(settings) == 1
    # The setting, then --concurrency, override the stage's own.
    tuned = Settings(stage_concurrency={"judge": 3, "train": 2})
    assert BY_STAGE[Stage.judge].concurrency_in(tuned) == 3
    assert BY_STAGE[Stage.train].concurrency_in(tuned) == 2
    assert BY_STAGE[Stage.judge].concurrency_in(tuned, 5) == 5


async def _verdict_copies(bus: Bus) -> tuple[Any, dict[str, list[bytes]]]:
    """Every verdict message published (a copy the stream refused included), by request id."""
    seen: dict[str, list[bytes]] = {}

    async def on_msg(msg: Any) -> None:
        seen.setdefault(msg.subject.rsplit(".", 1)[-1], []).append(msg.data)

    sub = await bus.nc.subscribe(bus.subjects.verdict("*"), cb=on_msg)
    await bus.nc.flush()
    return sub, seen


async def _stored_verdicts(bus: Bus) -> dict[str, int]:
    """Messages in the verdict stream, by request id."""
    info = await bus.js.stream_info(bus.subjects.stream_verdicts, subjects_filter=">")
    return {subject.rsplit(".", 1)[-1]: count for subject, count in (info.state.subjects or {}).items()}


async def _wait_until(check: Any, timeout_s: float) -> None:
    """Wait for ``check`` to hold; ``timeout_s``: a hang guard."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.2)


async def test_a_burst_through_concurrent_light_stages_gets_one_verdict_each(
    settings: Settings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"data_concurrent_runs": 4})
    spans = tmp_path / "spans"
    spans.mkdir()
    # process_data.py notes when it runs (the local sandbox lets it write there): the runs of a burst
    # overlap when the data stage takes many messages at once. Each run is marked running while it
    # waits for another run's mark: one marked running beside it is an overlap (no clock compared: two
    # marks at once are two runs at once); only ended ones, a run that came late. One run at a time
    # would see no mark at first and give up after 60 s (a hang guard), then only ended ones.
    script = (
        "import json, os, time\n"
        f"spans = {str(spans)!r}\n"
        "running = os.path.join(spans, 'running-' + str(os.getpid()))\n"
        "open(running, 'w').close()\n"
        "saw = False\n"
        "for _ in range(3000):\n"
        "    others = [name for name in os.listdir(spans) if name != os.path.basename(running)]\n"
        "    if any(name.startswith('running-') for name in others):\n"
        "        saw = True\n"
        "        break\n"
        "    if others:\n"
        "        break\n"
        "    time.sleep(0.02)\n"
        "open(os.path.join(spans, 'result-' + str(os.getpid())), 'w').write(json.dumps(saw))\n"
        "os.remove(running)\n"
        "json.dump([{'instruction': f'add {i} and {i}', 'input': '', 'output': str(2 * i)} for i in range(20)],"
        " open('data.json', 'w'))\n"
    )
    # Their training fails (no benchmark stage needed): data runs, then train, then the judge.
    passing = [write_workspace(tmp_path / f"ok{i}", script=script + f"# {i}\n", train={"standin_fail": "stand-in"})
               for i in range(4)]
    refused = write_workspace(tmp_path / "refused", drop=("train.yaml",))
    pipeline = Pipeline(settings)
    # A connection of its own, to watch the verdicts: it outlives the services' connection.
    watcher = await Bus.connect(settings)
    try:
        await pipeline.start(NO_BENCH)  # every stage at its own concurrency
        assert pipeline.client is not None and pipeline.bus is not None
        sub, copies = await _verdict_copies(watcher)
        submitted = await asyncio.gather(
            *(pipeline.client.submit(ws, TASK) for ws in passing),
            *(pipeline.client.submit(refused, TASK) for _ in range(30)),
        )
        ok_ids, refused_ids = submitted[:4], submitted[4:]
        verdicts = await asyncio.gather(*(pipeline.client.wait(rid, timeout_s=180) for rid in submitted))
        # A late second publish would show in the copies: none can come once the services have
        # stopped and their connection flushed what they published (it does at close); drain() takes
        # every message the server routed to the watcher before it answers the watcher's ping.
        await pipeline.stop()
        await sub.drain()

        for rid, verdict in zip(submitted, verdicts, strict=True):
            if rid in refused_ids:
                assert verdict.failed_stage == "precheck" and verdict.final_decision is False
            else:
                assert verdict.failed_stage == "training", verdict.failed_stage
        assert set(ok_ids) | set(refused_ids) == set(submitted) and len(set(submitted)) == 34
        stored = await _stored_verdicts(watcher)
        assert {rid: stored.get(rid) for rid in submitted} == dict.fromkeys(submitted, 1)
        for rid in submitted:
            assert len({codec.decode(data, Verdict).model_dump_json() for data in copies[rid]}) == 1, rid

        assert not list(spans.glob("running-*"))  # every run ended
        runs = [json.loads(p.read_text()) for p in spans.glob("result-*")]
        assert len(runs) == 4, runs
        assert any(runs), f"process_data.py runs never overlapped: {runs}"
    finally:
        await pipeline.stop()
        await watcher.close()


async def test_events_of_one_request_at_once_in_two_aggregators_make_one_verdict(settings: Settings) -> None:
    """Each request gets a cancel and a dead letter at the same moment (a cancelled verdict and an
    error verdict would both be owed), handled by two aggregators at their full concurrency."""
    bus = await Bus.connect(settings)
    await bus.ensure_topology()
    stop = asyncio.Event()
    aggregators = [Aggregator(bus, PIPELINE, concurrency=BY_STAGE[Stage.aggregate].concurrency_in(settings))
                   for _ in range(2)]
    tasks = [asyncio.create_task(a.run(stop)) for a in aggregators]
    try:
        await asyncio.sleep(0.5)
        sub, copies = await _verdict_copies(bus)
        s = bus.subjects
        rids = [f"race-{i:02d}" for i in range(40)]
        for rid in rids:  # the records exist: each event below is an update of one
            await aggregators[0].apply(rid, lambda record: None)
        publishes = []
        for rid in rids:
            publishes.append(bus.publish(s.cancel, CancelRequested(request_id=rid, reason="race"), f"{rid}:c"))
            letter = DeadLetter(request_id=rid, original_subject=s.completed("data"), stage=Stage.train,
                                reason="the train stage failed 3 times")
            publishes.append(bus.publish(s.dlq, letter, f"{rid}:dlq"))
        await asyncio.gather(*publishes)

        async def all_in() -> bool:
            return set(await _stored_verdicts(bus)) >= set(rids)

        await _wait_until(all_in, 60)
        # A late second verdict would show in the copies: none can come once both aggregators have
        # stopped (a hang guard of 60 s on that); drain() takes every message the server routed to
        # this connection before it answers its ping, those the aggregators published on it included.
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        await sub.drain()
        stored = await _stored_verdicts(bus)
        assert {rid: stored[rid] for rid in rids} == dict.fromkeys(rids, 1)
        for rid in rids:
            shown = {codec.decode(data, Verdict).model_dump_json() for data in copies[rid]}
            assert len(shown) == 1, f"{rid}: two different verdicts published"
            record = await aggregators[0].store.get(rid)
            assert record is not None and record.verdict is not None and record.verdict_published
            kept = Verdict.model_validate_json(shown.pop())
            assert kept.status == record.verdict.status
            assert kept.status in ("cancelled", "error")
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=15)
        await bus.close()
