"""The Kubernetes runner (runners/kubernetes.py) through the real `kubernetes` client.

No Kubernetes can run here: the client talks to tests/k8s_api.py, a local HTTP server on 127.0.0.1
that speaks the API for the calls the runner makes (pods: create, read, list, watch, delete, log,
exec over a websocket) and runs each container as a local process. What this proves: the pod the
runner asks for (checked against the Kubernetes schema too), the files moved in and out through
exec, output streamed from the log, exit codes, timeouts, cancels, OOM kills, start failures and
the reaping of pods left by a dead worker. What it cannot prove (docs/sandbox.md): that a real
kubelet enforces the isolation asked for.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client

from runners import kubernetes as kubernetes_runner
from runners.base import Runner
from runners.kubernetes import (
    ANNOTATION_OWNER,
    ANNOTATION_OWNER_POD,
    ANNOTATION_OWNER_UID,
    LABEL_SANDBOX,
    KubernetesRunner,
    gpu_count,
    reap_pods,
)
from runners.sandbox import Sandbox, SandboxUnavailable, host_identity
from tests.k8s_api import FakeKubernetes

IMAGE = "ftbus-sandbox:0.1.0"
NS = "ftbus"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubernetes, Path]]:
    assets = tmp_path / "assets"
    (assets / "models" / "tiny").mkdir(parents=True)
    (assets / "models" / "tiny" / "config.json").write_text('{"model": "tiny"}')
    (assets / "benchmarks").mkdir()
    (assets / "benchmarks" / "hidden-test.jsonl").write_text("the hidden test split\n")
    server = FakeKubernetes(tmp_path / "kubelet", claims={"ftbus-assets": assets}).start()
    try:
        yield server, assets
    finally:
        server.stop()


def _api(server: FakeKubernetes) -> client.CoreV1Api:
    return client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))


def _runner(server: FakeKubernetes, assets: Path, **kwargs: Any) -> KubernetesRunner:
    return KubernetesRunner(IMAGE, stage="train", namespace=NS, api=_api(server), volumes={str(assets): "ftbus-assets"},
                            start_timeout_s=60, **kwargs)


def _workspace(tmp_path: Path) -> Path:
    cwd = tmp_path / "work" / "req-1"
    cwd.mkdir(parents=True)
    (cwd / "input.txt").write_text("from the worker\n")
    (cwd / "sub").mkdir()
    (cwd / "sub" / "nested.txt").write_text("nested\n")
    return cwd


async def test_a_run_is_a_pod_that_streams_its_output_and_brings_the_workspace_back(
        cluster: tuple[FakeKubernetes, Path], tmp_path: Path) -> None:
    server, assets = cluster
    cwd = _workspace(tmp_path)
    peft = tmp_path / "scratch" / "adapter"  # a declared path outside the shared volumes: copied in
    peft.mkdir(parents=True)
    (peft / "adapter.safetensors").write_text("weights")
    model = assets / "models" / "tiny"
    runner = _runner(server, assets, gpus=1, runtime_class="gvisor", cpus=2, memory="4g")
    assert isinstance(runner, Runner)
    lines: list[str] = []
    script = (f"echo hello; echo to-stderr >&2; cat input.txt sub/nested.txt > copy.txt; "
              f"cat {model}/config.json > model.txt; cat {peft}/adapter.safetensors > peft.txt; "
              "exit 3")
    run = await runner.run(["sh", "-c", script], cwd=cwd, env={"FTBUS_X": "1"}, timeout_s=60,
                           log_path=tmp_path / "logs" / "train.log", on_line=lines.append,
                           sandbox=Sandbox.reading(model, peft, gpus=True), request_id="req-1",
                           max_file_bytes=10 * 2**20)

    assert run.exit_code == 3 and not run.timed_out and not run.cancelled and not run.oom_killed
    assert run.sandbox == "kubernetes:gvisor:ftbus-sandbox:0.1.0"
    assert "hello" in lines and "to-stderr" in lines
    assert "hello" in (tmp_path / "logs" / "train.log").read_text() and "hello" in run.output_tail
    # Written in the pod, brought back into the worker's folder:
    assert (cwd / "copy.txt").read_text() == "from the worker\nnested\n"
    assert (cwd / "model.txt").read_text() == '{"model": "tiny"}'
    assert (cwd / "peft.txt").read_text() == "weights"
    assert not server.pods, "the pod is deleted after the run"

    (pod,) = server.created
    kubernetes_validate.validate(pod, "1.33", strict=True)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["runtimeClassName"] == "gvisor"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The disk quota: no file past it (RLIMIT_FSIZE in 512-byte blocks), no working volume past it.
    assert {"name": "work", "emptyDir": {"sizeLimit": "10Mi"}} in spec["volumes"]
    assert pod["metadata"]["labels"][LABEL_SANDBOX] == "true"
    assert pod["metadata"]["annotations"][ANNOTATION_OWNER] == host_identity()
    assert "hostNetwork" not in spec and "hostPID" not in spec
    assert all("hostPath" not in v for v in spec["volumes"]), "nothing of the node is mounted"
    main = next(c for c in spec["containers"] if c["name"] == "main")
    assert main["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                       "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert main["resources"]["limits"] == {"memory": str(4 * 2**30), "cpu": "2000m", "nvidia.com/gpu": "1"}
    assert main["workingDir"] == str(cwd)
    assert "ulimit -f 20480" in main["command"][2]
    assert {"name": "FTBUS_X", "value": "1"} in main["env"]
    assert {"name": "OMP_NUM_THREADS", "value": "2"} in main["env"]  # cpus=2: two threads, not the node's count
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts[str(model)]["readOnly"] and mounts[str(model)]["subPath"] == "models/tiny"
    assert mounts[str(peft)]["readOnly"] and str(cwd) in mounts and not mounts[str(cwd)].get("readOnly")
    claims = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "claim-0", "persistentVolumeClaim": {"claimName": "ftbus-assets", "readOnly": True}}]


async def test_a_run_past_its_timeout_is_killed_with_exit_124(cluster: tuple[FakeKubernetes, Path],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, assets = cluster
    cwd = _workspace(tmp_path)
    # The runner's clock jumps an hour once the run has printed: its timeout comes after the output,
    # and comes at all, however slow a loaded machine is (never on the real clock's 600 s).
    ahead = [0.0]
    monkeypatch.setattr(kubernetes_runner, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + ahead[0]))

    def on_line(line: str) -> None:
        if line == "started":
            ahead[0] = 3600.0

    forever = "echo started; while :; do sleep 1; done"  # never ends by itself: only the kill ends it
    run = await asyncio.wait_for(  # a hang guard: the kill comes at once after the jump
        _runner(server, assets).run(["sh", "-c", forever], cwd=cwd, timeout_s=600, log_path=tmp_path / "t.log",
                                    on_line=on_line), 120)
    assert run.exit_code == 124 and run.timed_out and not run.cancelled
    assert "started" in run.output_tail and "killed after 600 seconds: the stage timeout" in run.output_tail
    assert run.duration_s >= 600, "not killed before its timeout (on the runner's clock)"
    assert not server.pods


async def test_a_cancel_kills_the_pod_with_exit_130(cluster: tuple[FakeKubernetes, Path], tmp_path: Path) -> None:
    server, assets = cluster
    cwd = _workspace(tmp_path)
    cancel = asyncio.Event()

    async def on_line(line: str) -> None:
        if line == "running":
            cancel.set()

    run = await _runner(server, assets).run(["sh", "-c", "echo running; sleep 120"], cwd=cwd, timeout_s=60,
                                            log_path=tmp_path / "c.log", on_line=on_line, cancel=cancel)
    assert run.exit_code == 130 and run.cancelled and not run.timed_out
    assert not server.pods


async def test_an_oom_kill_is_exit_137(cluster: tuple[FakeKubernetes, Path], tmp_path: Path) -> None:
    server, assets = cluster
    run = await _runner(server, assets).run(["sh", "-c", "kill -9 $$"], cwd=_workspace(tmp_path), timeout_s=60,
                                            log_path=tmp_path / "o.log")
    assert run.exit_code == 137 and run.oom_killed
    assert "out of memory" in run.output_tail


async def test_links_out_of_the_workspace_do_not_come_back(cluster: tuple[FakeKubernetes, Path],
                                                          tmp_path: Path) -> None:
    server, assets = cluster
    cwd = _workspace(tmp_path)
    run = await _runner(server, assets).run(
        ["sh", "-c", "ln -s /etc/passwd leak; ln -s ../../../../etc up; echo ok > fine.txt"], cwd=cwd, timeout_s=60,
        log_path=tmp_path / "l.log")
    assert run.exit_code == 0
    assert (cwd / "fine.txt").read_text() == "ok\n"
    assert not (cwd / "leak").is_symlink() and not (cwd / "up").is_symlink()
    assert "not brought back" in run.output_tail


async def test_a_pod_that_cannot_start_is_our_error_and_is_removed(cluster: tuple[FakeKubernetes, Path],
                                                                  tmp_path: Path) -> None:
    server, assets = cluster
    server.missing_images.add(IMAGE)
    with pytest.raises(RuntimeError, match="ErrImagePull"):
        await _runner(server, assets).run(["true"], cwd=_workspace(tmp_path), timeout_s=60, log_path=tmp_path / "x.log")
    assert not server.pods


def _sandbox_pod(server: FakeKubernetes, name: str, annotations: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {LABEL_SANDBOX: "true"}, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "300"]}]}}
    _api(server).create_namespaced_pod(NS, body)


def test_pods_of_a_replaced_or_dead_worker_are_reaped(cluster: tuple[FakeKubernetes, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = cluster
    api = _api(server)
    worker = api.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ftbus-train-a"},
                                            "spec": {"containers": [{"name": "w", "image": "x",
                                                                     "command": ["sleep", "300"]}]}})
    monkeypatch.setenv("POD_NAME", "ftbus-train-b")
    live = {ANNOTATION_OWNER: "ftbus-train-a:1:1.00", ANNOTATION_OWNER_POD: "ftbus-train-a",
            ANNOTATION_OWNER_UID: worker.metadata.uid}
    _sandbox_pod(server, "sbx-live-owner", live)
    _sandbox_pod(server, "sbx-replaced-owner", {**live, ANNOTATION_OWNER_UID: "an-older-pod"})
    _sandbox_pod(server, "sbx-deleted-owner", {**live, ANNOTATION_OWNER_POD: "ftbus-train-gone"})
    # This pod's own earlier worker process (a restarted container): dead, so its pods go.
    dead_here = f"{os.uname().nodename}:999999999:1.00"
    _sandbox_pod(server, "sbx-earlier-process", {ANNOTATION_OWNER: dead_here, ANNOTATION_OWNER_POD: "ftbus-train-b"})
    _sandbox_pod(server, "sbx-this-process", {ANNOTATION_OWNER: host_identity(), ANNOTATION_OWNER_POD: "ftbus-train-b"})

    removed = reap_pods(api, NS)
    assert sorted(removed) == ["sbx-deleted-owner", "sbx-earlier-process", "sbx-replaced-owner"]
    left = {p.metadata.name for p in api.list_namespaced_pod(NS).items}
    assert left == {"ftbus-train-a", "sbx-live-owner", "sbx-this-process"}


def test_the_worker_pod_owns_its_sandbox_pods(cluster: tuple[FakeKubernetes, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    server, assets = cluster
    monkeypatch.setenv("POD_NAME", "ftbus-train-a")
    monkeypatch.setenv("POD_UID", "1234")
    monkeypatch.setenv("POD_NAMESPACE", NS)
    pod = _runner(server, assets).pod_manifest("sbx", ["true"], tmp_path, {}, Sandbox(), "req", [])
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "ftbus-train-a",
                                                   "uid": "1234"}]


def test_a_worker_without_rights_on_pods_is_told_what_to_grant(cluster: tuple[FakeKubernetes, Path]) -> None:
    server, assets = cluster
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url + "/forbidden")))
    runner = KubernetesRunner(IMAGE, stage="data", namespace=NS, api=api)
    with pytest.raises(SandboxUnavailable, match=r"deploy/k8s/sandbox\.yaml"):
        runner.check()
    _runner(server, assets).check()


def test_gpus_are_a_count_the_device_plugin_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_count("2") == 2 and gpu_count("0,1") == 2 and gpu_count("none") == 0
    with pytest.raises(SandboxUnavailable, match="count"):
        gpu_count("all")


def test_the_gpus_a_device_plugin_gave_are_the_ones_a_container_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker container given GPUs by Kubernetes' device plugin sees NVIDIA_VISIBLE_DEVICES, not
    CUDA_VISIBLE_DEVICES: an engine beside it must pass on exactly those."""
    from runners.docker import gpu_request

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-8a1f,GPU-77c2")
    assert gpu_request(None)[0]["DeviceIDs"] == ["GPU-8a1f", "GPU-77c2"]
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")
    assert gpu_request(None) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # an explicit choice still wins
    assert gpu_request(None)[0]["DeviceIDs"] == ["1"]


