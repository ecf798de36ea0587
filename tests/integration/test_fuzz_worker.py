"""Fuzzed payloads thrown at every stage's subject of a running pipeline (real nats-server).

Each payload is unreadable for the stage that consumes its subject: the worker must dead-letter
it (one letter per payload, naming that stage), the aggregator must turn every letter with a
readable request id into an error verdict, and every worker must stay up: a valid request
submitted afterwards still gets its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.errors import NotFoundError

from shared import codec
from shared.events import EVENT_TYPES, DeadLetter, Stage, TaskSpec, Verdict
from tests.fuzzing import mutated_events, values
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
PER_SUBJECT = 25


def fuzz_payloads(count: int) -> list[bytes]:
    """``count`` payloads from hypothesis: raw bytes, msgpack values and mutated events."""
    found: list[bytes] = []

    @settings(max_examples=count, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(
        st.binary(max_size=512),
        values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
        mutated_events().map(lambda case: case[1]),
    ))
    def collect(payload: bytes) -> None:
        found.append(payload)

    collect()
    return found


async def test_fuzzed_payloads_become_dead_letters_and_workers_stay_up(pipeline: Pipeline, tmp_path: Path) -> None:
    await pipeline.start()
    bus, client = pipeline.bus, pipeline.client
    assert bus is not None and client is not None
    s = bus.subjects
    # Which stage reads (and so dead-letters) each subject, and what it accepts there.
    readers = {
        s.eval_requested: Stage.data,
        s.completed("data"): Stage.train,
        s.completed("train"): Stage.bench,
        s.completed("bench"): Stage.judge,
        s.completed("judge"): Stage.aggregate,
        s.cancel: Stage.aggregate,
    }
    accepted = {
        Stage.data: (EVENT_TYPES["EvalRequested"],),
        Stage.train: (EVENT_TYPES["DataResult"],),
        Stage.bench: (EVENT_TYPES["TrainResult"],),
        Stage.judge: (EVENT_TYPES["BenchResult"], EVENT_TYPES["DataResult"], EVENT_TYPES["TrainResult"]),
        Stage.aggregate: tuple(EVENT_TYPES[n] for n in ("EvalRequested", "CancelRequested", "DataResult",
                                                          "TrainResult", "BenchResult", "JudgeResult")),
    }
    payloads = fuzz_payloads(PER_SUBJECT * len(readers) * 2)
    sent: Counter[tuple[str, str]] = Counter()
    rids: set[str] = set()
    pool = iter(payloads)
    for subject, stage in readers.items():
        n = 0
        for payload in pool:
            try:
                codec.decode(payload, accepted[stage])
                continue  # readable there: not what this test throws
            except codec.CodecError as err:
                if err.request_id:
                    rids.add(err.request_id)
            await bus.js.publish(subject, payload)
            sent[(subject, stage.value)] += 1
            n += 1
            if n == PER_SUBJECT:
                break
    total = sum(sent.values())
    assert total == PER_SUBJECT * len(readers), sent

    async def letters() -> list[DeadLetter]:
        info = await bus.js.stream_info(s.stream_dlq)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            with contextlib.suppress(NotFoundError):
                raw = await bus.js.get_msg(s.stream_dlq, seq)
                found.append(codec.decode(raw.data, DeadLetter))
        return found

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    got: list[DeadLetter] = []
    while loop.time() < deadline:
        got = await letters()
        if len(got) >= total:
            break
        await asyncio.sleep(0.5)
    by_reader = Counter((letter.original_subject, letter.stage if letter.stage else "?") for letter in got)
    assert by_reader == sent, f"dead letters {by_reader} for payloads {sent}"

    # Every worker is still up: the tasks run, and a real request goes all the way through.
    assert all(not task.done() for task in pipeline._tasks)
    ws = write_workspace(tmp_path / "ws")
    rid = await client.submit(ws, TASK)
    verdict = await client.wait(rid, timeout_s=180)
    assert verdict.status == "completed" and verdict.final_decision, verdict.execution

    # A letter whose request id could be read is that request's error verdict.
    for fuzzed_rid in sorted(rids)[:10]:
        raw = None
        while loop.time() < deadline + 60 and raw is None:
            with contextlib.suppress(NotFoundError):
                raw = await bus.js.get_last_msg(s.stream_verdicts, s.verdict(fuzzed_rid))
            if raw is None:
                await asyncio.sleep(0.5)
        assert raw is not None, f"no verdict for the fuzzed request id {fuzzed_rid!r}"
        assert codec.decode(raw.data, Verdict).status in {"error", "cancelled"}
    print(f"\nworker fuzz: {total} payloads, {len(got)} dead letters, {len(rids)} request ids, 0 crashes")
