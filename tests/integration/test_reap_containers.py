"""Sandbox containers of a worker that ran in a container of the same engine (a compose service, a
replaced container) are reaped once that container is gone, and not before; those of a worker on
another machine are left alone (runners/docker.py: reap_containers). A real Docker engine."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import docker
import pytest

from runners.docker import LABEL_OWNER, LABEL_OWNER_CONTAINER, container_of_host, engine_client, reap_containers
from tests.sandbox_support import require_sandbox


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    require_sandbox()
    yield engine_client()


def test_a_replaced_worker_containers_sandboxes_are_reaped_and_another_machines_are_not(
        client: docker.DockerClient) -> None:
    image = require_sandbox()
    tag = secrets.token_hex(4)
    worker_host = f"ftbus-worker-{tag}"
    worker = client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none", hostname=worker_host,
                                   labels={"ftbus.test": tag})
    made: list[object] = [worker]
    try:
        # What a DockerRunner in that container notes at its check(), and labels its runs with:
        assert container_of_host(client, worker_host) == worker.id
        labels = {LABEL_OWNER: f"{worker_host}:7:1.00", LABEL_OWNER_CONTAINER: worker.id, "ftbus.test": tag}
        of_worker = client.containers.create(image, ["sleep", "600"], network_mode="none", labels=labels)
        elsewhere = client.containers.create(image, ["sleep", "600"], network_mode="none",
                                             labels={LABEL_OWNER: f"gpu-host-{tag}:7:1.00", "ftbus.test": tag})
        made += [of_worker, elsewhere]
        removed = reap_containers(client)
        assert of_worker.name not in removed and elsewhere.name not in removed, "its worker's container runs"

        worker.remove(force=True)  # the worker's container is replaced: a new one, another hostname
        removed = reap_containers(client)
        assert of_worker.name in removed and elsewhere.name not in removed
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(of_worker.id)
        assert client.containers.get(elsewhere.id).status == "created"
    finally:
        for container in made:
            try:
                container.remove(force=True)  # type: ignore[attr-defined]
            except docker.errors.NotFound:
                pass
