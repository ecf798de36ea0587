"""The CLI a newcomer meets (issue 38): it fails fast and says why when it cannot reach the server,
checks a workspace before it connects, prints whole names in a pipe, and says "unknown request".

The real `ftbus` executable as a subprocess, stdout a pipe (no TTY), a real nats-server where one
is involved."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

from ftbus.embedded import PID_FILE, free_port
from shared.settings import Settings
from tests.integration.conftest import write_workspace
from tests.integration.test_delivery import ftbus_exe, run_ftbus

TASK_OPTS = ("--base-model", "tiny-standin", "--benchmark", "tiny-arith")
#: The default connect budget (settings.connect_budget_s), as the error names it.
BUDGET = "tried for 5 s"
#: Hang guard only: a command that never exits fails here; how fast it exits is not timed (the
#: budget's own end is evidence enough: see _assert_budget_ended_it).
HANG_GUARD_S = 60.0


def _assert_budget_ended_it(err: str, args: tuple[str, ...]) -> None:
    """It failed fast: the first connection was given up when the connect budget (5 s) ran out, as
    the message says, not retried without limit (that hangs, and the hang guard in _run fails it)."""
    assert f", {BUDGET};" in err, (args, err)


def _offline_env(home: Path, assets: Path | None = None) -> dict[str, str]:
    """No server anywhere: no FTBUS_NATS_URL, a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")}
    env.update({"FTBUS_HOME": str(home), "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "80"})
    if assets is not None:
        env["FTBUS_ASSETS_DIR"] = str(assets)
    return env


async def _run(env: dict[str, str], *args: str, timeout_s: float = HANG_GUARD_S) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        ftbus_exe(), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_stale_nats_url_exits_2_fast_saying_where_it_came_from(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "nats").mkdir(parents=True)
    dead = f"nats://127.0.0.1:{free_port()}"
    (home / "nats.url").write_text(dead + "\n")  # left by an `ftbus up` killed with -9
    # Its server's pid file names an owner that is gone (pid 1's start time never matches this one).
    (home / "nats" / PID_FILE).write_text(json.dumps({"pid": 999999, "start": "0", "owner": 999998,
                                                      "owner_start": "0"}))
    for args in (("ls",), ("status", "x"), ("submit", str(write_workspace(tmp_path / "ws")), "--base-model", "m",
                                            "--benchmark", "b")):
        code, out, err = await _run(_offline_env(home), *args)
        assert code == 2, (args, out, err)
        _assert_budget_ended_it(err, args)
        lines = [line for line in err.splitlines() if line.strip()]
        origin = f"(from {home / 'nats.url'}, left by `ftbus up`"
        assert lines[0].startswith(f"error: cannot reach NATS at {dead} {origin}"), err
        assert "no longer running" in lines[0] and "`ftbus up`" in lines[0], err
        assert "{" not in err, f"a JSON log line: {err}"  # plain text, and said once
        if args[0] == "submit":
            break


async def test_a_wrong_nats_url_exits_2_fast_with_the_flag_named(tmp_path: Path) -> None:
    wrong = f"nats://127.0.0.1:{free_port()}"
    code, out, err = await _run(_offline_env(tmp_path / "home"), "status", "x", "--nats-url", wrong)
    assert code == 2, out + err
    _assert_budget_ended_it(err, ("status", "x", "--nats-url", wrong))
    assert err.startswith(f"error: cannot reach NATS at {wrong} (from --nats-url): connection refused"), err
    assert "check the URL" in err and len(err.strip().splitlines()) == 1, err
    env = {**_offline_env(tmp_path / "home"), "FTBUS_NATS_URL": wrong}
    code, _, err = await _run(env, "ls")
    assert code == 2 and "(from FTBUS_NATS_URL)" in err, err
    _assert_budget_ended_it(err, ("ls",))
    # A log line when asked for JSON is JSON; by default there is none.
    code, _, err = await _run(env, "--log-format", "json", "ls")
    assert code == 2 and "cannot reach NATS" in err


async def test_submit_checks_the_workspace_before_any_server(tmp_path: Path, assets_dir: Path) -> None:
    env = _offline_env(tmp_path / "home", assets_dir)  # no server configured at all
    missing = tmp_path / "no-such-workspace"
    code, out, err = await _run(env, "submit", str(missing), *TASK_OPTS)
    assert code == 2, out + err
    assert err.startswith(f"error: workspace {missing} is not a folder: it does not exist\n"), err
    assert "no NATS server configured" not in err and "nothing was submitted" in err

    bad_yaml = write_workspace(tmp_path / "bad-yaml")
    (bad_yaml / "train.yaml").write_text("model_name_or_path: tiny-standin\ndataset: [processed_data\n")
    code, _, err = await _run(env, "submit", str(bad_yaml), *TASK_OPTS)
    assert code == 2 and "error: train.yaml is not valid YAML" in err and "at line" in err, err

    ws = write_workspace(tmp_path / "ws")
    code, _, err = await _run(env, "submit", str(ws), "--base-model", "tiny-standin", "--benchmark", "tiny-arithh")
    assert code == 2, err
    assert "error: unknown benchmark 'tiny-arithh'" in err and "available benchmarks: " in err and "tiny-arith" in err

    # `ftbus check` says the same without a server, and ok for a good workspace.
    code, out, err = await _run(env, "check", str(ws), *TASK_OPTS)
    assert code == 0 and out.strip() == f"ok: {ws}", out + err
    code, out, err = await _run(env, "check", str(bad_yaml), str(missing), "--json")
    assert code == 2, err
    results = json.loads(out)
    assert [r["ok"] for r in results] == [False, False]
    assert "not valid YAML" in results[0]["problems"][0] and "does not exist" in results[1]["problems"][0]


async def test_benchmarks_ls_in_a_pipe_shows_whole_names(tmp_path: Path, assets_dir: Path) -> None:
    assets = tmp_path / "assets"
    shutil.copytree(assets_dir, assets)
    long_name = "tiny-arith-with-a-name-far-longer-than-any-column-would-be"
    shutil.copytree(assets / "benchmarks" / "tiny-arith", assets / "benchmarks" / long_name)
    env = _offline_env(tmp_path / "home", assets)
    code, out, err = await _run(env, "benchmarks", "ls")  # stdout is a pipe, as in `| cat`
    assert code == 0, err
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert long_name in names and "tiny-arith" in names, out
    assert "…" not in out and "│" not in out  # plain columns, nothing cut
    header = out.splitlines()[0].split()
    assert header[:3] == ["benchmark", "version", "scorer"]
    code, out, _ = await _run(env, "benchmarks", "ls", "-o", "json")
    assert long_name in {b["name"] for b in json.loads(out)}
    code, out, _ = await _run(env, "benchmarks", "ls", "--json")
    assert long_name in {b["name"] for b in json.loads(out)}

    empty = _offline_env(tmp_path / "home2", tmp_path / "no-assets")
    code, out, err = await _run(empty, "benchmarks", "ls")
    assert code == 0 and out == "" and "run `ftbus assets init`" in err, err


async def test_version_and_help(tmp_path: Path) -> None:
    code, out, _ = await _run(_offline_env(tmp_path), "--version")
    assert code == 0 and out.startswith("ftbus ") and len(out.split()) == 2, out
    code, out, _ = await _run({**_offline_env(tmp_path), "COLUMNS": "200"}, "ls", "-h")
    assert code == 0 and "--json" in out and "<bool>" not in out and "table|wide|plain|json" in out, out


async def test_unknown_ids_and_empty_lists_say_so(settings: Settings, bus: object, tmp_path: Path) -> None:
    for command in (("cancel",), ("get",), ("pull",), ("status",), ("logs",)):
        code, out, err = await run_ftbus(settings, *command, "20990101-000000-00000000")
        assert code == 2, (command, out, err)
        assert "unknown request 20990101-000000-00000000" in err, (command, err)
    code, out, err = await run_ftbus(settings, "cancel", "20990101-000000-00000000", "--json")
    assert code == 2 and out == ""
    code, out, err = await run_ftbus(settings, "ls")
    assert code == 0 and out == "" and "no requests yet" in err and "ftbus submit" in err
    code, out, err = await run_ftbus(settings, "ls", "-o", "json")
    assert code == 0 and json.loads(out) == []

    code, out, err = await run_ftbus(settings, "submit", str(write_workspace(tmp_path / "ws")), *TASK_OPTS)
    assert code == 0, err
    rid = out.strip()
    code, out, err = await run_ftbus(settings, "cancel", rid, "--json")
    assert code == 0, err
    assert json.loads(out) == {"request_id": rid, "status": "queued", "cancel_requested": True}
    code, out, err = await run_ftbus(settings, "cancel", rid)
    assert code == 0 and f"cancel requested for {rid}" in err, err
