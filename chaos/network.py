"""The chaos run's network: each NATS node, with the workers beside it, on its own "host".

    switch   a network namespace holding a bridge, br0 (10.237.0.254/24); the load and the checker
             run here (the driver process moves itself in, see ``enter_switch``)
    h1..hN   one namespace per host: eth0 (10.237.0.N/24), a veth pair whose other end is port hN
             of br0

Everything is made by the run and removed at its end, on failure too (``down``): the namespaces,
and with them their links, addresses, qdiscs and nftables rules. Nothing is created in the
machine's own namespace, and 10.237.0.0/24 exists only inside these namespaces, which have no
route to anything else. Processes join a host with ``nsenter --net`` (``exec_prefix``).

Faults (chaos/faults.py), each undone by ``heal``:

    cut       nftables rules in a host's namespace drop its traffic to and from some hosts (a
              node-to-node partition: the switch still reaches it) or all of it (isolated)
    link      eth0 of a host set down or up (a flapping link)
    degrade   every link rate-limited (tbf) with random loss (nftables numgen) both ways

Latency: this machine's kernel has no netem qdisc (nor prio or gact: only tbf, htb and fifo
qdiscs, u32/bpf classifiers and the mirred action), so a fixed added delay cannot be made. The
rate limit makes packets queue (up to ``latency_ms``) behind each other, and the loss makes TCP
retransmit (200 ms at least each time): delay that comes from congestion and loss, not a fixed one.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.237.0"
SWITCH_ADDRESS = f"{SUBNET}.254"
TABLE = "ftbus_chaos"
CLONE_NEWNET = 0x40000000
TOOLS = ("ip", "tc", "nft", "nsenter")


class NetworkUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, a tool missing, a kernel without them)."""


