"""`make cluster`: the containerised deployment (deploy/compose/cluster.yaml) run as an operator
would, under faults, then the chaos checker's table.

    python -m chaos.cluster_run                 # 40 requests, 6 faults, ~6 min on 2 cores
    python -m chaos.cluster_run --requests 10   # shorter

From the images `make images` built: three NATS nodes (the repository's cluster.conf and
accounts.conf), two workers of every stage, each a container connecting as its stage's NATS user,
the dashboard; candidate code in sandbox containers that the workers start through this host's
engine. The sandbox image is ftbus-sandbox with the stand-in llamafactory-cli and lm_eval
(tests/standin/, as `make chaos` uses them), so that a request takes seconds on 2 cores.

Network: the project's own bridge network (created and removed by the run) and ports published on
127.0.0.1 only. At the end everything is torn down, and the checker's "leftovers" row lists any
container, network, volume or process of the run that is still there. Exit status 1 when the checker
finds a lost, duplicated or wrong verdict, a crashed worker or a leftover.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections import Counter
from pathlib import Path

from chaos.checker import Result, check
from chaos.containers import (
    Compose,
    ComposeUnavailable,
    ContainerCluster,
    ContainerServices,
    docker,
    sandbox_leftovers,
)
from chaos.faults import Faults
from chaos.load import Load
from chaos.retry import retry
from chaos.run import connect_retrying, explain_missing, find_stale_views, tap_verdicts
from chaos.services import leftovers, standin_assets
from ftbus.client import Client
from shared.events import Stage
from shared.logs import setup_logging
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[1]
CLUSTER_FILE = REPO / "deploy" / "compose" / "cluster.yaml"
NODES = ("nats-0", "nats-1", "nats-2")
USERS = ("admin", "aggregate", "data", "train", "bench", "judge", "agent", "dashboard", "sys")
IMAGES = ("ftbus-services:latest", "ftbus-sandbox:latest")
#: Seconds from the first submit: a worker killed, the events leader killed, a trainer frozen past
#: ack_wait, an aggregator restarted, a node killed, another worker killed.
SCHEDULE: list[tuple[float, str]] = [
    (10, "kill_worker"), (25, "kill_leader"), (45, "stop_worker"), (65, "restart_aggregator"),
    (80, "kill_node"), (95, "kill_worker"),
]


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def standin_image() -> str:
    """ftbus-sandbox with the stand-in tools (chaos/standin.Dockerfile), tagged with the version."""
    tag = f"ftbus-sandbox-standin:{version()}"
    docker("build", "--quiet", "--force-rm", "-f", str(REPO / "chaos" / "standin.Dockerfile"), "-t", tag,
           str(REPO / "tests" / "standin"), timeout=600)
    return tag


def cluster_env(root: Path, project: str, sandbox_image: str, ack_wait_s: float) -> dict[str, str]:
    """The variables of cluster.yaml for this run: fresh passwords, this run's folders, fast timings."""
    env = {f"NATS_{user.upper()}_PASSWORD": secrets.token_hex(16) for user in USERS}
    env.update({
        "FTBUS_CLUSTER_NAME": project,
        "FTBUS_HOST_ASSETS": str(standin_assets(root / "assets")),
        "FTBUS_SANDBOX_HOST_DIR": str(root / "sandbox"),
        "FTBUS_SANDBOX_IMAGE": sandbox_image,
        "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
        "FTBUS_LOG_LEVEL": "WARNING",
        "FTBUS_ACK_WAIT_S": str(ack_wait_s),
        "FTBUS_HEARTBEAT_S": "1",
        "FTBUS_RETRY_BACKOFF_S": "[0.5, 1.0, 2.0, 4.0]",
        "FTBUS_SWEEP_INTERVAL_S": "2",
        "FTBUS_BENCH_ENGINE": "cold",  # the stand-in lm_eval is a command, not the warm engine's harness
        # Delivery under faults, not what "better" means: the stand-in benchmark has no confirmation
        # pool, under which the default policy refuses every candidate ("pass" requests expect true).
        "FTBUS_JUDGE_POLICY": "llm",
    })
    return env


