"""The deployment files: the compose file and the cluster definition name only the images `make images`
builds, every worker connects as its stage's own NATS user of accounts.conf, and what a worker in a
container needs to start candidate containers on the host's engine is written in the files.

The cluster itself runs in `make cluster` (python -m chaos.cluster_run), not here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from chaos.containers import ComposeUnavailable, compose_binary

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose" / "docker-compose.yaml"
CLUSTER = REPO / "deploy" / "compose" / "cluster.yaml"
ACCOUNTS = REPO / "deploy" / "nats" / "accounts.conf"
CLUSTER_CONF = REPO / "deploy" / "nats" / "cluster.conf"
IMAGES_SCRIPT = REPO / "deploy" / "images" / "build.sh"
SANDBOXED = {"data", "train", "bench"}
STAGES = ("data", "train", "bench", "judge", "aggregate")


#: The variables an operator sets (deploy/compose/cluster.env.example); everything else keeps its default.
ENV = {**{f"NATS_{u}_PASSWORD": f"pw{u.lower()}" for u in
          ("ADMIN", "AGGREGATE", "DATA", "TRAIN", "BENCH", "JUDGE", "AGENT", "DASHBOARD", "SYS")},
       "FTBUS_HOST_ASSETS": "/srv/ftbus/assets"}


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable syntax: ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``, ``$$``."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise AssertionError(f"{name} is required: {arg}")
        return arg if op == ":-" else ""
    text = re.sub(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", one, text)
    return text.replace("$$", "$")


def load(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The file as compose reads it: variables interpolated, YAML merge keys resolved."""
    return yaml.safe_load(interpolate(path.read_text(), ENV if env is None else env))


def built_images() -> set[str]:
    """The image names deploy/images/build.sh builds (its `build TARGET NAME` lines and the sandbox)."""
    text = IMAGES_SCRIPT.read_text()
    names = set(re.findall(r"^build \w+ (ftbus-[a-z]+)$", text, re.M))
    names |= set(re.findall(r"deploy/sandbox/build\.sh\" \"\$TOOLCHAIN\" (ftbus-[a-z]+):latest", text))
    return names


def users_of_accounts() -> set[str]:
    return set(re.findall(r"\buser: (\w+)", ACCOUNTS.read_text()))


def nats_users(url: str) -> set[str]:
    return {urlsplit(part).username or "" for part in url.split(",")}


def worker_stage(service: dict[str, Any]) -> str | None:
    command = service.get("command") or []
    return command[1] if len(command) > 1 and command[0] == "worker" else None


def test_images_script_builds_the_three_agreed_images() -> None:
    assert built_images() == {"ftbus-services", "ftbus-toolchain", "ftbus-sandbox"}


@pytest.mark.parametrize("path", [COMPOSE, CLUSTER], ids=lambda p: p.name)
def test_every_image_named_is_built_by_make_images(path: Path) -> None:
    services = load(path)["services"]
    named = {svc["image"].split(":")[0] for svc in services.values() if "image" in svc}
    named |= {svc["environment"]["FTBUS_SANDBOX_IMAGE"].split(":")[0]
              for svc in services.values() if "FTBUS_SANDBOX_IMAGE" in (svc.get("environment") or {})}
    assert named, f"{path.name} names no image"
    assert named <= built_images(), f"{path.name} names images make images does not build: {named - built_images()}"


def test_compose_build_builds_the_sandbox_image_without_a_profile() -> None:
    sandbox = load(COMPOSE)["services"]["sandbox-image"]
    assert sandbox["image"] == "ftbus-sandbox:latest"
    assert "profiles" not in sandbox and sandbox["build"]["dockerfile"] == "deploy/docker/sandbox.Dockerfile"
    assert sandbox["deploy"]["replicas"] == 0  # built, never started


@pytest.mark.parametrize("path", [COMPOSE, CLUSTER], ids=lambda p: p.name)
def test_the_sandbox_dir_belongs_to_the_workers_uid_before_they_start(path: Path) -> None:
    services = load(path)["services"]
    init = services["sandbox-dir"]
    assert "chown 10001:10001" in " ".join(init["entrypoint"])
    for name, svc in services.items():
        if worker_stage(svc) in SANDBOXED:
            assert svc["depends_on"]["sandbox-dir"]["condition"] == "service_completed_successfully", name


