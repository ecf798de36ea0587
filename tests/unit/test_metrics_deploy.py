"""The deployments' metrics files (deploy/prometheus, deploy/grafana, the compose files, deploy/k8s and
deploy/k8s-monitoring) name only metrics and labels ftbus has, and Prometheus's own promtool accepts
the scrape configurations and the alert rules, and fires the dead-letter alert on a series."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import shared.metrics  # noqa: F401  (registers every ftbus metric)
from tests.unit.test_deploy_cluster import CLUSTER, COMPOSE, load, worker_stage
from tests.unit.test_k8s_manifests import _containers, _kubectl_problem, _render, _rendered

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
GRAFANA = REPO / "deploy" / "grafana" / "ftbus.json"
STAGES = {"data", "train", "bench", "judge", "aggregate"}
#: Labels a query may group by: ftbus's bounded ones and Prometheus's own.
LABELS = {"stage", "outcome", "consumer", "sandbox", "cause", "source", "kind", "status", "le", "job", "instance",
          "service"}
PORT = 9470


def _exposed_names() -> set[str]:
    """Every series name ftbus's metrics can expose (a histogram's buckets, a counter's _total)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",)}
    return {m.name + s for m in REGISTRY.collect() if m.name.startswith("ftbus_") for s in suffixes[m.type]}


def _expressions() -> dict[str, str]:
    """Where each PromQL expression of the deployment files is written -> the expression."""
    found = {}
    for panel in json.loads(GRAFANA.read_text())["panels"]:
        for target in panel["targets"]:
            found[f"grafana: {panel['title']} {target['refId']}"] = target["expr"]
    for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            found[f"alert {rule['alert']}"] = rule["expr"]
    return found


def test_every_query_names_metrics_ftbus_exposes_and_groups_by_bounded_labels() -> None:
    exposed = _exposed_names()
    queries = _expressions()
    assert len(queries) > 20
    used: set[str] = set()
    for where, expr in queries.items():
        names = set(re.findall(r"\bftbus_[a-z_]+", expr))
        assert names <= exposed, f"{where} names {names - exposed}"
        used |= names
        for grouping in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in grouping.split(",")}
            assert labels <= LABELS, f"{where} groups by {labels - LABELS}"
    # Every kind of metric the issue asks for is on the dashboard.
    dashboard = " ".join(v for k, v in queries.items() if k.startswith("grafana"))
    for metric in ("ftbus_stage_duration_seconds_bucket", "ftbus_stage_in_flight", "ftbus_stage_queued",
                   "ftbus_stage_outcomes_total", "ftbus_stage_redeliveries_total", "ftbus_dead_letters_total",
                   "ftbus_gpu_slots_busy", "ftbus_sandbox_runs_total", "ftbus_llm_tokens_total",
                   "ftbus_verdict_latency_seconds_bucket", "ftbus_training_resumed_total",
                   "ftbus_training_steps_saved_total"):
        assert metric in dashboard, f"no panel shows {metric}"


# ------------------------------------------------------------------ promtool


def _promtool() -> str | None:
    unpacked = REPO / ".tools" / "prometheus" / "usr" / "bin" / "promtool"
    return str(unpacked) if unpacked.is_file() else shutil.which("promtool")


needs_promtool = pytest.mark.skipif(_promtool() is None, reason="no promtool: `make prometheus` unpacks Debian's "
                                    "prometheus package into .tools/prometheus")


