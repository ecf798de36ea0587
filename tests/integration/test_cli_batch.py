"""Batch work from the command line: `ftbus submit` with several workspaces or a JSONL of tasks,
`ftbus ls`, `ftbus logs`. Real nats-server and services, stand-in toolchain, the real `ftbus`
executable as a subprocess."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

from ftbus.embedded import EmbeddedServer
from shared.settings import Settings
from tests.integration.conftest import Pipeline, wait_for_file, write_workspace
from tests.integration.test_delivery import poll, run_ftbus

TASK_OPTS = ("--base-model", "tiny-standin", "--benchmark", "tiny-arith")


async def test_submit_several_workspaces_waits_for_all_and_ls_lists_them(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    good = write_workspace(tmp_path / "good")
    bad = write_workspace(tmp_path / "bad", script="raise SystemExit('no data today')\n")

    code, out, err = await run_ftbus(settings, "submit", str(good), str(bad), *TASK_OPTS, "--json")
    assert code == 1, err[-3000:]  # one final_decision is false
    verdicts = json.loads(out)
    assert [v["final_decision"] for v in verdicts] == [True, False]  # in the order given
    assert verdicts[1]["failed_stage"] == "data_processing"
    ok_id, bad_id = (v["request_id"] for v in verdicts)
    assert "submitted 2 requests" in err

    code, out, err = await run_ftbus(settings, "ls", "--json")
    assert code == 0, err
    listed = {r["request_id"]: r for r in json.loads(out)}
    assert set(listed) == {ok_id, bad_id}
    assert listed[ok_id]["status"] == "completed" and listed[ok_id]["final_decision"] is True
    assert listed[bad_id]["final_decision"] is False and listed[bad_id]["failed_stage"] == "data_processing"
    assert all(r["age_s"] is not None and r["age_s"] >= 0 for r in listed.values())
    assert listed[ok_id]["task"]["benchmark"] == "tiny-arith"

    code, out, err = await run_ftbus(settings, "ls")
    assert code == 0, err
    for rid in (ok_id, bad_id):
        assert rid in out
    assert "completed" in out and "data_processing" in out

    # The validation results as an lm-eval results file (its schema: tests/unit/test_lmeval_format.py).
    code, out, err = await run_ftbus(settings, "get", ok_id, "--format", "lm-eval")
    assert code == 0, err
    results = json.loads(out)
    assert sorted(results["results"]) == ["ftbus_tiny_arith_doubling", "ftbus_tiny_arith_halving"]
    assert results["versions"]["ftbus_tiny_arith_doubling"] == 1 and results["n-shot"]["ftbus_tiny_arith_halving"] == 0
    code, _, err = await run_ftbus(settings, "get", bad_id, "--format", "lm-eval")
    assert code == 2 and "has no validation results" in err

    code, out, _ = await run_ftbus(settings, "ls", "--status", "running", "--json")
    assert code == 0 and json.loads(out) == []
    code, _, err = await run_ftbus(settings, "ls", "--status", "finished")
    assert code == 2 and "unknown status finished" in err

    # Logs: one stage, or every stage with headers; the failing request's data log says why.
    code, out, err = await run_ftbus(settings, "logs", ok_id, "--stage", "train")
    assert code == 0, err
    assert "Training completed." in out and "==>" not in out
    code, out, err = await run_ftbus(settings, "logs", ok_id)
    assert code == 0, err
    assert out.index("data_processing.log") < out.index("training.log") < out.index("benchmark-validation.log")
    code, out, err = await run_ftbus(settings, "logs", bad_id, "--stage", "data")
    assert code == 0 and "no data today" in out
    code, out, err = await run_ftbus(settings, "logs", bad_id, "--stage", "train")
    assert code == 2 and "no train log" in err
    code, _, err = await run_ftbus(settings, "logs", "20990101-000000-00000000")
    assert code == 2 and "unknown request" in err
    code, _, err = await run_ftbus(settings, "logs", ok_id, "--stage", "test")
    assert code == 2 and "'test' is not one of 'data', 'train', 'bench', 'baseline'" in err, err


async def test_submit_a_jsonl_of_tasks_shows_one_summary(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    write_workspace(tmp_path / "batch" / "a")
    write_workspace(tmp_path / "batch" / "b", train={"max_steps": 3})
    tasks = tmp_path / "batch" / "tasks.jsonl"
    tasks.write_text(
        "# one task a line; workspaces relative to this file\n"
        + json.dumps({"workspace": "a", "description": "double numbers"}) + "\n\n"
        + json.dumps({"workspace": "b", "base_model": "tiny-standin", "timeouts": {"training": 60}}) + "\n"
    )
    code, out, err = await run_ftbus(settings, "submit", "--tasks", str(tasks), *TASK_OPTS)
    assert code == 0, err[-3000:]
    assert "2 verdicts" in out and out.count("final_decision True") == 2
    # The progress view: one row per request, ending with its decision.
    assert err.count("final_decision True") >= 2

    code, out, _ = await run_ftbus(settings, "ls", "--status", "completed", "--json")
    described = {r["task"]["description"] for r in json.loads(out)}
    assert described == {"double numbers", ""}

    # Without waiting: the ids, one per line, at once.
    code, out, err = await run_ftbus(settings, "submit", "--tasks", str(tasks), *TASK_OPTS, "--no-wait")
    assert code == 0, err
    assert len(out.split()) == 2

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"workspace": "a"}) + "\nnot json\n")
    code, _, err = await run_ftbus(settings, "submit", "--tasks", str(bad), *TASK_OPTS)
    assert code == 2 and "bad.jsonl:2: not JSON" in err
    bad.write_text(json.dumps({"workspace": "a", "benchmark": "tiny-arith"}) + "\n")
    code, _, err = await run_ftbus(settings, "submit", "--tasks", str(bad))
    assert code == 2 and "bad.jsonl:1: base_model" in err
    code, _, err = await run_ftbus(settings, "submit", str(tmp_path / "batch" / "a"))
    assert code == 2 and "--base-model and --benchmark" in err


async def _subscribed(nats_server: EmbeddedServer, subject: str) -> bool:
    """Some connection to the server subscribes to exactly ``subject`` (its monitoring endpoint)."""
    def fetch() -> dict:
        with urllib.request.urlopen(f"{nats_server.monitor_url}/connz?subs=1&limit=4096", timeout=60) as response:
            return json.loads(response.read())

    connections = (await asyncio.to_thread(fetch)).get("connections") or []
    return any(subject in (c.get("subscriptions_list") or []) for c in connections)


async def test_logs_follow_waits_for_a_running_stage(
    pipeline: Pipeline, settings: Settings, tmp_path: Path, nats_server: EmbeddedServer
) -> None:
    await pipeline.start()
    pid_file, gate = tmp_path / "trainer.pid", tmp_path / "gate"
    # The training waits before its first step until the gate is opened: it runs until the test
    # lets it end, however long a CLI process takes to start on a loaded machine.
    ws = write_workspace(tmp_path / "ws", train={"standin_step_s": 0.2, "max_steps": 4,
                                                 "standin_pid_file": str(pid_file), "standin_gate_file": str(gate)})
    code, out, err = await run_ftbus(settings, "submit", str(ws), *TASK_OPTS)
    assert code == 0, err
    rid = out.strip()
    await wait_for_file(pid_file)  # training is running: its log does not exist yet
    code, _, err = await run_ftbus(settings, "logs", rid, "--stage", "train")
    assert code == 2 and "try --follow" in err

    following = asyncio.create_task(run_ftbus(settings, "logs", rid, "--stage", "train", "--follow"))
    # Once it listens for the training's progress (not after a sleep), the steps may go.
    await poll(lambda: _subscribed(nats_server, pipeline.bus.subjects.progress(rid)),
               "`logs --follow` to subscribe to the progress", timeout_s=60)
    assert not following.done(), following.result()
    gate.touch()
    code, out, err = await following
    assert code == 0, err
    assert "Training completed." in out
    assert "[train]" in err and "step" in err  # live progress while it waited
    await asyncio.wait_for(pipeline.client.wait(rid), timeout=120)  # a hang guard


async def test_status_right_after_submit_says_queued(bus: object, settings: Settings, tmp_path: Path) -> None:
    # No service runs: the aggregator has written nothing of the request yet.
    code, out, err = await run_ftbus(settings, "submit", str(write_workspace(tmp_path / "ws")), *TASK_OPTS)
    assert code == 0, err
    rid = out.strip().splitlines()[-1]
    code, out, err = await run_ftbus(settings, "status", rid, "--json")
    assert code == 0, err
    view = json.loads(out)
    assert view["request_id"] == rid and view["status"] == "queued"
    code, _, err = await run_ftbus(settings, "status", "20990101-000000-00000000")
    assert code == 2 and "unknown request 20990101-000000-00000000" in err