def test_sandbox_kubernetes_gives_workers_the_pod_runner(cluster: tuple[FakeKubernetes, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from runners.choice import describe_sandbox, make_runner
    from shared.settings import Settings

    server, _ = cluster
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: fake, cluster: {{server: '{server.url}'}}}}]\n"
        "users: [{name: u, user: {token: not-checked}}]\n"
        "contexts: [{name: c, context: {cluster: fake, user: u}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _sandbox_pod(server, "sbx-of-a-gone-worker", {ANNOTATION_OWNER: "x:1:1.00", ANNOTATION_OWNER_POD: "gone"})
    settings = Settings(home=tmp_path, sandbox="kubernetes", sandbox_k8s_namespace=NS, sandbox_gpus="1",
                        sandbox_image=IMAGE, sandbox_k8s_runtime_class="gvisor")
    runner = make_runner(settings, "train")
    assert isinstance(runner, KubernetesRunner) and runner.gpus == 1 and runner.name.startswith("kubernetes:")
    assert not server.pods, "the worker reaped the pod its predecessor left"
    assert "kubernetes" in describe_sandbox(settings)
    with pytest.raises(SandboxUnavailable, match="FTBUS_BENCH_ENGINE=cold"):
        make_runner(settings.model_copy(update={"bench_engine": "warm"}), "bench")
    assert isinstance(make_runner(settings.model_copy(update={"bench_engine": "cold"}), "bench"), KubernetesRunner)


