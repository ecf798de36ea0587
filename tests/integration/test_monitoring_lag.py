"""Under a burst, the NATS monitoring endpoint reports each stage's lag exactly as KEDA reads it.

KEDA's `nats-jetstream` scaler (deploy/k8s-keda/scaledobjects.yaml) GETs
``/jsz?acc=<account>&config=true&consumers=true`` (the query of KEDA 2.20.2, keys sorted as Go's
``url.Values.Encode`` writes them), finds the account by name, the stream, then the consumer, and
scales on ``num_pending + num_ack_pending`` (a consumer it cannot find is an error). The same
lookup is done here against a real nats-server, with the stages' own durable consumers:

- on the embedded server (``ftbus up``: no accounts, so the global account ``$G``), whose
  monitoring port ftbus/embedded.py opens on loopback;
- on the deployment's own configuration (deploy/nats/, account FTBUS, each stage as its own user),
  reading account, stream and consumer from the ScaledObjects themselves.

Both forms of the query are checked: KEDA's, and the one with ``accounts=true`` that a later KEDA
may send (kedacore/keda#8166); nats-server answers a named account the same either way.
A burst of requests lands while no data worker runs: the data consumer's lag is the burst. A data
worker then holds messages that cannot finish (their process_data.py waits for a gate file): the
lag does not drop, because in-flight messages count. Then everything runs and every lag is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftbus.cli import run_services
from ftbus.client import Client
from ftbus.embedded import EmbeddedServer
from shared.bus import Bus
from shared.events import Stage, TaskSpec
from shared.settings import Settings
from tests.integration.conftest import write_workspace
from tests.integration.permission_table import STAGE_USERS
from tests.integration.secured_nats import REPO, SecuredServer

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")
SCALED_OBJECTS = REPO / "deploy" / "k8s-keda" / "scaledobjects.yaml"
BURST = 4


# ---------------------------------------------------------------------------- KEDA's reading


@dataclass(frozen=True)
class Trigger:
    """One nats-jetstream trigger: what KEDA looks up."""

    account: str
    stream: str
    consumer: str


@dataclass(frozen=True)
class Lag:
    pending: int
    ack_pending: int

    @property
    def keda(self) -> int:
        return self.pending + self.ack_pending  # getMaxMsgLag


def keda_url(endpoint: str, account: str, *, accounts: bool = False) -> str:
    """The scaler's URL: scheme://endpoint/jsz + the query, keys sorted and escaped as Go does."""
    params = {"acc": account, "consumers": "true", "config": "true"}
    if accounts:
        params["accounts"] = "true"  # kedacore/keda#8166
    return f"http://{endpoint}/jsz?{urllib.parse.urlencode(sorted(params.items()))}"


def read_lag(doc: dict[str, Any], trigger: Trigger) -> Lag:
    """KEDA's lookup in the /jsz answer: account by name, stream, consumer; missing = error."""
    for account in doc.get("account_details") or []:
        if account.get("name") != trigger.account:
            continue
        for stream in account.get("stream_detail") or []:
            if stream.get("name") != trigger.stream:
                continue
            for consumer in stream.get("consumer_detail") or []:
                if consumer.get("name") == trigger.consumer:
                    return Lag(int(consumer.get("num_pending", 0)), int(consumer.get("num_ack_pending", 0)))
            raise LookupError(f"consumer {trigger.consumer!r} not found in stream {trigger.stream!r}")
        raise LookupError(f"stream {trigger.stream!r} not found in account {trigger.account!r}")
    raise LookupError(f"account {trigger.account!r} not in the answer (keys {sorted(doc)})")


async def get_json(url: str) -> dict[str, Any]:
    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=60) as response:  # hang guard
            return json.load(response)

    return await asyncio.to_thread(fetch)


