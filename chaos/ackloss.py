"""A node dies right after acknowledging a write: is the write still there?

Each trial publishes one message to an R3 probe stream, and the moment the acknowledgement
arrives, SIGKILLs the stream's leader (``mode="leader"``) or every node (``mode="all"``), starts
them again and reads the message back by its sequence number. SIGKILL ends the process, not the
machine: what the server wrote is in the OS page cache and survives whatever ``sync_interval``
says. A machine or power failure is what ``sync_interval: always`` guards against (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

import nats
from nats.js import api

from chaos.cluster import Cluster
from chaos.retry import retry

STREAM = "CHAOS_PROBE"


@dataclass
class AckLoss:
    mode: str
    trials: int = 0
    acked: int = 0
    lost: int = 0


async def probe(cluster: Cluster, trials: int, mode: str = "leader") -> AckLoss:
    result = AckLoss(mode)
    async def quiet(exc: Exception) -> None:  # nodes are killed on purpose: reconnects are expected
        pass

    nc = await nats.connect(cluster.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                            connect_timeout=5, error_cb=quiet)
    try:
        js = nc.jetstream()
        for attempt in range(30):
            try:
                await js.add_stream(api.StreamConfig(name=STREAM, subjects=["chaosprobe.>"], num_replicas=3,
                                                     storage=api.StorageType.FILE))
                break
            except Exception:
                if attempt == 29:
                    raise
                await asyncio.sleep(1)
        for i in range(trials):
            result.trials += 1
            payload = secrets.token_bytes(16)
            info = await retry(lambda: js.stream_info(STREAM), every_s=0.5)
            leader = info.cluster.leader if info.cluster else None
            ack = await retry(lambda i=i, payload=payload: js.publish(f"chaosprobe.{i}", payload, timeout=5),
                              every_s=0.5)
            victims = cluster.nodes if mode == "all" else [cluster.node(leader or cluster.nodes[0].name)]
            for node in victims:  # at once: the acknowledgement has just arrived
                node.kill()
            result.acked += 1
            await asyncio.sleep(0.5)
            for node in victims:
                await asyncio.to_thread(node.start)
            await asyncio.to_thread(cluster.wait_ready)
            try:
                msg = await retry(lambda ack=ack: js.get_msg(STREAM, ack.seq), attempts=40, every_s=0.5)
                if msg.data != payload:
                    result.lost += 1
            except Exception:
                result.lost += 1
        await retry(lambda: js.delete_stream(STREAM), every_s=0.5)
    finally:
        await nc.close()
    return result
