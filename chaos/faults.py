"""Faults on a schedule: every kind the issue names, injected while the load runs.

    kill_worker       SIGKILL a random stage worker, start it again after a pause
    stop_worker       SIGSTOP a train or bench worker past ack_wait, then SIGCONT (a zombie that acks late)
    restart_aggregator SIGTERM an aggregator and start it again
    kill_aggregator   SIGKILL an aggregator, start it again after a pause (what it had claimed but not
                      published, and the events it held unwritten, come back with their messages)
    kill_leader       SIGKILL the node that leads the events stream, start it again after a pause
    kill_leader_after_ack  submit, and SIGKILL the events leader the moment the submit is acknowledged
    kill_node         SIGKILL a random node, start it again after a pause
    restart_cluster   stop every node (SIGTERM), start them all again
    kill_trainer      submit a long training that checkpoints every 5 steps, wait until its checkpoint
                      of step >= 10 is uploaded, SIGKILL every train worker (so the one training it),
                      start them again: the request must resume (the checker asserts the step)

Network faults (with a chaos.network.Network: each node, and workers, on its own host):

    partition_leader  the events leader's host cut off from the other hosts (nodes and workers) for
                      ``partition_s``; clients on the switch still reach it
    split             a majority-minority split: a host that does not lead the events stream cut off
                      from everything (the other hosts and the clients) for ``partition_s``
    flap_link         a host's link down 1 s, up 2 s, six times
    degrade_links     every link rate-limited with random loss (latency from queueing and
                      retransmits: this kernel has no netem) for ``partition_s``

Each fault is bounded in time; the schedule is a list of (seconds from start, kind). A network fault
is healed before it returns (on failure too), and waits until every node is healthy again.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.cluster import Cluster
from chaos.network import Network
from chaos.services import Services

FULL_SCHEDULE: list[tuple[float, str]] = [
    (15, "kill_worker"), (30, "stop_worker"), (50, "restart_aggregator"), (60, "partition_leader"),
    (95, "kill_leader"), (110, "kill_worker"), (120, "kill_leader_after_ack"), (135, "kill_node"),
    (150, "split"), (175, "stop_worker"), (195, "restart_cluster"), (230, "flap_link"), (255, "kill_worker"),
    (265, "kill_aggregator"), (280, "degrade_links"), (305, "kill_leader"), (320, "kill_node"),
    (335, "partition_leader"), (355, "kill_leader_after_ack"), (365, "kill_worker"), (375, "stop_worker"),
    (385, "kill_trainer"),
]
SMOKE_SCHEDULE: list[tuple[float, str]] = [
    (6, "kill_worker"), (10, "partition_leader"), (24, "stop_worker"), (35, "kill_leader"),
    (42, "restart_aggregator"), (50, "kill_trainer"),
]
NETWORK_FAULTS = ("partition_leader", "split", "flap_link", "degrade_links")


def without_network(schedule: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """The schedule for a run on loopback: its network faults left out."""
    return [(at, kind) for at, kind in schedule if kind not in NETWORK_FAULTS]


@dataclass
class Faults:
    cluster: Cluster
    services: Services
    ack_wait_s: float
    schedule: list[tuple[float, str]]
    submit_probe: Callable[[], Awaitable[Any]] | None = None  # a submit whose ack triggers a leader kill
    leader_of: Callable[[], Awaitable[str | None]] | None = None
    #: Submits a request of the load's ``resume`` kind; returns its id once acknowledged.
    resume_probe: Callable[[], Awaitable[str]] | None = None
    #: The step of a request's latest uploaded checkpoint (its manifest), None when there is none.
    checkpoint_step: Callable[[str], Awaitable[int | None]] | None = None
    seed: int = 7
    network: Network | None = None
    partition_s: float = 15.0
    done: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)
    #: kill_trainer's requests, each with the checkpoint step uploaded when its trainer was killed.
    resumes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _note(self, start: float, text: str) -> None:
        line = f"[{asyncio.get_running_loop().time() - start:6.1f} s] {text}"
        self.log.append(line)
        print(f"  fault {line}", flush=True)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for at, kind in self.schedule:
            delay = start + at - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                    return
                except TimeoutError:
                    pass
            try:
                what = await getattr(self, kind)()
                self.done[kind] += 1
                self._note(start, f"{kind}: {what}")
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self._note(start, f"{kind} FAILED: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ workers

    async def kill_worker(self) -> str:
        return await self._kill_and_restart([s for s in self.services.all if s.stage != "aggregate" and s.alive()])

    async def _kill_and_restart(self, candidates: list[Any]) -> str:
        victim = self.rng.choice(candidates)
        victim.held = True  # the supervisor leaves it to us
        try:
            await asyncio.to_thread(victim.kill)
            await asyncio.sleep(2)
            victim.start()
        finally:
            victim.held = False
        return f"SIGKILL {victim.name}, restarted"

    async def kill_trainer(self) -> str:
        if self.resume_probe is None or self.checkpoint_step is None:
            raise RuntimeError("this run has no resume probe")
        rid = await self.resume_probe()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while (step := await self.checkpoint_step(rid)) is None or step < 10:
            if loop.time() > deadline:
                raise RuntimeError(f"{rid} uploaded no checkpoint of step >= 10 within 120 s")
            await asyncio.sleep(0.5)
        victims = [s for s in self.services.of("train") if s.alive()]
        for victim in victims:
            victim.held = True
        try:
            for victim in victims:
                await asyncio.to_thread(victim.kill)
            await asyncio.sleep(2)
            for victim in victims:
                victim.start()
        finally:
            for victim in victims:
                victim.held = False
        self.resumes[rid] = step
        return (f"SIGKILL {', '.join(v.name for v in victims)} while {rid} trained (checkpoint of step {step} "
                "uploaded), restarted")

    async def stop_worker(self) -> str:
        victim = self.rng.choice([s for s in self.services.all if s.stage in ("train", "bench") and s.alive()])
        victim.signal(signal.SIGSTOP)
        await asyncio.sleep(self.ack_wait_s + 4)
        victim.signal(signal.SIGCONT)
        return f"SIGSTOP {victim.name} for {self.ack_wait_s + 4:.0f} s, then SIGCONT"

    async def restart_aggregator(self) -> str:
        victim = self.rng.choice(self.services.of("aggregate"))
        victim.held = True
        try:
            await asyncio.to_thread(victim.stop)
            victim.start()
        finally:
            victim.held = False
        return f"restarted {victim.name}"

    async def kill_aggregator(self) -> str:
        return await self._kill_and_restart([s for s in self.services.of("aggregate") if s.alive()])

    # ------------------------------------------------------------------ nodes

    async def _leader(self) -> str:
        name = await self.leader_of() if self.leader_of is not None else None
        return name or self.rng.choice([n.name for n in self.cluster.nodes if n.alive()])

    async def kill_leader(self) -> str:
        node = self.cluster.node(await self._leader())
        await asyncio.to_thread(node.kill)
        await asyncio.sleep(6)
        await asyncio.to_thread(node.start)
        return f"SIGKILL {node.name} (events leader), restarted"

    async def kill_leader_after_ack(self) -> str:
        if self.submit_probe is None:
            return await self.kill_leader()
        leader = await self._leader()
        rid = await self.submit_probe()  # returns once the submit is acknowledged
        node = self.cluster.node(leader)
        await asyncio.to_thread(node.kill)
        await asyncio.sleep(6)
        await asyncio.to_thread(node.start)
        return f"SIGKILL {node.name} (events leader) right after the ack of {rid}, restarted"

    async def kill_node(self) -> str:
        node = self.rng.choice([n for n in self.cluster.nodes if n.alive()])
        await asyncio.to_thread(node.kill)
        await asyncio.sleep(6)
        await asyncio.to_thread(node.start)
        return f"SIGKILL {node.name}, restarted"

    async def restart_cluster(self) -> str:
        await asyncio.to_thread(self.cluster.stop)
        await asyncio.sleep(1)
        await asyncio.to_thread(self.cluster.start)
        return "all nodes stopped and started again"

    # ------------------------------------------------------------------ network

    def _net(self) -> Network:
        if self.network is None:
            raise RuntimeError("no network namespaces in this run (loopback): network faults cannot be injected")
        return self.network

    async def _healed(self) -> None:
        """Undo every network fault, then wait until every node says it is healthy again."""
        await asyncio.to_thread(self._net().heal)
        await asyncio.to_thread(self.cluster.wait_ready, 120.0)

    async def _hold(self, fault: Callable[[], None]) -> None:
        """``fault`` for ``partition_s``, then healed (on failure too)."""
        try:
            await asyncio.to_thread(fault)
            await asyncio.sleep(self.partition_s)
        finally:
            await self._healed()

    @staticmethod
    def _host(node: str) -> int:
        return int(node.removeprefix("n"))

    async def partition_leader(self) -> str:
        net = self._net()
        leader = self._host(await self._leader())
        others = [h for h in range(1, net.hosts + 1) if h != leader]
        await self._hold(lambda: net.cut(leader, others))
        return (f"h{leader} (n{leader}, events leader) cut off from {', '.join(f'h{h}' for h in others)} "
                f"for {self.partition_s:.0f} s, clients still reach it; healed")

    async def split(self) -> str:
        net = self._net()
        leader = self._host(await self._leader())
        minority = self.rng.choice([h for h in range(1, net.hosts + 1) if h != leader])
        majority = [h for h in range(1, net.hosts + 1) if h != minority]
        await self._hold(lambda: net.cut(minority))
        return (f"h{minority} | {' '.join(f'h{h}' for h in majority)} + clients "
                f"for {self.partition_s:.0f} s (n{leader} led); healed")

    async def flap_link(self) -> str:
        net = self._net()
        host = self.rng.randint(1, net.hosts)
        try:
            for _ in range(6):
                await asyncio.to_thread(net.link, host, False)
                await asyncio.sleep(1)
                await asyncio.to_thread(net.link, host, True)
                await asyncio.sleep(2)
        finally:
            await self._healed()
        return f"h{host}'s link down 1 s / up 2 s, 6 times; healed"

    async def degrade_links(self) -> str:
        net = self._net()
        await self._hold(lambda: net.degrade("1mbit", 200, 5))
        return f"every link 1 Mbit/s (queue up to 200 ms), 5 % loss each way, for {self.partition_s:.0f} s; healed"
