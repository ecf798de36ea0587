"""The KEDA overlay (deploy/k8s-keda/) points each stage's scaler at what the code really creates.

Each stage Deployment of deploy/k8s/ must have a ScaledObject whose `nats-jetstream` trigger names
the stream and durable consumer that stage's workers use (shared/subjects.py, with the ConfigMap's
subject prefix), the NATS account those workers' users belong to (deploy/nats/accounts.conf), and
a monitoring endpoint on the headless service of the NATS StatefulSet, at the port the nodes serve
monitoring on: the scaler reaches a consumer's leader as `<pod>.<headless service>`. The lag the
scaler reads counts in-flight messages, so each lagThreshold must match what one pod holds in
flight (its --concurrency) for the one-GPU-per-pod stages. tests/integration/test_monitoring_lag.py
shows the lag itself on a real server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftbus.stages import PIPELINE
from shared.events import Stage
from shared.subjects import Subjects

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KEDA = REPO / "deploy" / "k8s-keda"
ACCOUNTS_CONF = REPO / "deploy" / "nats" / "accounts.conf"
CLUSTER_CONF = K8S / "nats" / "cluster.conf"  # deploy/nats's, made for a cluster (gen_nats_config.py)
GPU_STAGES = (Stage.train, Stage.bench)
#: Below 2.20.0 a missing consumer reads as the stream's last sequence: a scale to maxReplicaCount.
MIN_KEDA = (2, 20, 0)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(path: Path, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in _docs(path) if doc["kind"] == kind]


def _scaled_objects() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _kind(KEDA / "scaledobjects.yaml", "ScaledObject")}


def _deployment(stage: Stage) -> dict[str, Any]:
    (deployment,) = _kind(K8S / f"{stage.value}.yaml", "Deployment")
    return deployment


def _prefix() -> str:
    (configmap,) = _kind(K8S / "configmap.yaml", "ConfigMap")
    return str(configmap["data"]["FTBUS_SUBJECT_PREFIX"])


def _account_of(user: str) -> str:
    """The account of accounts.conf whose block declares ``user``."""
    text = ACCOUNTS_CONF.read_text()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^    ([A-Za-z_$][\w$]*)\s*\{", text, re.M)]
    assert starts, "accounts.conf declares no account"
    for (start, name), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        if re.search(rf"^\s*user:\s*{re.escape(user)}\s*$", text[start:end], re.M):
            return name
    raise AssertionError(f"no account of accounts.conf declares the user {user!r}")


def _concurrency(deployment: dict[str, Any]) -> int:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [str(a) for a in container["args"]]
    assert "--concurrency" in args, f"{deployment['metadata']['name']} does not say its --concurrency"
    return int(args[args.index("--concurrency") + 1])


def _triggers(scaled: dict[str, Any]) -> list[dict[str, str]]:
    triggers = scaled["spec"]["triggers"]
    assert triggers and all(t["type"] == "nats-jetstream" for t in triggers)
    return [t["metadata"] for t in triggers]


def test_every_stage_has_a_scaled_object_on_its_own_consumer() -> None:
    subjects = Subjects(_prefix())
    scaled = _scaled_objects()
    assert set(scaled) == {f"ftbus-{stage.value}" for stage in Stage}
    for stage in Stage:
        obj = scaled[f"ftbus-{stage.value}"]
        assert obj["spec"]["scaleTargetRef"]["name"] == _deployment(stage)["metadata"]["name"]
        assert obj["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
        first = _triggers(obj)[0]
        # The stream and durable exactly as the worker creates them (shared/runtime.py StageWorker).
        assert first["stream"] == subjects.stream_events
        assert first["consumer"] == subjects.durable(stage)
        # The account the stage's NATS user lives in: its workers' consumer is in that account.
        assert first["account"] == _account_of(stage.value), stage
        for trigger in _triggers(obj):
            assert trigger["account"] == first["account"]
            assert int(trigger["lagThreshold"]) >= 1
            assert int(trigger["activationLagThreshold"]) >= 0
            assert trigger.get("useHttps", "false") == "false"  # the monitoring port serves plain HTTP
        spec = obj["spec"]
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["fallback"]["replicas"] >= 1


def test_the_aggregator_also_scales_on_the_test_stream() -> None:
    subjects = Subjects(_prefix())
    triggers = _triggers(_scaled_objects()["ftbus-aggregate"])
    assert {(t["stream"], t["consumer"]) for t in triggers} == {
        (subjects.stream_events, subjects.durable(Stage.aggregate)),
        (subjects.stream_test, f"{subjects.durable(Stage.aggregate)}-test"),
    }


def test_in_flight_messages_count_so_the_threshold_is_what_a_pod_holds() -> None:
    """lag = num_pending + num_ack_pending: a pod busy with --concurrency messages shows that
    much lag by itself, so a threshold below it would grow a pool that is merely busy."""
    scaled = _scaled_objects()
    for stage in (Stage.data, Stage.judge, *GPU_STAGES):
        for trigger in _triggers(scaled[f"ftbus-{stage.value}"]):
            assert int(trigger["lagThreshold"]) == _concurrency(_deployment(stage)), stage


def test_fair_share_stages_also_scale_on_their_lanes() -> None:
    """A fair-share stage's workers empty its consumer into lanes at once (shared/lanes.py): what
    waits or is in work is the lag of the consumer over every lane, which the workers create."""
    subjects = Subjects(_prefix())
    scaled = _scaled_objects()
    for spec in PIPELINE:
        triggers = {(t["stream"], t["consumer"]) for t in _triggers(scaled[f"ftbus-{spec.stage}"])}
        lanes = (subjects.stream_lanes(spec.stage), subjects.lanes_gauge(spec.stage))
        assert (lanes in triggers) == spec.fair_share, spec.stage


def test_gpu_stages_one_gpu_per_pod_and_scale_to_zero() -> None:
    scaled = _scaled_objects()
    for stage in GPU_STAGES:
        deployment = _deployment(stage)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        # One GPU per pod: each run's pod requests it (FTBUS_SANDBOX_GPUS, runners/kubernetes.py); the
        # worker itself holds none, so a scaled-out worker idles no GPU between runs.
        assert "nvidia.com/gpu" not in str(container["resources"])
        assert {e["name"]: e.get("value") for e in container["env"]}["FTBUS_SANDBOX_GPUS"] == "1"
        assert _concurrency(deployment) == 1
        spec = scaled[f"ftbus-{stage.value}"]["spec"]
        assert spec["minReplicaCount"] == 0 and spec["cooldownPeriod"] >= 60
        # scale-in may stop a busy pod: never in a hurry
        assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
            "stabilizationWindowSeconds"] >= 300
    for stage in (Stage.data, Stage.judge, Stage.aggregate):
        assert scaled[f"ftbus-{stage.value}"]["spec"]["minReplicaCount"] >= 1, "light stages keep a warm pod"


def test_the_endpoint_is_the_headless_service_of_the_nats_statefulset() -> None:
    """In a cluster the scaler reaches the consumer's leader as `<server_name>.<endpoint host>`:
    the host must be the StatefulSet's headless service and server_name its pod name."""
    nats = _docs(K8S / "nats.yaml")
    (statefulset,) = [d for d in nats if d["kind"] == "StatefulSet"]
    services = {d["metadata"]["name"]: d for d in nats if d["kind"] == "Service"}
    (kustomization,) = _docs(K8S / "kustomization.yaml")
    namespace = kustomization["namespace"]
    headless = statefulset["spec"]["serviceName"]
    service = services[headless]
    assert service["spec"].get("clusterIP") == "None", "the StatefulSet's service must be headless"
    assert service["spec"].get("publishNotReadyAddresses") is True
    monitor_port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["monitor"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["monitor"] == monitor_port
    server_name = {e["name"]: e for e in container["env"]}["NATS_SERVER_NAME"]
    assert server_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    cluster_conf = CLUSTER_CONF.read_text()
    assert re.search(r"^server_name:\s*\$NATS_SERVER_NAME\s*$", cluster_conf, re.M)
    assert re.search(rf"^http_port:\s*{monitor_port}\s*$", cluster_conf, re.M)

    assert re.search(r"^\s*no_advertise:\s*true\s*$", cluster_conf, re.M), "KEDA takes its DNS path"
    # No cluster domain: KEDA's pod resolves `<name>.<namespace>.svc` through its search path.
    wanted = f"{headless}.{namespace}.svc:{monitor_port}"
    for obj in _scaled_objects().values():
        for trigger in _triggers(obj):
            assert trigger["natsServerMonitoringEndpoint"] == wanted
            assert not trigger["natsServerMonitoringEndpoint"].startswith("nats-client")


def test_keda_may_reach_the_monitoring_port() -> None:
    (policy,) = _kind(KEDA / "networkpolicy.yaml", "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "nats"}
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8222, "protocol": "TCP"}]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "keda"}