@needs_promtool
@pytest.mark.parametrize("config", ["compose.yml", "cluster.yml"])
def test_promtool_accepts_the_scrape_configuration_and_its_rules(config: str) -> None:
    # kubernetes.yml is not checked here: Debian's build of Prometheus leaves Kubernetes discovery out.
    out = subprocess.run([str(_promtool()), "check", "config", config], cwd=PROMETHEUS, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


@needs_promtool
def test_the_dead_letter_alert_fires_on_a_new_dead_letter_and_not_before(tmp_path: Path) -> None:
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    labels = {"severity": "warning", "stage": "train"}
    annotations = {
        "summary": "train: 1 dead letter(s) in 15 minutes",
        "description": next(r["annotations"]["description"]
                            for r in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"][0]["rules"]
                            if r["alert"] == "FtbusDeadLetters"),
    }
    tests = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'ftbus_dead_letters_total{stage="train",job="ftbus"}',
                          "values": "0 0 0 0 0 1 1 1 1 1"}],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "FtbusDeadLetters", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "FtbusDeadLetters",
             "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]},
        ],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    out = subprocess.run([str(_promtool()), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------ compose


@pytest.mark.parametrize("path", [COMPOSE, CLUSTER], ids=lambda p: p.name)
def test_every_compose_worker_serves_metrics_where_the_scrape_job_looks(path: Path) -> None:
    services = load(path)["services"]
    workers = {name: svc for name, svc in services.items() if worker_stage(svc)}
    assert {worker_stage(svc) for svc in workers.values()} == STAGES
    for name, svc in workers.items():
        env = svc["environment"]
        assert env["FTBUS_METRICS_HOST"] == "0.0.0.0" and int(env["FTBUS_METRICS_PORT"]) == PORT, name
    job = yaml.safe_load((PROMETHEUS / ("compose.yml" if path == COMPOSE else "cluster.yml")).read_text())
    workers_job = next(j for j in job["scrape_configs"] if j["job_name"] == "ftbus")
    if path == COMPOSE:  # by service name: one target per replica
        (dns,) = workers_job["dns_sd_configs"]
        assert set(dns["names"]) == set(workers) and dns["port"] == PORT
    else:
        (static,) = workers_job["static_configs"]
        assert set(static["targets"]) == {f"{name}:{PORT}" for name in workers}
        dashboard = next(j for j in job["scrape_configs"] if j["job_name"] == "ftbus-dashboard")
        args = services["dashboard"]["command"]
        assert dashboard["static_configs"][0]["targets"] == [f"dashboard:{args[args.index('--port') + 1]}"]


# ------------------------------------------------------------------ Kubernetes


needs_kubectl = pytest.mark.skipif(_kubectl_problem() is not None, reason=str(_kubectl_problem()))


@needs_kubectl
def test_every_kubernetes_worker_pod_is_annotated_for_prometheus_on_its_metrics_port() -> None:
    docs = _rendered()
    settings = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ftbus-settings")["data"]
    assert settings["FTBUS_METRICS_HOST"] == "0.0.0.0" and int(settings["FTBUS_METRICS_PORT"]) == PORT
    annotated = {}
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        template = doc["spec"]["template"]
        notes = template["metadata"].get("annotations", {})
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        if notes.get("prometheus.io/scrape") != "true":
            continue
        ports = {p["containerPort"]: p["name"] for c in _containers(doc) for p in c.get("ports", [])}
        assert int(notes["prometheus.io/port"]) in ports, f"{component}: nothing listens on the annotated port"
        assert notes["prometheus.io/path"] == "/metrics"
        annotated[component] = ports[int(notes["prometheus.io/port"])]
    assert annotated == {**dict.fromkeys(STAGES, "metrics"), "dashboard": "http"}
    # The dashboard's proxy lets that one path through without a login, and nothing else.
    conf = (REPO / "deploy" / "k8s" / "dashboard" / "nginx.conf").read_text()
    metrics = re.search(r"location = /metrics \{(.*?)\}", conf, re.S)
    assert metrics and "auth_basic off;" in metrics.group(1) and "proxy_pass http://127.0.0.1:8470;" in metrics.group(1)
    assert conf.count("auth_basic off;") == 2  # /healthz and /metrics


@needs_kubectl
def test_the_monitoring_overlay_selects_every_worker_and_the_dashboard_by_their_port_names() -> None:
    docs = _render(REPO / "deploy" / "k8s-monitoring")
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"ftbus-workers", "ftbus-dashboard"}
    pods = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in docs if d["kind"] == "Deployment"}

    def selected(monitor: dict) -> set[str]:
        selector = monitor["spec"]["selector"]
        chosen = set()
        for component, doc in pods.items():
            labels = doc["spec"]["template"]["metadata"]["labels"]
            ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
            ok &= all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))
            if ok:
                chosen.add(component)
        return chosen

    assert selected(monitors["ftbus-workers"]) == STAGES
    assert selected(monitors["ftbus-dashboard"]) == {"dashboard"}
    for monitor in monitors.values():
        for component in selected(monitor):
            names = {p["name"] for c in _containers(pods[component]) for p in c.get("ports", [])}
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in names and endpoint["path"] == "/metrics", component
