"""The dashboard's authenticating proxy (deploy/k8s/dashboard/nginx.conf) with the login the
secrets Job generates (ftbus/k8s_secrets.py): a real nginx, in front of a local stand-in of the
dashboard. Without the password, or with a wrong one, nothing gets through; with it, the dashboard
answers; the health check needs no login.

nginx comes from Debian's package, unpacked by `make k8s-tools` into .tools/nginx (no service is
installed or started); where neither it nor a system nginx is found, this is skipped, saying why.
"""

from __future__ import annotations

import base64
import http.server
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftbus.k8s_secrets import fill_dashboard

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "deploy" / "k8s" / "dashboard" / "nginx.conf"


def _nginx() -> str | None:
    bundled = REPO / ".tools" / "nginx" / "usr" / "sbin" / "nginx"
    return str(bundled) if bundled.exists() else shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


def _as_this_user() -> str:
    """nginx started by root hands its workers to `nobody`, who may not read this test's folder; in
    the pod it runs unprivileged, as one user throughout."""
    import grp
    import os
    import pwd

    if os.getuid() != 0:
        return ""
    return f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Dashboard(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"the dashboard"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    nginx = _nginx()
    if nginx is None:
        pytest.skip("no nginx here (`make k8s-tools` unpacks Debian's): the dashboard's proxy is not run")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    login = fill_dashboard({})  # what the secrets Job puts in ftbus-dashboard-auth
    (tmp_path / "htpasswd").write_text(login["htpasswd"])
    port = _free_port()
    conf = CONF.read_text()
    for old, new in {"/tmp/": f"{tmp_path}/",  # first: the paths below may be under /tmp themselves
                     "listen 8080;": f"listen 127.0.0.1:{port};",
                     "/etc/nginx/auth/htpasswd": str(tmp_path / "htpasswd"),
                     "127.0.0.1:8470": f"127.0.0.1:{upstream.server_address[1]}",
                     "access_log /dev/stdout;": "access_log off;"}.items():
        assert old in conf, old
        conf = conf.replace(old, new)
    (tmp_path / "nginx.conf").write_text(conf)
    server = subprocess.Popen([nginx, "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path), "-e",
                               str(tmp_path / "error.log"), "-g", f"daemon off; {_as_this_user()}"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # a hang guard on nginx's start
        while time.monotonic() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=2).close()
                break
            except OSError:
                time.sleep(0.05)
        assert server.poll() is None, (tmp_path / "error.log").read_text()
        yield url, login
    finally:
        server.terminate()
        server.wait(timeout=30)
        upstream.shutdown()


def _get(url: str, user: str | None = None, password: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # a hang guard
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_only_the_generated_login_reaches_the_dashboard(proxy: tuple[str, dict[str, str]]) -> None:
    url, login = proxy
    assert _get(f"{url}/healthz")[0] == 200, "the readiness probe needs no login"
    assert _get(f"{url}/")[0] == 401
    assert _get(f"{url}/", "ftbus", "not-the-password")[0] == 401
    assert _get(f"{url}/", "admin", login["password"])[0] == 401
    assert _get(f"{url}/api/requests", "ftbus", login["password"]) == (200, b"the dashboard")


def test_prometheus_reaches_the_metrics_alone_without_a_login(proxy: tuple[str, dict[str, str]]) -> None:
    """/metrics (counts, no score, no request id) is scraped without the password; nothing else is."""
    url, _ = proxy
    assert _get(f"{url}/metrics") == (200, b"the dashboard")
    for path in ("/metrics/", "/metricsx", "/api/overview", "/api/requests"):
        assert _get(f"{url}{path}")[0] == 401, path