async def test_runs_at_once_on_one_runner_do_not_cross(cluster: tuple[FakeKubernetes, Path], tmp_path: Path) -> None:
    """The benchmark runs its splits at once through one runner: an exec of one run must not turn
    another run's API calls into websockets (the client's stream() swaps its ApiClient's transport)."""
    server, assets = cluster
    runner = _runner(server, assets)
    folders = []
    for i in range(4):
        folder = tmp_path / f"split-{i}"
        folder.mkdir()
        (folder / "input.txt").write_text(f"split {i}\n" * 2000)
        folders.append(folder)
    runs = await asyncio.gather(*(
        runner.run(["sh", "-c", "cp input.txt output.txt"], cwd=folder, timeout_s=60,
                   log_path=folder.parent / f"{i}.log")
        for i, folder in enumerate(folders)))
    assert [run.exit_code for run in runs] == [0, 0, 0, 0]
    for i, folder in enumerate(folders):
        assert (folder / "output.txt").read_text() == f"split {i}\n" * 2000
    assert not server.pods


async def test_a_pod_evicted_for_its_disk_use_is_the_candidates_quota_failure(
        cluster: tuple[FakeKubernetes, Path], tmp_path: Path) -> None:
    server, assets = cluster
    message = 'Usage of EmptyDir volume "work" exceeds the limit "10Mi".'

    async def on_line(line: str) -> None:
        if line == "filling":
            (pod,) = server.pods.values()
            await asyncio.to_thread(server.call, pod.evict, message)

    run = await _runner(server, assets).run(["sh", "-c", "echo filling; sleep 120"], cwd=_workspace(tmp_path),
                                            timeout_s=60, log_path=tmp_path / "e.log", on_line=on_line,
                                            max_file_bytes=10 * 2**20)
    assert run.exit_code == 125 and not run.timed_out and not run.cancelled
    assert message in run.output_tail
    assert not server.pods


async def test_a_pod_evicted_for_the_nodes_trouble_is_retried(cluster: tuple[FakeKubernetes, Path],
                                                             tmp_path: Path) -> None:
    server, assets = cluster

    async def on_line(line: str) -> None:
        if line == "running":
            (pod,) = server.pods.values()
            await asyncio.to_thread(server.call, pod.evict, "The node was low on resource: ephemeral-storage.")

    with pytest.raises(RuntimeError, match="low on resource"):
        await _runner(server, assets).run(["sh", "-c", "echo running; sleep 120"], cwd=_workspace(tmp_path),
                                          timeout_s=60, log_path=tmp_path / "n.log", on_line=on_line)
    assert not server.pods
