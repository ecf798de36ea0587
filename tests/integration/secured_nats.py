"""A real nats-server running the repository's own deploy/nats/ configuration, for permission tests.

The temporary config INCLUDES deploy/nats/nats-server.conf (and so accounts.conf, users and rules
untouched) and overrides only what a test machine needs: the listen address (loopback, a free
port), the monitoring port, and the JetStream block with a temporary store (the rest of that block
is the repository's own text). Passwords come from the server's environment, as in production.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from ftbus.embedded import _terminate_with_parent, free_port, nats_server_binary, wait_for_port

REPO = Path(__file__).resolve().parents[2]
NATS_DIR = REPO / "deploy" / "nats"
SERVER_CONF = NATS_DIR / "nats-server.conf"
ACCOUNTS_CONF = NATS_DIR / "accounts.conf"

# [ERR] 127.0.0.1:53674 - cid:6 - "v2.16.0:python3" - "FTBUS/user:agent" - Publish Violation - Subject "x"
_VIOLATION_RE = re.compile(r'"(?P<account>[^"/]+)/user:(?P<user>[^"]+)" - (?P<kind>Publish|Subscription) Violation'
                           r' - Subject "(?P<subject>[^"]*)"')


def config_users() -> list[str]:
    """Every `user:` of accounts.conf, in file order."""
    return re.findall(r"^\s*\{?\s*user:\s*([A-Za-z0-9_-]+)", ACCOUNTS_CONF.read_text(), re.M)


def _jetstream_block(conf: str) -> str:
    """The `jetstream { ... }` block of a config, verbatim."""
    start = re.search(r"^jetstream\s*\{", conf, re.M)
    assert start, "nats-server.conf has no top-level jetstream block"
    depth, i = 0, start.start()
    while True:
        ch = conf[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return conf[start.start() : i + 1]
        i += 1


@dataclass(frozen=True)
class Violation:
    user: str
    kind: str  # "Publish" or "Subscription"
    subject: str


class SecuredServer:
    def __init__(self, root: Path, agents: tuple[str, ...] | None = None) -> None:
        """``agents``: the agent users, as `python -m ftbus.permissions --agents` generates them for an
        operator who adds identities (None: the repository's accounts.conf as it is)."""
        self.root = root
        self.port = free_port()
        self.http_port = free_port()
        self.log_file = root / "nats-server.log"
        self.server_conf = SERVER_CONF
        users = config_users()
        if agents is not None:
            from ftbus.permissions import render

            folder = root / "nats"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "nats-server.conf").write_text(SERVER_CONF.read_text())
            (folder / "accounts.conf").write_text(render(agents=agents))
            self.server_conf = folder / "nats-server.conf"
            users = re.findall(r"^\s*\{?\s*user:\s*([A-Za-z0-9_-]+)", (folder / "accounts.conf").read_text(), re.M)
        self.passwords = {user: secrets.token_hex(12) for user in users}
        self.process: subprocess.Popen[bytes] | None = None

    def write_config(self) -> Path:
        store = self.root / "store"
        store.mkdir(parents=True, exist_ok=True)
        jetstream, n = re.subn(
            r'store_dir:\s*"[^"]*"', f'store_dir: "{store}"', _jetstream_block(SERVER_CONF.read_text())
        )
        assert n == 1, "nats-server.conf's jetstream block has no store_dir"
        # An include is resolved relative to the including file: point at the repository's file.
        include = os.path.relpath(self.server_conf, self.root)
        conf = self.root / "test-server.conf"
        conf.write_text(
            f'include "{include}"\n'
            f"listen: 127.0.0.1:{self.port}\n"
            f"http_port: {self.http_port}\n"
            f"http: 127.0.0.1:{self.http_port}\n"
            f"{jetstream}\n"
        )
        return conf

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for user, password in self.passwords.items():
            env[f"NATS_{user.upper()}_PASSWORD"] = password
        return env

    def start(self) -> None:
        conf = self.write_config()
        binary = str(nats_server_binary())
        check = subprocess.run([binary, "-c", str(conf), "-t"], env=self.env(), capture_output=True, text=True)
        assert check.returncode == 0, f"nats-server rejects the repository's config: {check.stderr}{check.stdout}"
        log = open(self.log_file, "ab")
        self.process = subprocess.Popen(
            [binary, "-c", str(conf)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            start_new_session=True,
            # a killed test run leaves no server behind (SIGTERM when this thread's process dies)
            preexec_fn=_terminate_with_parent if threading.current_thread() is threading.main_thread() else None,
        )
        log.close()
        try:
            wait_for_port("127.0.0.1", self.port, 30)
        except Exception:
            self.stop()
            raise
        assert self.process.poll() is None, self.log_file.read_text()

    def stop(self) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.process = None

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.port}"

    def log_size(self) -> int:
        return self.log_file.stat().st_size if self.log_file.exists() else 0

    def log_text(self, since: int = 0) -> str:
        with open(self.log_file, "rb") as fh:
            fh.seek(since)
            return fh.read().decode(errors="replace")

    def violations(self, since: int = 0) -> list[Violation]:
        return [
            Violation(m["user"], m["kind"], m["subject"]) for m in _VIOLATION_RE.finditer(self.log_text(since))
        ]
