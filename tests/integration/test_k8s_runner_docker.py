"""The Kubernetes runner with its pods' containers run by a real container runtime, from the real
sandbox image: the stand-in API of tests/k8s_api.py with `runtime="docker"` starts each container
as a Docker container with the pod's user, read-only root, dropped capabilities, memory limit,
mounts and no network. So the runner's commands (the wait for the ready mark, `sleep infinity`,
`head -c | tar -x`, `tar -c`) are proven in `ftbus-sandbox` as its unprivileged user, and an OOM
kill is the kernel's. Scheduling, a network plugin's policies and GPUs are not (docs/sandbox.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from runners.kubernetes import KubernetesRunner
from runners.sandbox import Sandbox
from tests.k8s_api import FakeKubernetes
from tests.sandbox_support import require_sandbox


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubernetes, Path, str]]:
    image = require_sandbox()
    assets = tmp_path / "assets"
    (assets / "models" / "tiny").mkdir(parents=True)
    (assets / "models" / "tiny" / "config.json").write_text('{"model": "tiny"}')
    (assets / "benchmarks").mkdir()
    (assets / "benchmarks" / "hidden.jsonl").write_text("the hidden test split\n")
    server = FakeKubernetes(tmp_path / "kubelet", claims={"ftbus-assets": assets}, runtime="docker").start()
    try:
        yield server, assets, image
    finally:
        server.stop()
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=ftbus.test-kubelet={server.tag}"],
                              capture_output=True, text=True, check=False).stdout.split()
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
        assert not left, "every run's containers were removed with its pod"


def _runner(server: FakeKubernetes, assets: Path, image: str, **kwargs: object) -> KubernetesRunner:
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))
    return KubernetesRunner(image, stage="data", namespace="ftbus", api=api, volumes={str(assets): "ftbus-assets"},
                            start_timeout_s=120, **kwargs)  # type: ignore[arg-type]


SCRIPT = """
import os, pathlib
model = pathlib.Path(os.environ["MODEL"])
out = [f"uid={os.getuid()}", "model=" + (model / "config.json").read_text()]
out.append("benchmarks=" + str((model.parent.parent / "benchmarks").exists()))
try:
    open("/usr/escape", "w")
    out.append("root=writable")
except OSError:
    out.append("root=read-only")
out.append("routes=" + str(len(pathlib.Path("/proc/net/route").read_text().splitlines()) - 1))
pathlib.Path("result.txt").write_text("\\n".join(out) + "\\n")
print("done")
"""


async def test_a_run_in_the_sandbox_image_as_a_pod_would_run_it(cluster: tuple[FakeKubernetes, Path, str],
                                                                tmp_path: Path) -> None:
    server, assets, image = cluster
    cwd = tmp_path / "work" / "run"
    cwd.mkdir(parents=True)
    (cwd / "script.py").write_text(SCRIPT)
    model = assets / "models" / "tiny"
    run = await _runner(server, assets, image).run(
        ["python3", "script.py"], cwd=cwd, env={"MODEL": str(model)}, timeout_s=120, log_path=tmp_path / "run.log",
        sandbox=Sandbox.reading(model), max_file_bytes=50 * 2**20)
    assert run.exit_code == 0, run.output_tail
    assert "done" in run.output_tail
    result = (cwd / "result.txt").read_text().splitlines()
    assert result == ["uid=1000", 'model={"model": "tiny"}', "benchmarks=False", "root=read-only", "routes=0"]


async def test_out_of_memory_in_the_pod_is_137(cluster: tuple[FakeKubernetes, Path, str], tmp_path: Path) -> None:
    server, assets, image = cluster
    cwd = tmp_path / "oom"
    cwd.mkdir()
    run = await _runner(server, assets, image, memory="96m").run(
        ["python3", "-c", "b = bytearray(400 * 2**20); print(len(b))"], cwd=cwd, timeout_s=120,
        log_path=tmp_path / "oom.log")
    assert run.exit_code == 137 and run.oom_killed, run.output_tail


async def test_a_timeout_removes_the_pods_containers(cluster: tuple[FakeKubernetes, Path, str],
                                                    tmp_path: Path) -> None:
    server, assets, image = cluster
    cwd = tmp_path / "slow"
    cwd.mkdir()
    # It never ends; its first line must be out before the limit, hence a limit it is nowhere near
    # (the line comes at once, on a loaded machine too).
    run = await _runner(server, assets, image).run(["sh", "-c", "echo started; sleep 300"], cwd=cwd, timeout_s=30,
                                                   log_path=tmp_path / "slow.log")
    assert run.exit_code == 124 and run.timed_out and "started" in run.output_tail