def client_settings(compose: Compose, user: str, password: str, name: str) -> Settings:
    urls = ",".join(f"nats://{user}:{password}@127.0.0.1:{compose.port(node, 4222)}" for node in NODES)
    return Settings(nats_url=urls, subject_prefix="ftbus", client_name=name, stream_replicas=3,
                    home=Path(tempfile.gettempdir()) / "ftbus-cluster-client", log_format="console",
                    log_level="ERROR")


async def wait_for_workers(admin: Client, timeout_s: float = 180.0) -> None:
    """Until every stage's durable consumer has a worker pulling from it."""
    s = admin.bus.subjects
    deadline = time.monotonic() + timeout_s
    missing: list[str] = []
    while time.monotonic() < deadline:
        missing = []
        for stage in Stage:
            try:
                info = await admin.bus.js.consumer_info(s.stream_events, s.durable(stage))
                if not info.num_waiting:
                    missing.append(stage.value)
            except Exception:
                missing.append(stage.value)
        if not missing:
            return
        await asyncio.sleep(1)
    raise TimeoutError(f"no worker pulling for {missing} after {timeout_s:.0f} s: see `docker compose logs`")


async def run(args: argparse.Namespace, root: Path, compose: Compose, env: dict[str, str]) -> tuple[Result, list[str]]:
    cluster = ContainerCluster(compose, list(NODES))
    services = ContainerServices(compose, per_stage=2)
    agent = admin = None
    started = time.monotonic()
    compose("up", "-d", "--pull", "never")
    print(f"  cluster up in {time.monotonic() - started:.0f} s "
          f"(dashboard: http://127.0.0.1:{compose.port('dashboard', 8470)}/)", flush=True)
    try:
        admin = await connect_retrying(client_settings(compose, "admin", env["NATS_ADMIN_PASSWORD"], "chaos-checker"))
        agent = await connect_retrying(client_settings(compose, "agent", env["NATS_AGENT_PASSWORD"], "ftbus-client"))
        await wait_for_workers(admin)
        print(f"  every stage has workers, {time.monotonic() - started:.0f} s after start", flush=True)
        users, wrong_users = await asyncio.to_thread(connection_users, compose)
        print("  NATS users of the connections: " + ", ".join(f"{k} {v}" for k, v in sorted(users.items())), flush=True)
        subjects = admin.bus.subjects
        published, published_counts = await tap_verdicts(admin)
        load = Load(root / "ws", count=args.requests, rate_s=args.rate, seed=args.seed)
        load.plan()

        async def leader() -> str | None:
            info = await admin.bus.js.stream_info(subjects.stream_events)
            return info.cluster.leader if info.cluster else None

        faults = Faults(cluster, services, args.ack_wait, SCHEDULE, leader_of=leader, seed=args.seed)  # type: ignore[arg-type]
        stop_faults = asyncio.Event()
        fault_task = asyncio.create_task(faults.run(stop_faults))
        load_started = time.monotonic()
        await load.run(agent, deadline_s=args.deadline)
        stop_faults.set()
        await fault_task
        print(f"  load done in {time.monotonic() - load_started:.0f} s", flush=True)
        await load.wait_more(agent, 90)

        info = await retry(lambda: admin.bus.js.stream_info(subjects.stream_verdicts, subjects_filter=">"))
        stream_counts = dict(info.state.subjects or {})
        await explain_missing(admin, load)
        stale = await find_stale_views(agent, load)
        crashed = await asyncio.to_thread(services.crashed)
    finally:
        for client in (agent, admin):
            if client is not None:
                await client.close()
        left = await asyncio.to_thread(teardown, compose, env["FTBUS_CLUSTER_NAME"], root)
    result = check(load.requests, stream_counts, published, published_counts, [], faults.done,
                   subjects.verdict)
    result.leftovers = left
    result.crashed = crashed
    result.stale_views = stale
    result.crashed += wrong_users  # a worker on another stage's user fails the run as a crash does
    ran_under = Counter(str(req.verdict.sandbox) for req in load.requests if req.verdict is not None)
    print("  candidate code ran under: " + ", ".join(f"{k} x{v}" for k, v in sorted(ran_under.items())), flush=True)
    return result, faults.log


