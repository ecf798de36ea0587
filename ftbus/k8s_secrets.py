"""`python -m ftbus.k8s_secrets`: generate ftbus's Secrets in a Kubernetes namespace (deploy/k8s).

Run by the Job of deploy/k8s/secrets.yaml, with a service account that may create and update only
these Secrets. Each key that is missing gets a fresh random value; a key that exists is never
changed (so re-applying the manifests, or a Secret an operator created first, keeps its values):

- ``ftbus-nats-users``: one password per NATS user of deploy/nats/accounts.conf (``ftbus.permissions``'s
  users, and ``sys``), 48 hex characters: safe inside a ``nats://user:password@host`` URL;
- ``ftbus-dashboard-auth``: the dashboard's web password (``password``, user ``ftbus``) and its
  ``htpasswd`` line (salted SHA-1, ``{SSHA}``) for the authenticating proxy in front of it.

No value is printed. An operator reads one with
``kubectl -n ftbus get secret ftbus-nats-users -o jsonpath='{.data.agent}' | base64 -d``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import secrets
import sys
from collections.abc import Callable
from typing import Any

NATS_USERS_SECRET = "ftbus-nats-users"
DASHBOARD_SECRET = "ftbus-dashboard-auth"
DASHBOARD_USER = "ftbus"


def nats_users() -> list[str]:
    """The NATS users whose passwords the server and the pods read (NATS_<USER>_PASSWORD)."""
    from ftbus.permissions import users

    return [user.name for user in users()] + ["sys"]


def new_password() -> str:
    return secrets.token_hex(24)


def ssha(password: str, salt: bytes | None = None) -> str:
    """An htpasswd hash nginx's auth_basic reads: ``{SSHA}`` base64(sha1(password + salt) + salt)."""
    salt = salt if salt is not None else secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def _decoded(secret: Any) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def ensure_secret(api: Any, namespace: str, name: str, fill: Callable[[dict[str, str]], dict[str, str]]) -> list[str]:
    """Create Secret ``name``, or add what is missing to it: ``fill(current)`` returns the keys to add.
    Returns the keys added."""
    from kubernetes.client.exceptions import ApiException

    try:
        secret = api.read_namespaced_secret(name, namespace, _request_timeout=30)
    except ApiException as exc:
        if exc.status != 404:
            raise
        added = fill({})
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "ftbus"}},
                "stringData": added}
        api.create_namespaced_secret(namespace, body, _request_timeout=30)
        return sorted(added)
    current = _decoded(secret)
    added = fill(current)
    if added:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in {**current, **added}.items()}
        body = {"apiVersion": "v1", "kind": "Secret", "type": secret.type or "Opaque",
                "metadata": {"name": name, "resourceVersion": secret.metadata.resource_version,
                             "labels": secret.metadata.labels or {}},
                "data": data}
        api.replace_namespaced_secret(name, namespace, body, _request_timeout=30)
    return sorted(added)


def fill_nats_users(current: dict[str, str]) -> dict[str, str]:
    return {user: new_password() for user in nats_users() if not current.get(user)}


def fill_dashboard(current: dict[str, str]) -> dict[str, str]:
    added: dict[str, str] = {}
    password = current.get("password") or new_password()
    if not current.get("password"):
        added["password"] = password
    if not current.get("htpasswd") or added:
        added["htpasswd"] = f"{DASHBOARD_USER}:{ssha(password)}\n"
    if not current.get("user"):
        added["user"] = DASHBOARD_USER
    return added


def generate(api: Any, namespace: str) -> dict[str, list[str]]:
    """Both Secrets, as above; returns the keys added to each."""
    return {
        NATS_USERS_SECRET: ensure_secret(api, namespace, NATS_USERS_SECRET, fill_nats_users),
        DASHBOARD_SECRET: ensure_secret(api, namespace, DASHBOARD_SECRET, fill_dashboard),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftbus.k8s_secrets", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", help="default: this pod's namespace")
    args = parser.parse_args(argv)
    from runners.kubernetes import kube_api, own_namespace

    namespace = args.namespace or own_namespace()
    for name, added in generate(kube_api(), namespace).items():
        print(f"{namespace}/{name}: " + (f"generated {', '.join(added)}" if added else "complete, left as it is"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