class Monitor:
    """KEDA's view of a set of triggers, through both forms of the query."""

    def __init__(self, endpoint: str, triggers: dict[str, Trigger]) -> None:
        self.endpoint = endpoint
        self.triggers = triggers
        (self.account,) = {t.account for t in triggers.values()}

    async def lags(self) -> dict[str, Lag]:
        keda = await get_json(keda_url(self.endpoint, self.account))
        later = await get_json(keda_url(self.endpoint, self.account, accounts=True))
        assert "meta_cluster" not in keda or keda["meta_cluster"].get("cluster_size", 1) <= 1  # standalone path
        found = {name: read_lag(keda, trigger) for name, trigger in self.triggers.items()}
        # The accounts=true form names the same consumers (the lag may move between the two GETs).
        for trigger in self.triggers.values():
            read_lag(later, trigger)
        return found

    async def until(self, what: str, ok: Callable[[dict[str, Lag]], bool], timeout_s: float = 120.0) -> dict[str, Lag]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last: dict[str, Lag] | str = "no answer yet"
        while loop.time() < deadline:
            try:
                last = await self.lags()
                if ok(last):
                    return last
            except LookupError as exc:
                last = f"not found: {exc}"
            await asyncio.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout_s:.0f} s; KEDA would read {last}")


# ---------------------------------------------------------------------------- the pipeline


class Workers:
    """One task per stage, each on its own connection (as `ftbus worker STAGE`), stoppable apart."""

    def __init__(self, settings_for: Callable[[Stage], Settings]) -> None:
        self.settings_for = settings_for
        self.running: dict[Stage, tuple[asyncio.Event, asyncio.Task[None], Bus]] = {}

    async def start(self, stages: list[Stage], concurrency: int = 2) -> None:
        for stage in stages:
            bus = await Bus.connect(self.settings_for(stage), name=f"ftbus-{stage.value}")
            await bus.guard(bus.ensure_topology())
            stop = asyncio.Event()
            task = asyncio.create_task(run_services(bus, [stage], concurrency, stop), name=stage.value)
            self.running[stage] = (stop, task, bus)

    async def stop(self, stages: list[Stage] | None = None) -> None:
        for stage in list(stages or self.running):
            stop, task, bus = self.running.pop(stage)
            stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
            await bus.close()

    def crashed(self) -> list[str]:
        return [f"{s.value}: {t.exception()!r}" for s, (_, t, _) in self.running.items()
                if t.done() and not t.cancelled() and t.exception()]


def gated_workspace(root: Path, gate: Path, index: int) -> Path:
    """A workspace whose process_data.py waits for ``gate`` (unique per index: no data-cache hit)."""
    script = (
        "import json, os, time\n"
        f"# request {index}\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.05)\n"
        "records = [{'instruction': f'add {i} and {i}', 'input': '', 'output': str(2 * i)} for i in range(40)]\n"
        "json.dump(records, open('data.json', 'w'))\n"
    )
    return write_workspace(root / f"ws{index}", script=script)


async def burst_then_drain(monitor: Monitor, workers: Workers, client: Client, tmp_path: Path,
                           names: dict[Stage, str]) -> None:
    """The scenario; ``names`` maps each stage to its trigger's key in ``monitor.triggers``."""
    data, aggregate = names[Stage.data], names[Stage.aggregate]
    others = [names[s] for s in (Stage.train, Stage.bench, Stage.judge)]

    # Each stage's first worker creates its durable consumer, which outlives it: the consumer a
    # scaled-to-zero stage is woken by.
    await workers.start(list(Stage))
    await monitor.until("every stage's consumer exists", lambda lags: all(x.keda == 0 for x in lags.values()))
    await workers.stop()
    idle = await monitor.lags()
    assert all(lag.keda == 0 for lag in idle.values()), idle

    # A burst while no worker runs: the data stage's lag is the burst (and the aggregator's, which
    # reads every event); nothing has reached the later stages.
    gate = tmp_path / "gate"
    rids = [await client.submit(gated_workspace(tmp_path, gate, i), TASK) for i in range(BURST)]
    lags = await monitor.until(f"a lag of {BURST} on {data}", lambda lags: lags[data].keda == BURST)
    assert lags[data] == Lag(pending=BURST, ack_pending=0), lags
    assert lags[aggregate].keda == BURST, lags
    assert all(lags[name].keda == 0 for name in others), lags

    # A data worker takes messages it cannot finish yet (the gate is shut): they leave num_pending
    # for num_ack_pending, and the lag KEDA reads stays the burst. In-flight messages count.
    await workers.start([Stage.data], concurrency=2)
    lags = await monitor.until("the data worker to hold messages", lambda lags: lags[data].ack_pending >= 1)
    for _ in range(5):
        assert lags[data].keda == BURST and lags[data].ack_pending >= 1, lags
        await asyncio.sleep(0.2)
        lags = await monitor.lags()

    # Everything runs: every request gets its verdict and every stage's lag goes back to 0.
    gate.touch()
    await workers.start([Stage.train, Stage.bench, Stage.judge, Stage.aggregate])
    for rid in rids:
        try:
            verdict = await client.wait(rid, timeout_s=180)
        except Exception as exc:
            raise AssertionError(f"no verdict for {rid}: {exc!r}; crashed workers {workers.crashed()}") from exc
        assert verdict.status == "completed", verdict.execution
    await monitor.until("every lag back to 0", lambda lags: all(x.keda == 0 for x in lags.values()), 60)
    await workers.stop()


