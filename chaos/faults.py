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

Each fault is bounded in time; the schedule is a list of (seconds from start, kind).
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
from chaos.services import Services

FULL_SCHEDULE: list[tuple[float, str]] = [
    (15, "kill_worker"), (30, "stop_worker"), (50, "restart_aggregator"), (70, "kill_leader"),
    (95, "kill_worker"), (105, "kill_leader_after_ack"), (125, "kill_node"), (150, "stop_worker"),
    (175, "restart_cluster"), (210, "kill_worker"), (225, "kill_aggregator"), (245, "kill_leader"),
    (270, "kill_node"), (290, "kill_leader_after_ack"), (305, "kill_worker"), (320, "stop_worker"),
]
SMOKE_SCHEDULE: list[tuple[float, str]] = [
    (8, "kill_worker"), (16, "stop_worker"), (28, "kill_leader"), (40, "restart_aggregator"),
]


@dataclass
class Faults:
    cluster: Cluster
    services: Services
    ack_wait_s: float
    schedule: list[tuple[float, str]]
    submit_probe: Callable[[], Awaitable[Any]] | None = None  # a submit whose ack triggers a leader kill
    leader_of: Callable[[], Awaitable[str | None]] | None = None
    seed: int = 7
    done: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)

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