def test_cluster_has_two_workers_per_stage_each_on_its_own_stage_user() -> None:
    services = load(CLUSTER)["services"]
    accounts = users_of_accounts()
    per_stage: dict[str, int] = {}
    for name, svc in services.items():
        stage = worker_stage(svc)
        if stage is None:
            continue
        per_stage[stage] = per_stage.get(stage, 0) + 1
        env = svc["environment"]
        assert nats_users(env["FTBUS_NATS_URL"]) == {stage}, f"{name} connects as another user"
        assert stage in accounts, f"accounts.conf has no user {stage}"
        assert f":{ENV[f'NATS_{stage.upper()}_PASSWORD']}@" in env["FTBUS_NATS_URL"], name
        assert len(env["FTBUS_NATS_URL"].split(",")) == 3, f"{name} does not know every node"
    assert per_stage == dict.fromkeys(STAGES, 2)
    dashboard = services["dashboard"]["environment"]
    assert nats_users(dashboard["FTBUS_NATS_URL"]) == {"dashboard"} and dashboard["FTBUS_CLIENT_NAME"] == "dashboard"


def test_cluster_workers_reach_the_engine_with_same_path_mounts_and_own_hostnames() -> None:
    services = load(CLUSTER)["services"]
    hostnames, work_dirs = set(), set()
    for name, svc in services.items():
        stage = worker_stage(svc)
        if stage is None:
            continue
        hostnames.add(svc["hostname"])
        if stage not in SANDBOXED:
            assert not any("docker.sock" in v for v in svc.get("volumes", [])), f"{name} must not hold the engine"
            continue
        env = svc["environment"]
        assert env["FTBUS_SANDBOX"] == "docker"
        assert "/var/run/docker.sock:/var/run/docker.sock" in svc["volumes"]
        assert svc["group_add"], f"{name} needs the socket's group"
        for volume in svc["volumes"]:
            host, _, rest = volume.partition(":")
            inside = rest.split(":")[0]
            assert host == inside, f"{name}: {volume} is not mounted at its host path"
        work_dirs.add(env["FTBUS_WORK_DIR"])
        assert env["FTBUS_WORK_DIR"].startswith("/var/lib/ftbus-sandbox/"), name
        assert env["FTBUS_ASSETS_DIR"] == ENV["FTBUS_HOST_ASSETS"], name
        if stage in {"train", "bench"}:  # each worker its own GPUs, host ids, none unless set
            assert env["FTBUS_SANDBOX_GPUS"] == "none", name
            gpus = f"FTBUS_GPUS_{stage.upper()}_{name[-1]}"
            chosen = load(CLUSTER, {**ENV, gpus: "3"})["services"][name]["environment"]
            assert str(chosen["FTBUS_SANDBOX_GPUS"]) == "3", f"{gpus} does not select {name}'s GPUs"
    assert len(hostnames) == 10 and len(work_dirs) == 6  # a restarted worker reaps its predecessor's sandboxes


def test_cluster_nodes_run_the_repositorys_cluster_conf_under_its_route_names() -> None:
    services = load(CLUSTER)["services"]
    routes = set(re.findall(r"nats-route://([^:\s]+):6222", CLUSTER_CONF.read_text()))
    nodes = {name: svc for name, svc in services.items() if name.startswith("nats-")}
    assert len(nodes) == 3
    aliases = set()
    for name, svc in nodes.items():
        assert svc["command"] == ["-c", "/etc/nats/cluster.conf"] and "../nats:/etc/nats:ro" in svc["volumes"]
        assert svc["environment"]["NATS_SERVER_NAME"] == name
        aliases |= set(svc["networks"]["bus"]["aliases"])
        assert all(port.startswith("127.0.0.1:") for port in svc["ports"]), "published beyond this host"
    assert routes and routes <= aliases, f"cluster.conf routes {routes - aliases} resolve to no node"


@pytest.mark.parametrize("path", [COMPOSE, CLUSTER], ids=lambda p: p.name)
def test_docker_compose_itself_accepts_the_file(path: Path, tmp_path: Path) -> None:
    try:
        binary = compose_binary()
    except ComposeUnavailable as exc:
        pytest.skip(f"no Docker Compose v2 here ({exc})")
    env_file = tmp_path / "env"
    env_file.write_text("".join(f"NATS_{u.upper()}_PASSWORD=x\n" for u in users_of_accounts())
                        + f"FTBUS_HOST_ASSETS={tmp_path}\n")
    done = subprocess.run([*binary, "-f", str(path), "--env-file", str(env_file), "config", "-q"],
                          capture_output=True, text=True, timeout=60)  # a hang guard
    assert done.returncode == 0, done.stderr