def connection_users(compose: Compose) -> tuple[Counter[str], list[str]]:
    """Each node's client connections (its monitoring endpoint, /connz?auth=true): how many per
    (connection name -> NATS user), and every worker connection that is not on its stage's user."""
    users: Counter[str] = Counter()
    wrong = []
    for node in NODES:
        url = f"http://127.0.0.1:{compose.port(node, 8222)}/connz?auth=true&limit=1024"
        with urllib.request.urlopen(url, timeout=10) as resp:
            conns = json.load(resp).get("connections") or []
        for conn in conns:
            name, user = conn.get("name", ""), conn.get("authorized_user", "?")
            users[f"{name}->{user}"] += 1
            stage = name.removeprefix("ftbus-")
            if name.startswith("ftbus-") and stage in ContainerServices.STAGES and user != stage:
                wrong.append(f"connection {name} on {node} is user {user}, not {stage}")
    per_stage = {stage: users[f"ftbus-{stage}->{stage}"] for stage in ContainerServices.STAGES}
    wrong += [f"{n} {stage} worker connection(s), not 2" for stage, n in per_stage.items() if n < 2]
    return users, wrong


def teardown(compose: Compose, project: str, root: Path) -> list[str]:
    """`down -v`, then what is left of the run: containers, networks, volumes, sandboxes, processes."""
    compose("down", "-v", "--remove-orphans", "-t", "45", check=False)
    left = compose.leftovers()
    sandboxes = sandbox_leftovers(project + "-")
    if sandboxes:  # reported, then removed: a worker stopped by `down` must not leave any
        left += [f"sandbox container {cid}" for cid in sandboxes]
        docker("rm", "-f", *sandboxes, check=False)
    left += [f"process {pid} {cmd}" for pid, cmd in leftovers(root)]
    return left


def preflight() -> str | None:
    """Why the run cannot start here, or None."""
    if docker("info", check=False, timeout=30) == "":
        return "no Docker engine answers: `make docker` (or deploy/sandbox/engine.sh)"
    for image in IMAGES:
        if not docker("image", "ls", "-q", image, check=False):
            return f"image {image} is missing: run `make images` first"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=2.5, help="seconds between submits")
    parser.add_argument("--deadline", type=float, default=360, help="seconds for the load, verdicts included")
    parser.add_argument("--ack-wait", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    setup_logging("console", "ERROR")
    started = time.monotonic()
    problem = preflight()
    if problem:
        print(f"make cluster cannot run: {problem}", file=sys.stderr)
        return 2
    project = "ftbus-cluster-" + secrets.token_hex(3)
    with tempfile.TemporaryDirectory(prefix="ftbus-cluster-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the workers' uid 10001 reads the assets below it
        try:
            image = standin_image()
            env = cluster_env(root, project, image, args.ack_wait)
            env_file = root / "cluster.env"
            env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
            compose = Compose(CLUSTER_FILE, project, env_file)
        except (ComposeUnavailable, RuntimeError) as exc:
            print(f"make cluster cannot run: {exc}", file=sys.stderr)
            return 2
        print(f"  project {project}: 3 NATS nodes, 2 workers per stage, sandbox image {image}", flush=True)
        result, fault_log = asyncio.run(run(args, root, compose, env))
    print(result.table())
    print(f"cluster run: {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            "failed": result.failed, "requests": result.requests, "ok": result.ok, "lost": result.lost,
            "duplicated": result.duplicated, "wrong": result.wrong, "errors": dict(result.errors),
            "leftovers": result.leftovers, "crashed": result.crashed, "faults": dict(result.faults),
            "p50": result.percentile(50), "p99": result.percentile(99), "fault_log": fault_log,
            "seconds": round(time.monotonic() - started),
        }, indent=2))
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
