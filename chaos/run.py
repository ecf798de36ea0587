"""`make chaos`: requests under scheduled faults on a 3-node cluster, then the checker's table.

    python -m chaos.run              # the full run: 3 nodes, 2 workers per stage, 140 requests, ~10 min
    python -m chaos.run --smoke      # a few faults, one partition, ~2 min (the pytest smoke test runs this)
    python -m chaos.run --loopback   # every process on loopback: no network faults

Each node, with the workers beside it, runs on its own host: a network namespace the run creates,
linked to the others through a bridge (chaos/network.py); the load and the checker are on that
bridge. Where namespaces cannot be made (not root, iproute2 or nftables missing) the run says why
and stays on loopback, without the network faults. Everything is under one temporary folder and
removed at the end, on failure too; the exit status is 1 when the checker finds a lost, duplicated
or wrong verdict, an unsubmitted request or a leftover process, namespace or link.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from chaos.ackloss import AckLoss, probe
from chaos.checker import Result, check, check_resumes
from chaos.cluster import Cluster
from chaos.faults import FULL_SCHEDULE, SMOKE_SCHEDULE, Faults, without_network
from chaos.load import Load
from chaos.network import Network, NetworkUnavailable
from chaos.retry import retry
from chaos.services import Services, leftovers, standin_assets, standin_toolchain
from ftbus.client import Client
from services.trainer.checkpoints import read_manifest_quietly
from shared import codec
from shared.events import Verdict
from shared.logs import setup_logging
from shared.settings import Settings


def settings_for(root: Path, cluster: Cluster, ack_wait_s: float) -> dict[str, Any]:
    return {
        "nats_url": cluster.url, "subject_prefix": "chaos" + secrets.token_hex(3), "home": str(root / "home"),
        "assets_dir": str(standin_assets(root / "assets")), "toolchain_bin": str(standin_toolchain(root / "bin")),
        "sandbox": "local", "bench_engine": "cold",  # stand-in tools: a command, not the harness
        # Delivery under faults, not what "better" means: the stand-in benchmark has no confirmation
        # pool, under which the default policy refuses every candidate ("pass" requests expect true).
        "judge_policy": "llm",
        "log_format": "json", "log_level": "WARNING", "stream_replicas": 3,
        "ack_wait_s": ack_wait_s, "heartbeat_s": 1.0, "max_deliver": 5, "retry_backoff_s": [0.5, 1.0, 2.0, 4.0],
        "sweep_interval_s": 2.0,
    }


async def chaos(args: argparse.Namespace, root: Path,
                network: Network | None) -> tuple[Result, list[AckLoss], list[str]]:
    cluster = Cluster(root / "nats", 3, sync_interval=args.sync_interval, network=network)
    cluster.start()
    cluster.wait_ready()
    config = settings_for(root, cluster, args.ack_wait)
    services = Services(root / "logs", config, per_stage=args.per_stage, network=network)
    client = None
    try:
        client = await connect_retrying(Settings(**config))
        subjects = client.bus.subjects
        published, published_counts = await tap_verdicts(client)
        services.start()
        load = Load(root / "ws", count=args.requests, rate_s=args.rate, seed=args.seed)
        load.plan()

        async def leader() -> str | None:
            info = await retry(lambda: client.bus.js.stream_info(subjects.stream_events), attempts=10)
            return info.cluster.leader if info.cluster else None

        schedule = SMOKE_SCHEDULE if args.smoke else FULL_SCHEDULE
        checkpoints = await client.bus.checkpoint_artifacts()

        async def checkpoint_step(rid: str) -> int | None:
            manifest = await read_manifest_quietly(checkpoints, rid)
            return manifest.step if manifest is not None else None

        faults = Faults(cluster, services, args.ack_wait, schedule if network else without_network(schedule),
                        submit_probe=lambda: load.extra(client), leader_of=leader, seed=args.seed,
                        resume_probe=lambda: load.extra(client, "resume"), checkpoint_step=checkpoint_step,
                        network=network, partition_s=8.0 if args.smoke else 15.0)
        stop_faults = asyncio.Event()
        fault_task = asyncio.create_task(faults.run(stop_faults))
        supervisor = asyncio.create_task(services.supervise(stop_faults))
        started = time.monotonic()
        await load.run(client, deadline_s=args.deadline)
        stop_faults.set()
        await fault_task
        await supervisor
        print(f"  load done in {time.monotonic() - started:.0f} s", flush=True)
        await load.wait_more(client, 90)  # requests the faults submitted themselves, stragglers

        info = await retry(lambda: client.bus.js.stream_info(subjects.stream_verdicts, subjects_filter=">"))
        stream_counts = dict(info.state.subjects or {})
        await explain_missing(client, load)
        stale_views = await find_stale_views(client, load)
        # Exits nobody asked for (the supervisor started those workers again), and workers down now.
        crashed = [f"{svc.name} exited {code}" for svc in services.all for code in svc.exits]
        crashed += [f"{svc.name} down (exit {svc.proc.returncode})" for svc in services.all
                    if svc.proc is not None and svc.proc.poll() is not None]
        ack_losses = []
        for mode, trials in (("leader", args.probe_trials), ("all", (args.probe_trials + 2) // 3)):
            if trials:
                ack_losses.append(await probe(cluster, trials, mode))
    finally:
        if client is not None:
            await client.close()
        services.stop()
        cluster.stop()
    left = await asyncio.to_thread(leftovers, root)
    result = check(load.requests, stream_counts, published, published_counts, left, faults.done, subjects.verdict)
    result.crashed = crashed
    check_resumes(result, load.requests, faults.resumes)
    result.stale_views = stale_views
    if result.failed and args.keep_logs:
        kept = args.keep_logs / time.strftime("chaos-%Y%m%d-%H%M%S")
        shutil.copytree(root / "logs", kept / "workers")
        for node in cluster.nodes:
            shutil.copy(node.log, kept / f"{node.name}.log")
        print(f"  logs kept in {kept}", flush=True)
    return result, ack_losses, faults.log


async def tap_verdicts(client: Client) -> tuple[dict[str, set[tuple[str, bool]]], Counter[str]]:
    """Every verdict published, as it is published (core subscription): per request, the distinct
    (status, decision) pairs and how many were published. The checker's evidence of duplicates."""
    published: dict[str, set[tuple[str, bool]]] = {}
    counts: Counter[str] = Counter()

    async def on_verdict(msg: Any) -> None:
        try:
            verdict = codec.decode(msg.data, Verdict)
        except codec.CodecError:
            return
        published.setdefault(verdict.request_id, set()).add((verdict.status, verdict.final_decision))
        counts[verdict.request_id] += 1

    await client.bus.nc.subscribe(client.bus.subjects.verdict(), cb=on_verdict)
    return published, counts