# ---------------------------------------------------------------------------- the two servers


def stage_triggers(prefix_subjects: Any, account: str) -> dict[str, Trigger]:
    return {stage.value: Trigger(account, prefix_subjects.stream_events, prefix_subjects.durable(stage))
            for stage in Stage}


async def test_the_embedded_server_reports_each_stage_lag_as_keda_reads_it(
    nats_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    assert nats_server.monitor_port is not None
    varz = await get_json(nats_server.monitor_url + "/varz")
    assert varz["http_host"] == "127.0.0.1", "the monitoring port must listen on loopback only"
    assert varz["http_port"] == nats_server.monitor_port
    from shared.subjects import Subjects

    # No accounts configured: everything is in the global account, "$G" (sent as acc=%24G).
    monitor = Monitor(f"127.0.0.1:{nats_server.monitor_port}", stage_triggers(Subjects(settings.subject_prefix), "$G"))
    workers = Workers(lambda stage: settings)
    async with Client(settings=settings) as client:
        try:
            await burst_then_drain(monitor, workers, client, tmp_path, {s: s.value for s in Stage})
        finally:
            await workers.stop()


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[SecuredServer]:
    server = SecuredServer(tmp_path / "secured-nats")
    server.root.mkdir()
    server.start()
    yield server
    server.stop()


def manifest_triggers() -> dict[str, Trigger]:
    """Every nats-jetstream trigger of the ScaledObjects, keyed ``<scaled object>/<consumer>``."""
    found = {}
    for doc in yaml.safe_load_all(SCALED_OBJECTS.read_text()):
        for trigger in doc["spec"]["triggers"]:
            meta = trigger["metadata"]
            found[f"{doc['metadata']['name']}/{meta['consumer']}"] = Trigger(meta["account"], meta["stream"],
                                                                              meta["consumer"])
    return found


async def test_the_deployed_config_reports_the_lag_the_scaled_objects_read(
    secured: SecuredServer, standin_bin: Path, assets_dir: Path, tmp_path: Path
) -> None:
    def settings(user: str, **extra: object) -> Settings:
        return Settings(
            home=tmp_path / "home" / user, assets_dir=assets_dir, nats_url=secured.url(user),
            subject_prefix="ftbus",  # accounts.conf and the ScaledObjects are written for it
            toolchain_bin=standin_bin, ack_wait_s=4.0, heartbeat_s=1.0, max_deliver=3, retry_backoff_s=[0.2, 0.5],
            sweep_interval_s=1.0, log_format="console", log_level="WARNING", **extra,
        )

    admin = await Bus.connect(settings("admin"), name="ftbus-topology")  # the topology job
    await admin.ensure_topology()
    await admin.close()

    # The ScaledObjects' own triggers, read by KEDA's lookup on the repository's server config;
    # only the endpoint's host differs (loopback here, the headless service in a cluster).
    triggers = manifest_triggers()
    names = {stage: f"ftbus-{stage.value}/ftbus-{stage.value}" for stage in Stage}
    assert set(names.values()) <= set(triggers)
    monitor = Monitor(f"127.0.0.1:{secured.http_port}", triggers)
    workers = Workers(lambda stage: settings(STAGE_USERS[stage]))
    async with Client(settings=settings("agent")) as agent:
        try:
            await burst_then_drain(monitor, workers, agent, tmp_path, names)
        finally:
            await workers.stop()
    # The aggregator's second trigger (the hidden test split's stream) was read throughout too.
    assert (await monitor.lags())["ftbus-aggregate/ftbus-aggregate-test"].keda == 0
    assert not secured.violations(), secured.violations()
