"""The secrets Job (ftbus/k8s_secrets.py) through the real `kubernetes` client, against the local
API stand-in of tests/k8s_api.py: every NATS user gets a random password, the dashboard a password
and an htpasswd line that nginx accepts, and nothing that exists is ever changed."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from ftbus.k8s_secrets import DASHBOARD_SECRET, NATS_USERS_SECRET, generate, nats_users, ssha
from tests.k8s_api import FakeKubernetes

NS = "ftbus"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeKubernetes, client.CoreV1Api]]:
    server = FakeKubernetes(tmp_path).start()
    try:
        yield server, client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))
    finally:
        server.stop()


def _values(api: client.CoreV1Api, name: str) -> dict[str, str]:
    secret = api.read_namespaced_secret(name, NS)
    return {k: base64.b64decode(v).decode() for k, v in secret.data.items()}


def test_every_user_gets_its_own_random_password_and_nothing_is_changed_later(
        api: tuple[FakeKubernetes, client.CoreV1Api]) -> None:
    _, core = api
    assert set(nats_users()) >= {"admin", "aggregate", "data", "train", "bench", "judge", "agent", "dashboard", "sys"}
    added = generate(core, NS)
    assert added[NATS_USERS_SECRET] == sorted(nats_users())
    users = _values(core, NATS_USERS_SECRET)
    assert len(set(users.values())) == len(users), "no two users share a password"
    assert all(len(v) == 48 and v.isalnum() and "change-me" not in v for v in users.values())

    dashboard = _values(core, DASHBOARD_SECRET)
    user, _, hashed = dashboard["htpasswd"].strip().partition(":")
    assert user == dashboard["user"] == "ftbus" and hashed.startswith("{SSHA}")
    raw = base64.b64decode(hashed.removeprefix("{SSHA}"))
    assert hashlib.sha1(dashboard["password"].encode() + raw[20:]).digest() == raw[:20], "nginx's {SSHA} check"

    assert generate(core, NS) == {NATS_USERS_SECRET: [], DASHBOARD_SECRET: []}
    assert _values(core, NATS_USERS_SECRET) == users and _values(core, DASHBOARD_SECRET) == dashboard


def test_an_operators_own_values_are_kept_and_only_the_missing_ones_added(
        api: tuple[FakeKubernetes, client.CoreV1Api]) -> None:
    _, core = api
    core.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": NATS_USERS_SECRET},
                                       "stringData": {"agent": "the-operators-own"}})
    core.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": DASHBOARD_SECRET},
                                       "stringData": {"password": "chosen"}})
    added = generate(core, NS)
    assert "agent" not in added[NATS_USERS_SECRET] and "admin" in added[NATS_USERS_SECRET]
    assert _values(core, NATS_USERS_SECRET)["agent"] == "the-operators-own"
    dashboard = _values(core, DASHBOARD_SECRET)
    assert dashboard["password"] == "chosen"
    salt = base64.b64decode(dashboard["htpasswd"].strip().split(":", 1)[1].removeprefix("{SSHA}"))[20:]
    assert dashboard["htpasswd"].strip() == f"ftbus:{ssha('chosen', salt)}"
