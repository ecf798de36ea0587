"""The undertaker: when ``ftbus up`` or ``ftbus worker`` dies, by any means, nothing it started runs on.

A process killed with SIGKILL cleans up nothing. Its direct children are covered by
PR_SET_PDEATHSIG (the runner's candidate processes, the embedded nats-server), but what a candidate
starts itself (a training launcher's workers, a ``sleep`` in a script) is re-parented and runs on.
The runner tags every candidate process with its worker (``FTBUS_WORKER=<pid>:<start time>`` in
its environment); ``reap_orphans`` kills those whose worker is gone, but only when a worker starts
again on that host.

So each owner starts one small undertaker process, outside its session, that holds the read end
of a pipe whose write end only the owner holds. When the owner dies, the kernel closes the write
end, the undertaker's read returns end-of-file at once, and it stops the owner's nats-server
(SIGTERM: the store is flushed), kills every orphaned candidate process, and exits. On a clean
exit it finds nothing left to do.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

_children: list[subprocess.Popen[bytes]] = []
_write_ends: list[int] = []


def start_undertaker(server_pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start this process's undertaker; ``server_pid``: a nats-server it must stop on our death."""
    from ftbus.embedded import start_time

    read_end, write_end = os.pipe()  # both non-inheritable: candidates never hold the write end
    argv = [sys.executable, "-m", "ftbus.undertaker", "--owner", str(os.getpid())]
    if server_pid is not None:
        argv += ["--server", f"{server_pid}:{start_time(server_pid)}"]
    proc = subprocess.Popen(
        argv,
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C or a killed process group does not reach it
        pass_fds=(),
    )
    os.close(read_end)
    _write_ends.append(write_end)  # kept open for the life of this process
    _children.append(proc)
    return proc


def _stop_server(spec: str, timeout_s: float) -> None:
    from ftbus.embedded import start_time

    pid_text, _, started = spec.partition(":")
    pid = int(pid_text)
    if start_time(pid) != started:
        return
    os.kill(pid, signal.SIGTERM)  # a clean shutdown: the JetStream store is flushed
    deadline = time.monotonic() + timeout_s
    while start_time(pid) == started and time.monotonic() < deadline:
        time.sleep(0.05)
    if start_time(pid) == started:
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftbus.undertaker")
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--server", default=None, help="PID:START of a nats-server to stop")
    parser.add_argument("--grace", type=float, default=15.0)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe ends our watch
    while os.read(0, 4096):  # the owner never writes: this returns b"" when it is gone
        pass
    from ftbus.embedded import start_time

    owner_started = start_time(args.owner)
    deadline = time.monotonic() + 10
    # The pipe closes while the owner exits; its orphans count as orphans once it is really gone.
    while start_time(args.owner) == owner_started and owner_started and time.monotonic() < deadline:
        time.sleep(0.02)
    if args.server:
        try:
            _stop_server(args.server, args.grace)
        except (ProcessLookupError, ValueError):
            pass
    from runners.base import reap_orphans

    # Twice, a moment apart: a process may fork while the first pass runs.
    for _ in range(2):
        reap_orphans()
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
