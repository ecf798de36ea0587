"""The NATS permission model under test, on a real nats-server running deploy/nats/ as it is.

1. One full request, with the topology created by `admin` and every worker connected as its own
   user (the stand-in toolchain does the work): it must pass with no permission violation at all
   in the server's log.
2. The permission table (tests/integration/permission_table.py): for every user, each operation
   it must be allowed succeeds, and each it must be denied is refused by the server itself, seen
   both as the client's error ("permission denied for <subject>") and as a violation in the
   server's log for that user and subject.
3. A refused user gets "permission denied for <subject>" from the CLI and the client, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from ftbus.cli import run_services
from ftbus.client import Client, WaitTimeout
from shared.bus import Bus
from shared.denials import PermissionDenied
from shared.events import Report, TaskSpec, Verdict
from shared.settings import Settings
from tests.integration.conftest import write_workspace
from tests.integration.permission_table import (
    CONNECTION_NAMES,
    STAGE_USERS,
    TABLE,
    USERS,
    Context,
    Op,
    seed,
)
from tests.integration.secured_nats import REPO, SecuredServer, Violation, config_users

# In a campaign, so that the judge reads and writes the campaigns bucket as its own user, and the agent
# reads the campaign (`ftbus campaign NAME`). Every item right: accepted against the base model.
TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers",
                campaign="perm-campaign")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecuredServer]:
    server = SecuredServer(tmp_path_factory.mktemp("secured-nats"))
    server.start()
    yield server
    server.stop()


def user_settings(server: SecuredServer, user: str, home: Path, standin_bin: Path, assets_dir: Path,
                  **extra: object) -> Settings:
    return Settings(
        home=home / user,
        assets_dir=assets_dir,
        nats_url=server.url(user),
        subject_prefix="ftbus",  # accounts.conf is written for the default prefix
        toolchain_bin=standin_bin,
        ack_wait_s=4.0,
        heartbeat_s=1.0,
        max_deliver=3,
        retry_backoff_s=[0.2, 0.5],
        sweep_interval_s=1.0,
        log_format="console",
        log_level="WARNING",
        **extra,
    )


@dataclass
class Run:
    request_id: str
    verdict: Verdict
    report: Report
    violations: list[Violation]
    log: str
    private_test_log: bool


@pytest.fixture(scope="module")
async def one_request(
    secured: SecuredServer, standin_bin: Path, assets_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    """The topology by admin, one worker per stage as its own user, a request submitted and
    awaited by `agent`, its report read by `dashboard`; then the workers stop."""
    home = tmp_path_factory.mktemp("secured-home")

    def settings(user: str, **extra: object) -> Settings:
        return user_settings(secured, user, home, standin_bin, assets_dir, **extra)

    admin = await Bus.connect(settings("admin"), name="ftbus-topology")
    await admin.ensure_topology()
    await admin.close()

    stop = asyncio.Event()
    buses: list[Bus] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for stage, user in STAGE_USERS.items():
            bus = await Bus.connect(settings(user), name=f"ftbus-{stage.value}")
            buses.append(bus)
            await bus.guard(bus.ensure_topology())  # as `ftbus worker STAGE` does
            tasks.append(asyncio.create_task(run_services(bus, [stage], 1, stop)))
        await asyncio.sleep(0.5)  # the durable consumers exist
        async with Client(settings=settings("agent")) as agent:
            rid = await agent.submit(write_workspace(home / "ws", train={"standin_accuracy_every": 1}), TASK)
            try:
                verdict = await agent.wait(rid, timeout_s=120)
            except WaitTimeout:
                view = await agent.status(rid)
                crashed = [f"{t.get_name()}: {t.exception()!r}" for t in tasks if t.done() and t.exception()]
                raise AssertionError(
                    f"no verdict in 120 s; status {view.model_dump_json() if view else None}; "
                    f"crashed workers {crashed}; violations {secured.violations()}"
                ) from None
            assert isinstance(verdict, Verdict)
            view = await agent.status(rid)
            assert view is not None and view.status == verdict.status
            # `ftbus compare` reads what the agent may read (verdicts and status views): its refusal of an
            # unknown second request comes after reading both sides, with no permission denied.
            from ftbus.compare import NotComparable, compare_requests

            with pytest.raises(NotComparable, match="unknown request 20990101-000000-00000000"):
                await compare_requests(agent, rid, "20990101-000000-00000000")
            campaign = await agent.campaign("perm-campaign")  # `ftbus campaign NAME`, as the agent
            assert campaign is not None and campaign.incumbent == rid
        async with Client(settings=settings("dashboard", client_name="dashboard")) as dashboard:
            report = await dashboard.wait_report(rid, timeout_s=60)
            assert isinstance(report, Report)
            private = await dashboard.bus.private_artifacts()
            private_test_log = await private.stat(f"{rid}/logs/benchmark-test.log") is not None
            full = await (await dashboard.bus.kv(dashboard.bus.subjects.kv_requests)).get(rid)
            assert full.value and b"benchmark_test" in full.value
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=15)
        for bus in buses:
            await bus.close()
    return Run(rid, verdict, report, secured.violations(), secured.log_text(), private_test_log)


async def test_one_request_through_per_user_workers_has_no_permission_violation(one_request: Run) -> None:
    assert one_request.violations == [], "\n".join(map(str, one_request.violations))
    assert "Violation" not in one_request.log
    assert "Authorization Error" not in one_request.log
    verdict, report = one_request.verdict, one_request.report
    assert verdict.status == "completed", verdict.execution
    assert verdict.final_decision is True
    assert verdict.result.campaign is not None and verdict.result.campaign.accepted  # the judge wrote the record
    assert "benchmark_test" not in verdict.model_dump()
    assert report.benchmark_test is not None and report.benchmark_test.item_ids
    assert one_request.private_test_log
    # Per-item outcomes: the agent's verdict holds the validation items' (the candidate's and the base
    # model's, paired); the test items' are in the report only.
    bench, baseline = verdict.result.benchmark, verdict.result.baseline
    assert bench is not None and baseline is not None
    validation = {s: list(items) for s, items in bench.item_scores.items()}
    assert validation == bench.item_ids and {s: list(v) for s, v in baseline.baseline.item_scores.items()} == validation
    assert baseline.paired is not None and baseline.paired.items == sum(map(len, validation.values()))
    test_ids = {i for ids in report.benchmark_test.item_ids.values() for i in ids}
    assert {i for items in report.benchmark_test.item_scores.values() for i in items} == test_ids
    assert not test_ids & {i for ids in validation.values() for i in ids}
    test_baseline = report.benchmark_test_baseline
    assert test_baseline is not None and test_baseline.paired is not None
    assert {i for items in test_baseline.baseline.item_scores.values() for i in items} == test_ids
    assert "benchmark_test_baseline" not in verdict.model_dump()


def test_the_table_covers_every_user_of_accounts_conf() -> None:
    users = config_users()
    assert set(users) == {*USERS, "sys"}, f"accounts.conf users {users}: give each new user a column"


# ---------------------------------------------------------------------- the table


async def _check_cell(bus: Bus, ctx: Context, op: Op, server: SecuredServer, user: str) -> str | None:
    """None when the cell holds; otherwise what went wrong."""
    start = server.log_size()
    try:
        try:
            await asyncio.wait_for(op.run(bus, ctx), timeout=60)
        except (TimeoutError, nats.errors.TimeoutError):
            if user not in op.allowed:
                raise  # a denial must be the server's refusal, never a timeout: no second chance
            # An allowed operation that stalled once on a loaded machine gets one more try; a
            # refusal on the second try is still reported as one.
            await asyncio.wait_for(op.run(bus, ctx), timeout=60)
    except PermissionDenied as denied:
        if user in op.allowed:
            return f"ALLOWED expected, refused: {denied}"
        if op.target.lower() not in denied.subject.lower():
            return f"refused, but for {denied.subject!r}, not for something of {op.target!r}"
        # The server's own record of it: this user, this subject.
        deadline = time.monotonic() + 60  # hang guard: the server logs it at once; found, it returns
        while time.monotonic() < deadline:
            if any(v.user == user and v.subject == denied.subject for v in server.violations(start)):
                return None
            await asyncio.sleep(0.05)
        return f"refused ({denied}), but the server logged no violation for {user} on {denied.subject}"
    except Exception as exc:
        verdict = "ALLOWED expected" if user in op.allowed else "DENIED expected"
        return f"{verdict}, got {type(exc).__name__}: {exc}"
    if user not in op.allowed:
        return "DENIED expected, but it worked"
    return None


@pytest.fixture(scope="module")
async def seeded(one_request: Run, secured: SecuredServer, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    settings = Settings(home=tmp_path_factory.mktemp("perm-home"), nats_url=secured.url("admin"),
                        subject_prefix="ftbus", log_format="console", log_level="WARNING")
    admin = await Bus.connect(settings, name="ftbus-topology")
    try:
        await seed(admin)
    finally:
        await admin.close()
    return settings


@pytest.mark.parametrize("user", USERS)
async def test_permission_table(user: str, seeded: Settings, secured: SecuredServer) -> None:
    admin = await Bus.connect(seeded, name="ftbus-topology")
    bus = await Bus.connect(seeded.model_copy(update={"nats_url": secured.url(user)}), name=CONNECTION_NAMES[user])
    ctx = Context(admin=admin, user=user)
    wrong: list[str] = []
    try:
        for op in TABLE:
            problem = await _check_cell(bus, ctx, op, secured, user)
            if problem:
                wrong.append(f"{user} / {op.name}: {problem}")
            assert bus.nc.is_connected, f"{user}'s connection dropped after {op.name}"
    finally:
        for undo in ctx.cleanup:
            with contextlib.suppress(Exception):
                await undo()
        await bus.close()
        await admin.close()
    assert not wrong, "\n".join(wrong)


async def test_the_system_user_sees_nothing_of_the_ftbus_account(seeded: Settings, secured: SecuredServer) -> None:
    """`sys` lives in the system account: no JetStream there, and ftbus subjects are another world."""
    import json

    import nats

    sys_nc = await nats.connect(secured.url("sys"))
    admin = await nats.connect(secured.url("admin"))
    try:
        answer = await sys_nc.request("$JS.API.STREAM.MSG.GET.FTBUS_TEST", b'{"seq": 1}', timeout=60)  # hang guard
        error = json.loads(answer.data)["error"]
        assert error["err_code"] == 10039, error  # "JetStream not enabled for account"
        sub = await sys_nc.subscribe("ftbus.>")
        await sys_nc.flush()
        await admin.publish("ftbus.report.probe", b"x")
        await admin.flush()
        # Once the admin's flush is answered, the server has routed its message: had it crossed into
        # this account, it would be queued for `sys` before a marker `sys` publishes only now. So the
        # first message here is the marker, by order, not by a wait that is "long enough".
        await sys_nc.publish("ftbus.report.marker", b"m")
        first = await sub.next_msg(timeout=60)  # hang guard: the marker comes at once
        assert (first.subject, first.data) == ("ftbus.report.marker", b"m")  # the admin's is in FTBUS only
    finally:
        await sys_nc.close()
        await admin.close()


# ---------------------------------------------------------------------- a refused user's error


def _cli(*args: str, url: str, home: Path, client_name: str = "ftbus-client") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FTBUS_NATS_URL": url, "FTBUS_HOME": str(home), "FTBUS_SUBJECT_PREFIX": "ftbus",
           "FTBUS_CLIENT_NAME": client_name, "FTBUS_LOG_LEVEL": "WARNING"}
    return subprocess.run([sys.executable, "-m", "ftbus.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)


async def test_the_cli_says_permission_denied_for_the_agents_report(
    one_request: Run, secured: SecuredServer, tmp_path: Path
) -> None:
    started = time.monotonic()
    refused = await asyncio.to_thread(_cli, "get", one_request.request_id, "--report",
                                      url=secured.url("agent"), home=tmp_path)
    elapsed = time.monotonic() - started
    assert refused.returncode == 2, refused
    assert "permission denied for $JS.API.STREAM.MSG.GET.FTBUS_REPORTS" in refused.stderr, refused.stderr
    assert "timeout" not in refused.stderr.lower()
    # Hang guard: the refusal comes at once; a refusal missed would end in the request timeout that
    # the stderr checks above catch, or never.
    assert elapsed < 60
    # The same user may read the verdict, and the dashboard the report.
    ok = await asyncio.to_thread(_cli, "get", one_request.request_id, "--json", url=secured.url("agent"),
                                 home=tmp_path)
    assert ok.returncode == 0, ok.stderr
    report = await asyncio.to_thread(_cli, "get", one_request.request_id, "--report", "--json",
                                     url=secured.url("dashboard"), home=tmp_path, client_name="dashboard")
    assert report.returncode == 0, report.stderr
    assert "benchmark_test" in report.stdout


async def test_the_client_raises_permission_denied_at_once(
    one_request: Run, secured: SecuredServer, seeded: Settings
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    agent = seeded.model_copy(update={"nats_url": secured.url("agent")})
    async with Client(settings=agent) as client:
        with pytest.raises(PermissionDenied) as refused:
            await client.report(one_request.request_id)
        assert refused.value.subject == "$JS.API.STREAM.MSG.GET.FTBUS_REPORTS"
        assert refused.value.operation == "publish"
        assert str(refused.value).startswith("permission denied for $JS.API.STREAM.MSG.GET.FTBUS_REPORTS")
        # Waiting for the report would otherwise wait forever: its consumer is refused.
        with pytest.raises(PermissionDenied) as refused_wait:
            await client.wait_report(one_request.request_id)
        assert refused_wait.value.subject.startswith("$JS.API.CONSUMER.CREATE.FTBUS_REPORTS")
        # What the agent may do still works on the same connection.
        verdict = await client.get(one_request.request_id)
        assert isinstance(verdict, Verdict) and verdict.request_id == one_request.request_id
    # A worker's credentials with the client: its inbox `_INBOX.ftbus-client.>` is not the judge's,
    # so the very first request's reply subscription is refused.
    judge = seeded.model_copy(update={"nats_url": secured.url("judge")})
    with pytest.raises(PermissionDenied) as refused_sub:
        await Client(settings=judge).connect()
    assert refused_sub.value.operation == "subscribe"
    assert refused_sub.value.subject.startswith("_INBOX.ftbus-client.")
    assert loop.time() - started < 60  # hang guard: a refused subscription otherwise waits forever


# ---------------------------------------------------------------------- the agent's model


async def test_the_agent_pulls_its_model_and_reads_no_other_object(
    one_request: Run, secured: SecuredServer, seeded: Settings, tmp_path: Path
) -> None:
    from ftbus.pull import pull
    from services.aggregator.retention import Retention
    from services.aggregator.store import RecordStore
    from shared.retention import RANKING

    rid = one_request.request_id
    # The aggregator's retention sweep, as its own user, a year on: the request leads its board
    # (the only one on it), so its outputs stay, and its ranking is written beside them.
    aggregate = await Bus.connect(seeded.model_copy(update={"nats_url": secured.url("aggregate")}),
                                  name="ftbus-aggregate")
    try:
        assert await aggregate.guard(Retention(aggregate, RecordStore(aggregate)).sweep(now=time.time() + 3e7)) == []
        assert await (await aggregate.models_artifacts()).stat(f"{rid}/{RANKING}") is not None
    finally:
        await aggregate.close()
    agent = seeded.model_copy(update={"nats_url": secured.url("agent")})
    async with Client(settings=agent) as client:
        pulled = await pull(client, rid, tmp_path / "model")
        assert "adapter_model.safetensors" in pulled.files
        for ref in one_request.verdict.artifacts:
            assert (tmp_path / "model" / ref.path.removeprefix("output/")).stat().st_size == ref.ref.size
        # Another stage's object (the data stage's data.json) and the hidden test split's log: refused.
        for store, name in ((await client.bus.artifacts(), f"{rid}/data/data.json"),
                            (await client.bus.private_artifacts(), f"{rid}/logs/benchmark-test.log")):
            with pytest.raises(PermissionDenied) as refused:
                await client.bus.guard(store.stat(name))
            stream = "OBJ_ftbus_private" if "test" in name else "OBJ_ftbus_artifacts"
            assert str(refused.value).startswith(f"permission denied for $JS.API.STREAM.MSG.GET.{stream}")