def test_the_overlay_is_apart_from_the_plain_manifests_and_pins_keda() -> None:
    (base,) = _docs(K8S / "kustomization.yaml")
    assert not any("keda" in str(r) for r in base["resources"]), "../k8s must apply on a cluster without KEDA"
    for path in K8S.glob("*.yaml"):
        assert all(doc.get("apiVersion", "").split("/")[0] != "keda.sh" for doc in _docs(path)), path
    (overlay,) = _docs(KEDA / "kustomization.yaml")
    assert overlay["resources"][0] == "../k8s"
    assert {"scaledobjects.yaml", "networkpolicy.yaml"} <= set(overlay["resources"])
    pins = re.findall(r"--version (\d+)\.(\d+)\.(\d+)", (KEDA / "kustomization.yaml").read_text())
    assert pins and all(tuple(map(int, pin)) >= MIN_KEDA for pin in pins)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: the overlay is not built")
def test_the_overlay_builds_and_leaves_replicas_to_keda() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(KEDA)],
        capture_output=True, text=True, timeout=120, check=False,  # a hang guard
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert len(scaled) == len(Stage)
    assert {d["metadata"]["namespace"] for d in scaled} == {"ftbus"}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for stage in Stage:
        # the HPA owns it: a replicas field would reset it on every apply
        assert "replicas" not in deployments[f"ftbus-{stage.value}"]["spec"]
