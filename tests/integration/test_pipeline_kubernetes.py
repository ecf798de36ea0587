"""The whole pipeline with `sandbox: kubernetes`: every run of candidate code (process_data.py,
training, each benchmark split) is a pod made through the real `kubernetes` client.

No Kubernetes can run here: the client talks to tests/k8s_api.py, a local stand-in of the API
whose "kubelet" runs each pod's containers as local processes (with the stand-in toolchain on the
image's PATH). Real NATS and real services; what this proves is that the stages work through the
pod runner (files in and out through exec, output from the log, outcomes), not a cluster's
isolation (docs/sandbox.md, "On Kubernetes: a pod per run").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.events import TaskSpec
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace
from tests.k8s_api import FakeKubernetes

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")


@pytest.fixture
def cluster(tmp_path: Path, assets_dir: Path, standin_bin: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[FakeKubernetes]:
    server = FakeKubernetes(tmp_path / "kubelet", claims={"ftbus-assets": assets_dir},
                            path=f"{standin_bin}{os.pathsep}{os.environ.get('PATH', '')}").start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: stand-in, cluster: {{server: '{server.url}'}}}}]\n"
        "users: [{name: worker, user: {token: not-checked}}]\n"
        "contexts: [{name: c, context: {cluster: stand-in, user: worker}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield server
    finally:
        server.stop()


async def test_a_candidate_passes_with_every_run_in_a_pod_of_its_own(
        settings: Settings, cluster: FakeKubernetes, assets_dir: Path, tmp_path: Path) -> None:
    settings = settings.model_copy(update={
        "sandbox": "kubernetes", "sandbox_k8s_namespace": "ftbus", "sandbox_image": "ftbus-sandbox:0.1.0",
        "sandbox_k8s_volumes": {str(assets_dir): "ftbus-assets"}, "sandbox_gpus": "1", "bench_engine": "cold",
    })
    pipeline = Pipeline(settings)
    try:
        await pipeline.start()
        assert pipeline.client is not None
        rid = await pipeline.client.submit(write_workspace(tmp_path / "ws"), TASK)
        verdict = await pipeline.client.wait(rid, timeout_s=180)
    finally:
        await pipeline.stop()

    assert verdict.status == "completed" and verdict.final_decision is True, verdict.execution
    assert verdict.sandbox == "kubernetes:ftbus-sandbox:0.1.0"
    assert verdict.result.data_stats is not None and verdict.result.data_stats.total_samples == 40
    assert len(verdict.result.training_metrics.loss_history.train) == 5
    assert {a.path for a in verdict.artifacts} >= {"output/adapter_model.safetensors"}
    stages = [pod["metadata"]["labels"]["ftbus.io/stage"] for pod in cluster.created]
    assert stages.count("data") == 1 and stages.count("train") == 1 and stages.count("bench") >= 2
    train = next(pod for pod in cluster.created if pod["metadata"]["labels"]["ftbus.io/stage"] == "train")
    (main,) = [c for c in train["spec"]["containers"] if c["name"] == "main"]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert all(v.get("persistentVolumeClaim", {}).get("claimName") in (None, "ftbus-assets")
               for v in train["spec"]["volumes"])
    assert not cluster.pods, "every run's pod was deleted"