async def find_stale_views(client: Client, load: Load) -> list[str]:
    """Requests whose public view does not show the verdict they got."""
    stale = []
    for req in load.requests:
        if req.verdict is None:
            continue
        view = await retry(lambda rid=req.rid: client.status(rid))
        if view is None or view.status != req.verdict.status:
            stale.append(f"{req.rid} (view {view.status if view else 'missing'}, verdict {req.verdict.status})")
    return stale


async def explain_missing(client: Client, load: Load) -> None:
    """For each request without a verdict: where its record says it is, and each stage's backlog."""
    missing = [r for r in load.requests if r.verdict is None]
    if not missing:
        return
    for req in missing:
        try:
            view = await client.status(req.rid)
            where = (f"{view.status} at {view.stage}, attempts "
                     + ", ".join(f"{k}={v.attempts}" for k, v in view.stages.items())) if view else "no record"
        except Exception as exc:
            where = f"status unavailable: {exc}"
        print(f"  no verdict: {req.rid} ({req.kind}, submit attempts {req.submit_attempts}): {where}", flush=True)
    s = client.bus.subjects
    for stage in ("data", "train", "bench", "judge", "aggregate"):
        try:
            info = await client.bus.js.consumer_info(s.stream_events, f"{s.prefix}-{stage}")
            print(f"  consumer {stage}: pending {info.num_pending}, ack pending {info.num_ack_pending}, "
                  f"redelivered {info.num_redelivered}", flush=True)
        except Exception as exc:
            print(f"  consumer {stage}: {exc}", flush=True)


