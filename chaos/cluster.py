"""A nats-server cluster: the embedded binary, file storage, one config file per node.

On loopback, or with a :class:`chaos.network.Network`, each node on its own host (network namespace),
at that host's address.

Nodes can be killed (any signal), stopped and started again on the same ports and stores, one at
a time or all together. With one node it is a plain JetStream server (the soak uses that).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos.network import Network
from chaos.process import OwnedProcess
from ftbus.embedded import _terminate_with_parent, free_port, nats_server_binary, wait_for_port


@dataclass
class Node(OwnedProcess):
    name: str
    port: int
    cluster_port: int
    monitor_port: int
    store: Path
    log: Path
    conf: Path
    host: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)  # runs the server on its host (nsenter)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    stop_timeout_s = 20.0  # lame duck, store flushed

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        if self.alive():
            return
        log = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(
                [*self.prefix, str(nats_server_binary()), "-c", str(self.conf)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_terminate_with_parent,
            )
        finally:
            log.close()
        wait_for_port(self.host, self.port, timeout_s)


class Cluster:
    """``size`` nodes named n1..nN. ``sync_interval``: JetStream's fsync setting ("always", "2m", ...).
    With ``network``, node nI runs on host I: its address, the standard ports."""

    def __init__(self, root: Path, size: int = 3, *, sync_interval: str = "always", name: str = "ftbus-chaos",
                 network: Network | None = None) -> None:
        self.root = root
        self.size = size
        self.sync_interval = sync_interval
        self.name = name
        self.nodes: list[Node] = []
        for i in range(1, size + 1):
            node_dir = root / f"n{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            paths = (node_dir / "store", node_dir / "server.log", node_dir / "server.conf")
            if network is None:
                self.nodes.append(Node(f"n{i}", free_port(), free_port(), free_port(), *paths))
            else:
                self.nodes.append(Node(f"n{i}", 4222, 6222, 8222, *paths, host=network.address(i),
                                       prefix=network.exec_prefix(i)))
        for node in self.nodes:
            node.conf.write_text(self._config(node))

    def _config(self, node: Node) -> str:
        lines = [
            f"server_name: {node.name}",
            f"listen: {node.host}:{node.port}",
            f"http: {node.host}:{node.monitor_port}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(node.store))}",
            f"  sync_interval: {self.sync_interval}",
            "}",
        ]
        if self.size > 1:
            routes = ", ".join(f"nats://{n.host}:{n.cluster_port}" for n in self.nodes if n is not node)
            lines += [
                "cluster {",
                f"  name: {self.name}",
                f"  listen: {node.host}:{node.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    @property
    def url(self) -> str:
        """Every node, comma-separated: clients fail over between them."""
        return ",".join(n.url for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.pid is not None]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until every live node's monitoring endpoint says JetStream is healthy (a meta leader exists)."""
        import urllib.request

        deadline = time.monotonic() + timeout_s
        pending = [n for n in self.nodes if n.alive()]
        while pending and time.monotonic() < deadline:
            for node in list(pending):
                try:
                    with urllib.request.urlopen(f"http://{node.host}:{node.monitor_port}/healthz",
                                                timeout=2) as resp:
                        if resp.status == 200:
                            pending.remove(node)
                except OSError:
                    pass
            if pending:
                time.sleep(0.2)
        if pending:
            raise TimeoutError(f"nodes not healthy after {timeout_s} s: {[n.name for n in pending]}")
