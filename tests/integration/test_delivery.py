"""Delivery rules (docs/design.md §5) against the real nats-server and the real services.

Scaling a stage, a worker killed mid-stage, bad messages, cancel, the data cache, retries that end
in a dead letter, exactly one verdict under duplication, and the ``ftbus`` CLI as a subprocess.
Only the fine-tuning toolchain is a stand-in (tests/standin/). Every wait polls with a generous
deadline: these tests must hold on a loaded two-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from nats.js.errors import KeyNotFoundError, NotFoundError

from ftbus.stages import PIPELINE
from runners.choice import make_runner
from services.trainer import service as trainer
from shared import codec
from shared.bus import Bus
from shared.events import (
    CancelRequested,
    DataResult,
    DeadLetter,
    Feedback,
    JudgeInfo,
    JudgeResult,
    Stage,
    TaskSpec,
    Verdict,
    VerdictResult,
)
from shared.records import RequestRecord
from shared.runtime import StageContext, StageWorker
from shared.settings import Settings
from tests.fakes.judge_events import context as fake_context
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")
ALL_BUT_TRAIN = [Stage.data, Stage.bench, Stage.judge, Stage.aggregate]
WAIT_S = 120.0


# ---------------------------------------------------------------------------- helpers


async def poll(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = WAIT_S, every_s: float = 0.1) -> Any:
    """Call ``check`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)


async def now(value: Any) -> Any:
    """A value computed synchronously, for ``poll``."""
    return value


async def verdicts_on(bus: Bus, request_id: str) -> int:
    """How many messages the verdict stream holds for this request."""
    info = await bus.js.stream_info(bus.subjects.stream_verdicts, subjects_filter=bus.subjects.verdict(request_id))
    return (info.state.subjects or {}).get(bus.subjects.verdict(request_id), 0)


async def stored_verdict(bus: Bus, request_id: str) -> Verdict:
    raw = await bus.js.get_last_msg(bus.subjects.stream_verdicts, bus.subjects.verdict(request_id))
    return codec.decode(raw.data, Verdict)


async def dead_letters(bus: Bus) -> list[DeadLetter]:
    info = await bus.js.stream_info(bus.subjects.stream_dlq)
    if not info.state.messages:
        return []  # an empty stream says first_seq 0, which no message has
    letters = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(NotFoundError):
            raw = await bus.js.get_msg(bus.subjects.stream_dlq, seq)
            letters.append(codec.decode(raw.data, DeadLetter))
    return letters


async def caught_up(bus: Bus, stream: str, durable: str) -> bool:
    """The consumer has nothing left to deliver and nothing unacknowledged."""
    try:
        info = await bus.js.consumer_info(stream, durable)
    except NotFoundError:
        return False
    return info.num_pending == 0 and info.num_ack_pending == 0


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (PID 1 here never reaps orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def read_pids(pid_file: Path) -> list[int] | None:
    """The stand-in trainer's "<pid> <grandchild sleep pid>", once it is completely written."""
    try:
        parts = pid_file.read_text().split()
    except OSError:
        return None
    return [int(p) for p in parts] if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def kill_leftovers(pids: list[int]) -> None:
    """Test hygiene: end processes the stand-in started that are still running (checked by name)."""
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if alive(pid) and (b"sleep" in cmdline or b"llamafactory-cli" in cmdline):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def ftbus_env(settings: Settings) -> dict[str, str]:
    """This test's settings as FTBUS_* variables (lists as JSON), for ftbus subprocesses."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTBUS_", "OPENAI_"))}
    env.update(
        {
            "FTBUS_NATS_URL": str(settings.nats_url),
            "FTBUS_SUBJECT_PREFIX": settings.subject_prefix,
            "FTBUS_HOME": str(settings.home),
            "FTBUS_ASSETS_DIR": str(settings.assets_dir),
            "FTBUS_TOOLCHAIN_BIN": str(settings.toolchain_bin),
            "FTBUS_SANDBOX": settings.sandbox,
            "FTBUS_BENCH_ENGINE": settings.bench_engine,
            "FTBUS_ACK_WAIT_S": str(settings.ack_wait_s),
            "FTBUS_HEARTBEAT_S": str(settings.heartbeat_s),
            "FTBUS_MAX_DELIVER": str(settings.max_deliver),
            "FTBUS_RETRY_BACKOFF_S": json.dumps(settings.retry_backoff_s),
            "FTBUS_SWEEP_INTERVAL_S": str(settings.sweep_interval_s),
            "FTBUS_LOG_FORMAT": "console",
            "FTBUS_LOG_LEVEL": "WARNING",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "COLUMNS": "200",
        }
    )
    return env


def ftbus_exe() -> str:
    exe = Path(sys.executable).with_name("ftbus")
    assert exe.is_file(), f"{exe} is missing: install the project (make install)"
    return str(exe)


async def run_ftbus(settings: Settings, *args: str, timeout_s: float = WAIT_S) -> tuple[int, str, str]:
    """``ftbus ARGS`` as a subprocess, without blocking the event loop the services run on."""
    proc = await asyncio.create_subprocess_exec(
        ftbus_exe(), *args, env=ftbus_env(settings),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def gated_training(pid_file: Path, gate: Path, steps: int) -> dict[str, Any]:
    """A training that waits before its first step until ``gate`` exists: it cannot end before the
    test lets it, however slow or fast the machine (not a training just long enough)."""
    return {"max_steps": steps, "standin_pid_file": str(pid_file), "standin_gate_file": str(gate)}


def counting_script(log: Path, tag: str, *, fail: bool = False) -> str:
    """A process_data.py that appends ``tag`` to ``log`` each time it really runs."""
    body = (
        "import json\n"
        f"with open({str(log)!r}, 'a') as fh:\n"
        f"    fh.write({tag!r} + '\\n')\n"
    )
    if fail:
        return body + f"print('failing on purpose {tag}')\nraise SystemExit(4)\n"
    return body + (
        "records = [{'instruction': f'add {i} and {i}', 'input': '', 'output': str(2 * i)} for i in range(40)]\n"
        "json.dump(records, open('data.json', 'w'))\n"
        f"print('wrote', len(records), 'records', {tag!r})\n"
    )


# ---------------------------------------------------------------------------- 1. scaling a stage


async def test_two_train_workers_share_ten_requests(pipeline: Pipeline, settings: Settings, tmp_path: Path) -> None:
    await pipeline.start(ALL_BUT_TRAIN, concurrency=2)
    handled: dict[int, list[str]] = {0: [], 1: []}
    started = [asyncio.Event(), asyncio.Event()]

    def handler_of(index: int) -> Callable[[DataResult, StageContext], Awaitable[Any]]:
        async def handle(event: DataResult, ctx: StageContext) -> Any:
            handled[index].append(event.request_id)
            started[index].set()
            # Hold the first message until the other worker has one too (or a minute passed): it
            # can only get one from the shared durable while this worker holds its own unacked.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(started[1 - index].wait(), timeout=60)
            return await trainer.handle(event, ctx)

        return handle

    stop = asyncio.Event()
    buses = [await Bus.connect(settings, name=f"train-{i}") for i in range(2)]
    workers = [
        asyncio.create_task(
            StageWorker(bus, Stage.train, handler_of(i), (DataResult,),
                        filters=trainer.SPEC.reads(bus.subjects, PIPELINE),
                        runner=make_runner(bus.settings, "train"), row=trainer.SPEC)
            .run(stop)
        )
        for i, bus in enumerate(buses)
    ]
    try:
        ws = write_workspace(tmp_path / "ws", train={"standin_step_s": 0.1})
        rids = await asyncio.gather(*(pipeline.client.submit(ws, TASK) for _ in range(10)))
        verdicts = await asyncio.gather(*(pipeline.client.wait(rid, timeout_s=WAIT_S) for rid in rids))
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        for bus in buses:
            await bus.close()

    assert [v.request_id for v in verdicts] == rids
    assert all(v.status == "completed" and v.final_decision for v in verdicts), [v.execution for v in verdicts]
    assert handled[0] and handled[1], f"one worker did all the work: {handled}"
    # Each request trained once, by one of the two workers.
    assert sorted(handled[0] + handled[1]) == sorted(rids)
    for rid in rids:
        assert await verdicts_on(pipeline.bus, rid) == 1


# ---------------------------------------------------------------------------- 2. a worker killed


async def test_a_train_worker_killed_mid_training_is_replaced_by_redelivery(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start(ALL_BUT_TRAIN)
    pid_file = tmp_path / "train.pid"
    worker_log = (tmp_path / "train-worker.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        ftbus_exe(), "worker", "train", env=ftbus_env(settings),
        stdout=worker_log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
    )
    first_pids: list[int] = []
    try:
        gate = tmp_path / "gate"
        ws = write_workspace(tmp_path / "ws", train=gated_training(pid_file, gate, steps=8))
        rid = await pipeline.client.submit(ws, TASK)

        first_pids = await poll(lambda: now(read_pids(pid_file)), "training to start in the subprocess")
        assert alive(first_pids[0]), "training ended before the worker could be killed"
        proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == -signal.SIGKILL  # a hang guard

        # A second worker takes the unacked message over once ack_wait has passed.
        await pipeline.start([Stage.train])
        # The killed worker's training tree: the direct child died with it (PR_SET_PDEATHSIG), and
        # what it had started (re-parented grandchildren) was killed by the next worker on this
        # host when it started (reap_orphans): nothing of the first attempt survives. Its gate is
        # still closed, so none of it could have ended by itself.
        await poll(lambda: now(not any(alive(p) for p in first_pids)), "the first attempt's processes to be gone")
        gate.touch()  # the second attempt's training runs through
        verdict = await pipeline.client.wait(rid, timeout_s=WAIT_S)
        assert verdict.status == "completed" and verdict.final_decision is True, verdict.execution
        assert len(verdict.result.training_metrics.loss_history.train) == 8
        assert await verdicts_on(pipeline.bus, rid) == 1
        record = await pipeline.client.status(rid)
        assert record is not None and record.stages["train"].attempts == 2, record.stages if record else None
        second_pids = read_pids(pid_file)
        assert second_pids is not None and second_pids != first_pids
        assert [p for p in first_pids if alive(p)] == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        worker_log.close()
        kill_leftovers(first_pids)


# ---------------------------------------------------------------------------- 3. bad messages


async def test_undecodable_messages_are_dead_lettered_and_the_readable_request_gets_an_error_verdict(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    await pipeline.start()
    bus = pipeline.bus
    s = bus.subjects
    await bus.js.publish(s.completed("data"), b"\xc1\xff not msgpack at all")
    bad_rid = "bad-request-1"
    invalid = msgpack.packb(
        {"schema_version": 1, "event_type": "DataResult", "request_id": bad_rid, "ok": "perhaps"},
        use_bin_type=True,
    )
    await bus.js.publish(s.completed("data"), invalid)
    # An invalid judge result: the aggregator alone reads those, so it dead-letters it itself.
    bad_judged = "bad-request-2"
    invalid_judge = msgpack.packb(
        {"schema_version": 1, "event_type": "JudgeResult", "request_id": bad_judged, "feedback": 7},
        use_bin_type=True,
    )
    await bus.js.publish(s.completed("judge"), invalid_judge)

    verdict = await pipeline.client.wait(bad_rid, timeout_s=WAIT_S)
    assert verdict.status == "error"
    assert verdict.final_decision is False
    assert verdict.failed_stage == "training", verdict.execution
    assert "training" in verdict.execution and "failed validation" in verdict.execution
    judged = await pipeline.client.wait(bad_judged, timeout_s=WAIT_S)
    assert judged.status == "error" and judged.failed_stage == "aggregate", judged.execution
    assert "JudgeResult failed validation" in judged.execution

    letters = await poll(
        lambda: _letters_where(bus, lambda d: d.original_subject == s.completed("data") and d.stage == Stage.train, 2),
        "both bad messages on the dead-letter stream",
    )
    garbage = next(d for d in letters if d.request_id is None)
    assert "not msgpack" in garbage.reason and garbage.payload.startswith(b"\xc1\xff")
    readable = next(d for d in letters if d.request_id == bad_rid)
    assert "DataResult failed validation" in readable.reason and "ok" in readable.reason

    # Nothing crashed: a good request still goes all the way through.
    rid = await pipeline.client.submit(write_workspace(tmp_path / "ws"), TASK)
    good = await pipeline.client.wait(rid, timeout_s=WAIT_S)
    assert good.status == "completed" and good.final_decision is True, good.execution
    assert all(not t.done() for t in pipeline._tasks), "a service stopped"
    assert await verdicts_on(bus, bad_rid) == 1
    # One letter per bad message: the aggregator, which reads every event too, leaves the ones
    # bound for a stage to that stage (so the verdict names the stage, not the aggregator).
    await poll(lambda: caught_up(bus, s.stream_events, s.durable(Stage.aggregate)), "the aggregator to catch up")
    letters = await dead_letters(bus)
    assert sorted((d.original_subject, d.stage, d.request_id or "") for d in letters) == sorted(
        [(s.completed("data"), Stage.train, ""), (s.completed("data"), Stage.train, bad_rid),
         (s.completed("judge"), Stage.aggregate, bad_judged)]
    )


async def _letters_where(bus: Bus, match: Callable[[DeadLetter], bool], count: int) -> list[DeadLetter] | None:
    letters = [d for d in await dead_letters(bus) if match(d)]
    return letters if len(letters) >= count else None


# ---------------------------------------------------------------------------- 4. cancel


async def test_cancel_kills_the_running_training_and_gives_one_cancelled_verdict(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    await pipeline.start()
    pid_file = tmp_path / "train.pid"
    # It never ends unless killed: its gate is never opened.
    ws = write_workspace(tmp_path / "ws", train=gated_training(pid_file, tmp_path / "never-opened", steps=60))
    rid = await pipeline.client.submit(ws, TASK)
    pids = await poll(lambda: now(read_pids(pid_file)), "training to start")
    try:
        assert all(alive(p) for p in pids)
        await pipeline.client.cancel(rid)

        verdict = await pipeline.client.wait(rid, timeout_s=WAIT_S)
        assert verdict.status == "cancelled"
        assert verdict.final_decision is False
        assert "CANCELLED" in verdict.execution

        # The stand-in and its grandchild `sleep 300` are gone.
        await poll(lambda: now(not any(alive(p) for p in pids)), f"processes {pids} to end", 60)

        # A late event for the request (here a judge result) changes nothing.
        late = judge_result(rid, True, "late judge result")
        await pipeline.bus.publish(pipeline.bus.subjects.completed("judge"), late, f"{rid}:test:late")
        await poll(lambda: _judge_seen(pipeline, rid, "late judge result"), "the aggregator to read the late event")
        assert await verdicts_on(pipeline.bus, rid) == 1
        assert (await stored_verdict(pipeline.bus, rid)).status == "cancelled"
        record = await full_record(pipeline.bus, rid)
        assert record is not None and record.status == "cancelled" and record.verdict.status == "cancelled"
        view = await pipeline.client.status(rid)
        assert view is not None and view.status == "cancelled"
    finally:
        kill_leftovers(pids)


async def full_record(bus: Bus, rid: str) -> RequestRecord | None:
    """The aggregator's own record (it holds the judge result; `ftbus status` shows a public view)."""
    kv = await bus.kv(bus.subjects.kv_requests)
    try:
        entry = await kv.get(rid)
    except KeyNotFoundError:
        return None
    return RequestRecord.model_validate_json(entry.value) if entry.value else None


async def _judge_seen(pipeline: Pipeline, rid: str, marker: str) -> bool:
    record = await full_record(pipeline.bus, rid)
    return record is not None and record.judge is not None and record.judge.raw_execution == marker


# ---------------------------------------------------------------------------- 5. data cache


async def test_the_data_cache_serves_identical_scripts_only_and_never_a_failure(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    await pipeline.start()
    runs = tmp_path / "runs.log"
    client = pipeline.client

    def ws(name: str, script: str) -> Path:
        return write_workspace(tmp_path / name, script=script)

    first = await client.wait(await client.submit(ws("a1", counting_script(runs, "A")), TASK), timeout_s=WAIT_S)
    assert first.final_decision is True and first.result.data_cached is False, first.execution

    rids = [
        await client.submit(ws("a2", counting_script(runs, "A")), TASK),
        await client.submit(ws("b", counting_script(runs, "B")), TASK),
        await client.submit(ws("f1", counting_script(runs, "F", fail=True)), TASK),
    ]
    again, other, failed1 = await asyncio.gather(*(client.wait(r, timeout_s=WAIT_S) for r in rids))
    failed2 = await client.wait(
        await client.submit(ws("f2", counting_script(runs, "F", fail=True)), TASK), timeout_s=WAIT_S
    )

    assert again.final_decision is True and again.result.data_cached is True
    assert again.result.data_stats is not None and again.result.data_stats.total_samples == 40
    assert other.final_decision is True and other.result.data_cached is False
    for failed in (failed1, failed2):
        assert failed.final_decision is False and failed.failed_stage == "data_processing"
        assert failed.result.data_cached is False
        assert "failing on purpose F" in failed.raw_execution
    # What really ran: A once (its twin was served from the cache), B once, the failure twice.
    assert sorted(runs.read_text().split()) == ["A", "B", "F", "F"]


# ---------------------------------------------------------------------------- 6. retries, then a dead letter


async def test_an_infrastructure_error_is_retried_then_ends_in_one_error_verdict(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start([Stage.data, Stage.judge, Stage.aggregate])
    client = pipeline.client
    rid = await client.submit(write_workspace(tmp_path / "ws"), TASK)

    async def data_done() -> bool:
        record = await client.status(rid)
        return record is not None and record.stages.get("data") is not None and record.stages["data"].ok is True

    await poll(data_done, "the data stage to finish")
    # The data.json the trainer must read is lost from the object store: the trainer raises on
    # every delivery (an infrastructure error, not the candidate's), so it is retried, then given up.
    artifacts = await pipeline.bus.artifacts()
    assert await artifacts.stat(f"{rid}/data/data.json") is not None
    await artifacts.delete(f"{rid}/data/data.json")
    await pipeline.start([Stage.train])

    verdict = await client.wait(rid, timeout_s=WAIT_S)
    assert verdict.status == "error"
    assert verdict.final_decision is False
    assert verdict.failed_stage == "training"
    assert "training" in verdict.execution and "max_deliver" in verdict.execution
    letter = next(d for d in await dead_letters(pipeline.bus) if d.request_id == rid)
    assert letter.stage == Stage.train and letter.deliveries == settings.max_deliver
    assert letter.original_subject == pipeline.bus.subjects.completed("data")
    assert await verdicts_on(pipeline.bus, rid) == 1
    record = await client.status(rid)
    assert record is not None and record.status == "error" and record.stages["train"].attempts == settings.max_deliver


# ---------------------------------------------------------------------------- 7. exactly one verdict


def judge_result(rid: str, decision: bool, marker: str) -> JudgeResult:
    return JudgeResult(
        request_id=rid,
        context=fake_context(),
        feedback=Feedback(execution=marker, return_checking="checked", code="fine", final_decision=decision),
        raw_execution=marker,
        judge=JudgeInfo(kind="rules", rules_decision=decision),
        result=VerdictResult(),
    )


async def test_duplicates_and_late_dead_letters_never_make_a_second_verdict(pipeline: Pipeline) -> None:
    await pipeline.start([Stage.aggregate])
    bus = pipeline.bus
    s = bus.subjects
    rid = "dup-request-1"
    first = judge_result(rid, True, "first judge result")

    ack1 = await bus.publish(s.completed("judge"), first, f"{rid}:judge:completed")
    ack2 = await bus.publish(s.completed("judge"), first, f"{rid}:judge:completed")
    assert not ack1.duplicate and ack2.duplicate  # the server's de-duplication window
    verdict = await pipeline.client.wait(rid, timeout_s=WAIT_S)
    assert verdict.final_decision is True and verdict.execution == "first judge result"

    # Past the de-duplication window (no id), a redelivered copy, then a contradicting result.
    await bus.publish(s.completed("judge"), first)
    await bus.publish(s.completed("judge"), judge_result(rid, False, "second judge result"))
    await poll(lambda: _judge_seen(pipeline, rid, "second judge result"), "the aggregator to read the second result")
    letter = DeadLetter(request_id=rid, original_subject=s.completed("judge"), stage=Stage.judge, reason="late trouble")
    await bus.publish(s.dlq, letter, "dlq:test:1")
    await bus.js.publish(s.cancel, codec.encode(CancelRequested(request_id=rid)))
    await poll(lambda: caught_up(bus, s.stream_dlq, f"{s.durable(Stage.aggregate)}-dlq"), "the dead letter to be read")
    await poll(lambda: caught_up(bus, s.stream_events, s.durable(Stage.aggregate)), "the events to be read")

    assert await verdicts_on(bus, rid) == 1
    stored = await stored_verdict(bus, rid)
    assert stored.status == "completed" and stored.final_decision is True
    assert stored.execution == "first judge result"
    record = await full_record(bus, rid)
    assert record is not None and record.status == "completed" and record.final_decision is True
    assert record.verdict is not None and record.verdict.execution == "first judge result"


# ---------------------------------------------------------------------------- 8. the CLI


async def test_the_cli_end_to_end(pipeline: Pipeline, settings: Settings, tmp_path: Path) -> None:
    code, out, _ = await run_ftbus(settings, "--help")
    assert code == 0 and "submit" in out and "worker" in out
    code, out, _ = await run_ftbus(settings, "submit", "--help")
    assert code == 0 and "--base-model" in out and "--wait" in out

    missing = tmp_path / "no-such-workspace"
    code, out, err = await run_ftbus(
        settings, "submit", str(missing), "--base-model", "tiny-standin", "--benchmark", "tiny-arith"
    )
    assert code == 2, (out, err)
    flat = "".join(err.split())  # the console may wrap a long path
    assert flat.startswith("error:") and f"workspace{missing}isnotafolder" in flat, err

    await pipeline.start()
    good = write_workspace(tmp_path / "good")
    bad = write_workspace(tmp_path / "bad", script="print('nothing useful')\nraise SystemExit(3)\n")
    common = ("--base-model", "tiny-standin", "--benchmark", "tiny-arith", "--wait", "--json")
    (code, out, err), (bad_code, bad_out, bad_err) = await asyncio.gather(
        run_ftbus(settings, "submit", str(good), *common),
        run_ftbus(settings, "submit", str(bad), *common),
    )
    assert code == 0, (out, err)
    verdict = json.loads(out)  # exactly one JSON document on stdout: progress went to stderr
    assert verdict["final_decision"] is True and verdict["status"] == "completed"
    assert bad_code == 1, (bad_out, bad_err)
    bad_verdict = json.loads(bad_out)
    assert bad_verdict["final_decision"] is False and bad_verdict["failed_stage"] == "data_processing"

    rid = verdict["request_id"]
    code, out, err = await run_ftbus(settings, "get", rid, "--json")
    assert code == 0, err
    assert json.loads(out) == verdict
    code, out, err = await run_ftbus(settings, "status", rid, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["request_id"] == rid and status["status"] == "completed" and status["final_decision"] is True
    assert set(status["stages"]) >= {"data", "train", "bench", "judge"}
    code, _, err = await run_ftbus(settings, "get", bad_verdict["request_id"], "--json")
    assert code == 1, err


async def test_an_event_on_the_wrong_subject_is_not_believed(pipeline: Pipeline) -> None:
    """A valid JudgeResult smuggled onto data.completed must not become a verdict."""
    from shared.events import Feedback, JudgeInfo, JudgeResult, RequestContext, VerdictResult

    await pipeline.start()
    forged = JudgeResult(
        request_id="forged-1",
        context=RequestContext(task=TASK, workspace=[]),
        feedback=Feedback(execution="SUCCESS", return_checking="", code="", final_decision=True),
        judge=JudgeInfo(kind="rules", rules_decision=True),
        result=VerdictResult(),
    )
    await pipeline.bus.js.publish(pipeline.bus.subjects.completed("data"), codec.encode(forged))
    verdict = await pipeline.client.wait("forged-1", timeout_s=60)
    # The train stage dead-letters it; the aggregator turns that into an error verdict, never a pass.
    assert verdict.status == "error" and verdict.final_decision is False