def _run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def namespaces() -> list[str]:
    """Every named network namespace (`ip netns list`)."""
    if shutil.which("ip") is None:
        return []
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class Network:
    """``hosts`` hosts on one bridge; names start with ``ftbus-chaos-<pid>-``."""

    hosts: int = 3
    prefix: str = field(default_factory=lambda: f"ftbus-chaos-{os.getpid()}")
    _home: int | None = field(default=None, repr=False)  # the driver's own namespace, while away

    @property
    def switch(self) -> str:
        return f"{self.prefix}-switch"

    def ns(self, host: int) -> str:
        return f"{self.prefix}-h{host}"

    def names(self) -> list[str]:
        return [self.switch] + [self.ns(h) for h in range(1, self.hosts + 1)]

    @staticmethod
    def address(host: int) -> str:
        return f"{SUBNET}.{host}"

    def exec_prefix(self, host: int) -> list[str]:
        """Prepended to a command line: the command runs on ``host`` (its network namespace only)."""
        return ["nsenter", f"--net=/run/netns/{self.ns(host)}", "--"]

    def _in(self, name: str, *args: str) -> str:
        return _run("nsenter", f"--net=/run/netns/{name}", "--", *args)

    # ------------------------------------------------------------------ life

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be made here, or None (``up`` may still fail: it says why)."""
        if os.geteuid() != 0:
            return "not root: network namespaces need CAP_SYS_ADMIN"
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not installed (Debian: iproute2, nftables, util-linux)"
        return None

    def up(self) -> None:
        """Create the namespaces, the bridge, the links and the addresses; ``down`` on any failure."""
        reason = self.unavailable()
        if reason:
            raise NetworkUnavailable(reason)
        reap_stale()
        try:
            _run("ip", "netns", "add", self.switch)
            self._in(self.switch, "ip", "link", "set", "lo", "up")
            self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.switch, "ip", "addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0")
            self._in(self.switch, "ip", "link", "set", "br0", "up")
            for host in range(1, self.hosts + 1):
                name, port = self.ns(host), f"h{host}"
                _run("ip", "netns", "add", name)
                _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                     "netns", name)
                _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
                self._in(name, "ip", "link", "set", "lo", "up")
                self._in(name, "ip", "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                self._in(name, "ip", "link", "set", "eth0", "up")
                self._nft_table(name)
        except BaseException:
            self.down()
            raise

    def _nft_table(self, name: str) -> None:
        rules = (f"table inet {TABLE} {{\n"
                 "  chain input { type filter hook input priority 0; policy accept; }\n"
                 "  chain output { type filter hook output priority 0; policy accept; }\n"
                 "}\n")
        proc = subprocess.run(["nsenter", f"--net=/run/netns/{name}", "--", "nft", "-f", "-"], input=rules,
                              capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            raise NetworkUnavailable(f"nft in {name}: {proc.stderr.strip()}")

    def down(self) -> list[str]:
        """Back to the machine's namespace, every process still in a host killed (and reported),
        every namespace deleted. Returns what was left: processes found, namespaces that remain."""
        self.leave_switch()
        left = []
        for name in self.names():
            if name not in namespaces():
                continue
            pids = [int(p) for p in _run("ip", "netns", "pids", name).split()]
            for pid in pids:
                left.append(f"process {pid} in {name}")
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            try:
                _run("ip", "netns", "del", name)
            except NetworkUnavailable as exc:
                left.append(str(exc))
        return left + self.leftovers()

    def leftovers(self) -> list[str]:
        """Namespaces of this run that still exist, and any link named after it in this namespace."""
        left = [f"namespace {name}" for name in namespaces() if name.startswith(self.prefix + "-")]
        links = _run("ip", "-o", "link", "show") if shutil.which("ip") else ""
        left += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if self.prefix in line]
        return left

    def enter_switch(self) -> None:
        """Move this process (its calling thread, and every thread it starts later) into the switch
        namespace: its sockets (the load's clients, the checker's) are then on the bridge."""
        if self._home is None:
            self._home = os.open("/proc/self/ns/net", os.O_RDONLY)
        _setns(f"/run/netns/{self.switch}")

    def leave_switch(self) -> None:
        if self._home is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(self._home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the machine's namespace")
        os.close(self._home)
        self._home = None

    # ------------------------------------------------------------------ faults

    def cut(self, host: int, peers: list[int] | None = None) -> None:
        """Drop ``host``'s traffic to and from ``peers`` (hosts), or all of its traffic on eth0."""
        if peers is None:
            rules = [("input", 'iifname "eth0" drop'), ("output", 'oifname "eth0" drop')]
        else:
            addrs = "{ " + ", ".join(self.address(p) for p in peers) + " }"
            rules = [("input", f"ip saddr {addrs} drop"), ("output", f"ip daddr {addrs} drop")]
        for chain, rule in rules:
            self._in(self.ns(host), "nft", "add", "rule", "inet", TABLE, chain, *rule.split())

    def link(self, host: int, up: bool) -> None:
        self._in(self.ns(host), "ip", "link", "set", "eth0", "up" if up else "down")

    def degrade(self, rate: str = "1mbit", latency_ms: int = 200, loss_pct: int = 5) -> None:
        """Every link: ``rate`` with up to ``latency_ms`` of queue, both ways, and ``loss_pct`` % of
        the packets a host sends or receives dropped at random."""
        for host in range(1, self.hosts + 1):
            for name, dev in ((self.ns(host), "eth0"), (self.switch, f"h{host}")):
                self._in(name, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                         "burst", "16kb", "latency", f"{latency_ms}ms")
            for chain, match in (("input", 'iifname "eth0"'), ("output", 'oifname "eth0"')):
                self._in(self.ns(host), "nft", "add", "rule", "inet", TABLE, chain, *match.split(),
                         "numgen", "random", "mod", "100", "<", str(loss_pct), "drop")

    def heal(self) -> None:
        """Every fault undone: rules flushed, links up, qdiscs back to the default."""
        for host in range(1, self.hosts + 1):
            name = self.ns(host)
            for chain in ("input", "output"):
                self._in(name, "nft", "flush", "chain", "inet", TABLE, chain)
            self._in(name, "ip", "link", "set", "eth0", "up")
            for ns, dev in ((name, "eth0"), (self.switch, f"h{host}")):
                if "tbf" in self._in(ns, "tc", "qdisc", "show", "dev", dev):
                    self._in(ns, "tc", "qdisc", "del", "dev", dev, "root")

    def rules(self, host: int) -> str:
        return self._in(self.ns(host), "nft", "list", "table", "inet", TABLE)


STALE = re.compile(r"^ftbus-chaos-(\d+)-")


def reap_stale() -> list[str]:
    """Delete the namespaces of chaos runs whose process is gone (a run SIGKILLed before its
    clean-up), after killing the processes it left in them."""
    reaped = []
    for name in namespaces():
        match = STALE.match(name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            for pid in _run("ip", "netns", "pids", name).split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            _run("ip", "netns", "del", name)
            reaped.append(name)
    return reaped
