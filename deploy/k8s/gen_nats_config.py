"""deploy/k8s/nats/: the NATS config of the Kubernetes manifests, generated from deploy/nats/.

`kubectl kustomize deploy/k8s` loads only files inside deploy/k8s, so the StatefulSet's ConfigMap
is made from copies here, kept in sync by this script (tests/unit/test_k8s_manifests.py fails while
they differ from its output). The copies are the same files with two changes for a cluster:

- cluster.conf's routes name the nodes by their short names (`nats-0.nats:6222`), resolved in the
  pods' own namespace through their DNS search path: neither the namespace nor the cluster domain is
  written anywhere, so both can be chosen at install time (docs/operations.md, "Kubernetes");
- cluster.conf sets `no_advertise: true`: the nodes do not gossip their pod IPs to clients, so
  clients (and KEDA's scaler, which reaches a consumer's leader as `<server_name>.<endpoint host>`)
  go through the services' DNS names, not addresses that change with every rescheduled pod.

accounts.conf is copied as it is (ftbus/permissions.py generates it).

    .venv/bin/python deploy/k8s/gen_nats_config.py --write    # after changing deploy/nats/
    .venv/bin/python deploy/k8s/gen_nats_config.py --check    # exit 1 while the copies differ
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "nats"
TARGET = HERE / "nats"
HEADER = ("# GENERATED from deploy/nats/{name} by deploy/k8s/gen_nats_config.py: do not edit; edit the source,\n"
          "# then `.venv/bin/python deploy/k8s/gen_nats_config.py --write`.{extra}\n")
ROUTE = re.compile(r"nats-route://(nats-\d+)\.nats\.[a-z0-9-]+\.svc\.[a-z0-9.-]+:(\d+)")


def cluster_conf(text: str) -> str:
    routes, count = ROUTE.subn(r"nats-route://\1.nats:\2", text)
    if count == 0:
        raise SystemExit("deploy/nats/cluster.conf has no `nats-route://nats-N.nats.<ns>.svc.<domain>:PORT` routes "
                         "any more: update deploy/k8s/gen_nats_config.py")
    block = re.search(r"^cluster \{\n", routes, re.M)
    if block is None:
        raise SystemExit("deploy/nats/cluster.conf has no `cluster {` block: update deploy/k8s/gen_nats_config.py")
    advertise = ("    # Kubernetes: clients connect through the services' DNS names, never to pod IPs gossiped by\n"
                 "    # the nodes (they change with every rescheduled pod); KEDA then takes its DNS path.\n"
                 "    no_advertise: true\n")
    extra = "\n# Changed for Kubernetes: short route names (any namespace, any cluster domain), no_advertise."
    return HEADER.format(name="cluster.conf", extra=extra) + routes[: block.end()] + advertise + routes[block.end():]


def generated() -> dict[str, str]:
    return {
        "cluster.conf": cluster_conf((SOURCE / "cluster.conf").read_text()),
        "accounts.conf": HEADER.format(name="accounts.conf", extra="") + (SOURCE / "accounts.conf").read_text(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write deploy/k8s/nats/")
    mode.add_argument("--check", action="store_true", help="exit 1 when deploy/k8s/nats/ differs")
    args = parser.parse_args(argv)
    stale = [name for name, text in generated().items()
             if not (TARGET / name).exists() or (TARGET / name).read_text() != text]
    if args.check:
        for name in stale:
            print(f"deploy/k8s/nats/{name} differs from deploy/nats/{name}: run "
                  "`.venv/bin/python deploy/k8s/gen_nats_config.py --write`")
        return 1 if stale else 0
    TARGET.mkdir(exist_ok=True)
    for name, text in generated().items():
        (TARGET / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
