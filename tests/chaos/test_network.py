"""The chaos run's network (chaos/network.py), on its own: real namespaces, a real bridge, a real
listener. Each fault cuts what it says and ``heal`` restores it; ``down`` leaves nothing, after a
failure too, and when a whole chaos run is stopped by SIGTERM. Skipped, saying why, where namespaces
cannot be made (not root, tools missing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.network import Network, NetworkUnavailable, namespaces, reap_stale

REPO = Path(__file__).resolve().parents[2]
WHY = Network.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no network namespaces here: {WHY}")

LISTENER = ("import socket, sys\n"
            "s = socket.socket(); s.bind((sys.argv[1], 5555)); s.listen(16)\n"
            "print('listening', flush=True)\n"
            "while True: s.accept()[0].close()\n")


def reaches(net: Network, where: list[str], address: str, timeout_s: float = 30.0) -> bool:
    """Whether a TCP connect from ``where`` (an exec prefix) to ``address``:5555 succeeds within
    ``timeout_s``: by default a hang guard (a connect that should succeed gets all of it)."""
    probe = f"import socket; socket.create_connection(('{address}', 5555), timeout={timeout_s}).close()"
    return subprocess.run([*where, sys.executable, "-c", probe], capture_output=True,
                          timeout=timeout_s + 60).returncode == 0


def cut_off(net: Network, where: list[str], address: str) -> bool:
    """Whether ``address`` is unreachable from ``where``. A short wait is no race here: a cut drops the
    packets (nftables `drop`, a link down), so none arrives late, whatever the load; a cut that failed
    lets the connect through at once, and the check fails."""
    return not reaches(net, where, address, timeout_s=1.0)


@pytest.fixture
def net() -> Iterator[Network]:
    network = Network(3, prefix=f"ftbus-chaos-{os.getpid()}-t")
    network.up()
    listener = subprocess.Popen([*network.exec_prefix(2), sys.executable, "-c", LISTENER, network.address(2)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        yield network
    finally:
        left = network.down()
        listener.wait(timeout=60)  # hang guard: down() killed it
        assert [x for x in left if not x.startswith("process ")] == [], left
        assert network.leftovers() == []


def test_each_fault_cuts_what_it_says_and_heal_restores(net: Network) -> None:
    h1, h3, switch = net.exec_prefix(1), net.exec_prefix(3), ["nsenter", f"--net=/run/netns/{net.switch}", "--"]
    h2 = net.address(2)
    assert reaches(net, h1, h2) and reaches(net, h3, h2) and reaches(net, switch, h2)

    net.cut(2, [1, 3])  # node-to-node: the other hosts lose it, the clients' switch does not
    assert cut_off(net, h1, h2) and cut_off(net, h3, h2) and reaches(net, switch, h2)
    net.heal()
    assert reaches(net, h1, h2)

    net.cut(2)  # isolated from everything
    assert cut_off(net, h1, h2) and cut_off(net, switch, h2)
    net.heal()
    assert reaches(net, switch, h2)

    net.link(2, False)
    assert cut_off(net, h1, h2)
    net.heal()  # also brings the link up
    assert reaches(net, h1, h2)

    net.degrade("1mbit", 200, 5)
    assert "numgen random mod 100 < 5 drop" in net.rules(2)
    assert "tbf" in subprocess.run([*net.exec_prefix(2), "tc", "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True, check=True).stdout
    net.heal()
    assert "drop" not in net.rules(2)
    assert reaches(net, h1, h2)


def test_down_after_a_failure_leaves_no_namespace_link_or_process() -> None:
    network = Network(3, prefix=f"ftbus-chaos-{os.getpid()}-f")
    sleeper = None
    with pytest.raises(RuntimeError, match="the run failed"):
        try:
            network.up()
            sleeper = subprocess.Popen([*network.exec_prefix(1), "sleep", "300"])
            wait_until_inside(sleeper, network.ns(1))
            raise RuntimeError("the run failed")
        finally:
            left = network.down()
    assert sleeper is not None and sleeper.wait(timeout=60) == -9  # hang guard: killed at once
    assert left == [f"process {sleeper.pid} in {network.ns(1)}"]  # killed, and reported
    assert not [n for n in namespaces() if n.startswith(network.prefix)]
    assert network.leftovers() == []


def test_a_failed_setup_removes_what_it_made() -> None:
    network = Network(3, prefix=f"ftbus-chaos-{os.getpid()}-s")
    subprocess.run(["ip", "netns", "add", network.ns(2)], check=True)  # in the way: h2 cannot be added
    with pytest.raises(NetworkUnavailable, match="netns add"):
        network.up()
    assert network.leftovers() == []


def test_namespaces_of_a_run_that_died_are_reaped_with_their_processes() -> None:
    dead = int(open("/proc/sys/kernel/pid_max").read())  # pids are below it: no process has it
    name = f"ftbus-chaos-{dead}-h1"
    subprocess.run(["ip", "netns", "add", name], check=True)
    orphan = subprocess.Popen(["nsenter", f"--net=/run/netns/{name}", "--", "sleep", "300"])
    wait_until_inside(orphan, name)
    assert name in reap_stale()
    assert name not in namespaces()
    assert orphan.wait(timeout=60) == -9  # hang guard: killed at once


def pids_in(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


def wait_until_inside(proc: subprocess.Popen[bytes], name: str, timeout_s: float = 30) -> None:
    """Until ``proc`` (an nsenter) has entered namespace ``name``: before that, a clean-up that
    lists the namespace's processes cannot see it (on a loaded machine, nsenter may open the
    namespace, be overtaken by the clean-up and enter it after)."""
    deadline = time.monotonic() + timeout_s
    while proc.pid not in pids_in(name):
        assert proc.poll() is None, f"{proc.args} ended with {proc.returncode} before entering {name}"
        assert time.monotonic() < deadline, f"{proc.args} did not enter {name} in {timeout_s} s"
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_chaos_run_stopped_by_sigterm_leaves_no_namespace_or_process() -> None:
    run = subprocess.Popen([sys.executable, "-m", "chaos.run", "--smoke"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hosts = [f"ftbus-chaos-{run.pid}-h{h}" for h in (1, 2, 3)]
    deadline = time.monotonic() + 180
    inside: list[int] = []
    while time.monotonic() < deadline and run.poll() is None:  # until each host runs a node and a worker
        if set(hosts) <= set(namespaces()):
            per_host = [pids_in(h) for h in hosts]
            inside = [pid for pids in per_host for pid in pids]
            if all(len(pids) >= 2 for pids in per_host):
                break
        time.sleep(0.2)
    assert run.poll() is None and len(inside) >= 6, f"the run did not start its hosts: {inside}"
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 128 + signal.SIGTERM
    assert not [n for n in namespaces() if n.startswith(f"ftbus-chaos-{run.pid}-")]
    deadline = time.monotonic() + 30  # killed; init reaps them
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in inside):
        time.sleep(0.2)
    assert [pid for pid in inside if os.path.exists(f"/proc/{pid}")] == []