async def _probe_only(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ftbus-chaos-probe-") as tmp:
        cluster = Cluster(Path(tmp) / "nats", 3, sync_interval=args.sync_interval)
        cluster.start()
        try:
            cluster.wait_ready()
            losses = [await probe(cluster, args.probe_trials, "leader"),
                      await probe(cluster, args.probe_trials, "all")]
        finally:
            cluster.stop()
    for loss in losses:
        print(f"node death right after an ack ({loss.mode} killed, sync_interval {args.sync_interval}): "
              f"{loss.acked} acknowledged, {loss.lost} lost")
    return 1 if any(loss.lost for loss in losses) else 0


def make_network(loopback: bool) -> tuple[Network | None, str]:
    """The hosts' namespaces, this process moved onto their bridge; or None and why not."""
    if loopback:
        return None, "loopback (--loopback): no network faults"
    network = Network(3)
    try:
        network.up()
        network.enter_switch()
    except (NetworkUnavailable, OSError) as exc:
        network.down()
        return None, f"loopback, no network faults: namespaces cannot be made here ({exc})"
    return network, (f"namespaces: {', '.join(f'n{h} on {network.address(h)}' for h in range(1, 4))}, "
                     f"clients on the bridge")


async def connect_retrying(settings: Settings) -> Client:
    for attempt in range(30):
        try:
            return await Client(settings=settings).connect()
        except Exception:
            if attempt == 29:
                raise
            await asyncio.sleep(1)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few faults, about 2 minutes")
    parser.add_argument("--loopback", action="store_true", help="no namespaces: every process on loopback")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None, help="seconds between submits")
    parser.add_argument("--deadline", type=float, default=None, help="seconds for the load, verdicts included")
    parser.add_argument("--per-stage", type=int, default=2)
    parser.add_argument("--ack-wait", type=float, default=6.0)
    parser.add_argument("--sync-interval", default="always", help="JetStream sync_interval of every node")
    parser.add_argument("--probe-trials", type=int, default=None, help="node-dies-after-ack trials")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--probe-only", action="store_true",
                        help="only the node-dies-after-ack probe (with --sync-interval to compare settings)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--keep-logs", type=Path, default=Path(tempfile.gettempdir()),
                        help="where a failed run's worker and server logs are copied")
    args = parser.parse_args(argv)
    args.requests = args.requests or (24 if args.smoke else 140)
    args.rate = args.rate or (1.5 if args.smoke else 2.7)
    args.deadline = args.deadline or (150 if args.smoke else 540)
    args.probe_trials = args.probe_trials if args.probe_trials is not None else (2 if args.smoke else 9)
    setup_logging("console", "ERROR")
    started = time.monotonic()
    if args.probe_only:
        return asyncio.run(_probe_only(args))
    # SIGTERM (a timeout, a CI job cancelled) unwinds like an error: every finally runs, the network's
    # last of all, and kills whatever is still in its namespaces.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    network, where = make_network(args.loopback)
    print(f"  network: {where}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="ftbus-chaos-") as tmp:
            result, ack_losses, fault_log = asyncio.run(chaos(args, Path(tmp), network))
    finally:
        network_left = network.down() if network is not None else []
    result.network = where
    result.leftovers += network_left
    print(result.table())
    for loss in ack_losses:
        print(f"node death right after an ack ({loss.mode} killed, sync_interval {args.sync_interval}): "
              f"{loss.acked} acknowledged, {loss.lost} lost")
    print(f"chaos run: {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            "failed": result.failed, "requests": result.requests, "ok": result.ok, "lost": result.lost,
            "duplicated": result.duplicated, "wrong": result.wrong, "errors": dict(result.errors),
            "unsubmitted": result.unsubmitted, "leftovers": result.leftovers, "crashed": result.crashed,
            "faults": dict(result.faults), "network": where,
            "resumed": result.resumed, "not_resumed": result.not_resumed,
            "p50": result.percentile(50), "p99": result.percentile(99), "fault_log": fault_log,
            "ack_loss": [loss.__dict__ for loss in ack_losses],
        }, indent=2))
    lost_after_ack = sum(loss.lost for loss in ack_losses)
    return 1 if result.failed or lost_after_ack else 0


if __name__ == "__main__":
    sys.exit(main())
