"""Every worker's metrics scraped by a real Prometheus (Debian's `prometheus`, `make prometheus`), a
request flowing through, and the stage durations read back with PromQL over Prometheus's HTTP API:
once with a worker process per stage and the dashboard (six endpoints), once against `ftbus up` (one
process, one endpoint, and its dashboard's)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ftbus.client import Client
from ftbus.embedded import free_port
from shared.bus import Bus
from shared.events import Stage, TaskSpec
from shared.settings import Settings
from tests.integration.conftest import write_workspace

REPO = Path(__file__).resolve().parents[2]
FTBUS = [sys.executable, "-m", "ftbus.cli"]
TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
STAGES = [str(stage) for stage in Stage]
#: Generous: a loaded 2-core machine starts six Python processes and a Prometheus here.
WAIT_S = 180.0


def _prometheus_binary() -> str | None:
    unpacked = REPO / ".tools" / "prometheus" / "usr" / "bin" / "prometheus"
    return str(unpacked) if unpacked.is_file() else shutil.which("prometheus")


pytestmark = pytest.mark.skipif(
    _prometheus_binary() is None,
    reason="no prometheus binary: `make prometheus` unpacks Debian's package into .tools/prometheus",
)


def _wait(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S, *, alive: Callable[[], None] = lambda: None
          ) -> Any:
    """Poll ``check`` until it returns something true; ``alive`` raises when a process it needs died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive()
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Process:
    """A child process whose output goes to a file, read for the lines it prints."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.log_path.name} exited with {self.proc.returncode}:\n{self.output()[-3000:]}")

    def printed(self, pattern: str) -> str:
        """The first group of ``pattern`` in what the process printed, once it has printed it."""
        match = _wait(lambda: re.search(pattern, self.output()), f"{pattern!r} in {self.log_path.name}",
                      alive=self.alive)
        return match.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Prometheus:
    """A real Prometheus scraping ``targets`` (job name -> metrics URL) every second."""

    def __init__(self, folder: Path, targets: dict[str, str]) -> None:
        jobs = []
        for job, url in targets.items():
            parts = urllib.parse.urlsplit(url)
            jobs.append({"job_name": job, "metrics_path": parts.path, "scrape_interval": "1s",
                         "static_configs": [{"targets": [parts.netloc]}]})
        config = folder / "prometheus.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))  # YAML ⊇ JSON
        self.url = f"http://127.0.0.1:{free_port()}"
        binary = _prometheus_binary()
        assert binary is not None
        self.process = Process([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                                f"--web.listen-address={self.url.removeprefix('http://')}"],
                               dict(os.environ), folder / "prometheus.log")
        _wait(self._ready, "Prometheus to be ready", alive=self.process.alive)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> dict[str, float]:
        """An instant query's answer: each series' labels (as ``job/stage/...``, sorted) -> its value."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=60) as response:  # hang guard
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1])
                for r in body["data"]["result"]}

    def until(self, promql: str, ok: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
        """The query's answer once ``ok`` holds for it."""
        seen: list[dict[str, float]] = []

        def check() -> dict[str, float] | None:
            seen[:] = [self.query(promql)]
            return seen[0] if ok(seen[0]) else None

        try:
            return _wait(check, what, alive=self.process.alive)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last answer to {promql!r}: {seen}") from None

    def stop(self) -> None:
        self.process.stop()


@contextmanager
def prometheus(folder: Path, targets: dict[str, str]) -> Iterator[Prometheus]:
    folder.mkdir(parents=True, exist_ok=True)
    server = Prometheus(folder, targets)
    try:
        yield server
    finally:
        server.stop()


def _env(settings: Settings, standin_bin: Path, assets_dir: Path, **more: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")},
        # Not about what "better" means: the tests' policy (tests/conftest.py), not the default.
        "FTBUS_JUDGE_POLICY": os.environ.get("FTBUS_JUDGE_POLICY", "llm"),
        "FTBUS_HOME": str(settings.home), "FTBUS_ASSETS_DIR": str(assets_dir),
        "FTBUS_TOOLCHAIN_BIN": str(standin_bin),
        "FTBUS_SANDBOX": "local",  # the stand-in tools live on the host (tests/conftest.py)
        "FTBUS_BENCH_ENGINE": "cold",  # the stand-in `lm_eval` is a command, not the harness
        "FTBUS_METRICS_PORT": "0", "FTBUS_METRICS_POLL_S": "1", "FTBUS_DASHBOARD_POLL_S": "1",
        "FTBUS_LOG_FORMAT": "json", "FTBUS_LOG_LEVEL": "INFO",
        **more,
    }


def _by(label: str, answer: dict[str, float]) -> dict[str, float]:
    """An answer keyed by one label's value (the query grouped by it)."""
    return {re.search(rf"(?:^|,){label}=([^,]*)", key).group(1): value for key, value in answer.items()}  # type: ignore[union-attr]


def _read_back_stage_durations(prom: Prometheus, grouping: str, only: str = "") -> None:
    """Each stage's handling durations, as Prometheus scraped them (``only``: more label matchers): one
    handling each at least, and time spent."""
    ok = f'outcome="ok"{only}'
    counts = prom.until(f"sum by ({grouping}) (ftbus_stage_duration_seconds_count{{{ok}}})",
                        lambda a: set(STAGES) <= {k for k, v in _by(grouping, a).items() if v >= 1},
                        "every stage's ok handling in Prometheus")
    assert set(_by(grouping, counts)) >= set(STAGES)
    sums = _by(grouping, prom.query(f"sum by ({grouping}) (ftbus_stage_duration_seconds_sum{{{ok}}})"))
    assert all(sums[stage] > 0 for stage in STAGES), sums
    # Histograms, so quantiles come out of PromQL: the median training took some time, under an hour.
    train = f'ftbus_stage_duration_seconds_bucket{{stage="train"{only}}}'
    median = prom.query(f"histogram_quantile(0.5, sum by (le) ({train}))")
    assert len(median) == 1 and 0 < next(iter(median.values())) <= 3600, median


async def test_prometheus_scrapes_every_worker_and_the_dashboard_and_reads_the_stage_durations(
    settings: Settings, bus: Bus, standin_bin: Path, assets_dir: Path, tmp_path: Path
) -> None:
    env = _env(settings, standin_bin, assets_dir, FTBUS_NATS_URL=str(settings.nats_url),
               FTBUS_SUBJECT_PREFIX=settings.subject_prefix)
    processes = {stage: Process([*FTBUS, "worker", stage], env, tmp_path / f"worker-{stage}.log") for stage in STAGES}
    processes["dashboard"] = Process([*FTBUS, "dashboard", "--port", "0"], env, tmp_path / "dashboard.log")
    try:
        targets = {name: p.printed(r"metrics: (http://\S+)") for name, p in processes.items()}
        assert len(set(targets.values())) == 6, targets  # one endpoint each, on ports that do not collide
        with prometheus(tmp_path / "prometheus", targets) as prom:
            prom.until("up", lambda a: len(a) == 6 and all(v == 1 for v in a.values()),
                       "every worker's and the dashboard's endpoint up")
            client = Client.on_bus(bus)
            rid = await client.submit(write_workspace(tmp_path / "ws"), TASK)
            verdict = await client.wait(rid, timeout_s=WAIT_S)
            assert verdict.status == "completed" and verdict.final_decision is True, verdict.execution
            # The stage durations, each from its own worker's endpoint.
            _read_back_stage_durations(prom, "job")
            # The aggregator observed the verdict's latency; the data stage's run of process_data.py
            # and the training's are counted by how they ended.
            prom.until('ftbus_verdict_latency_seconds_count{job="aggregate",status="completed"}',
                       lambda a: sum(a.values()) == 1, "the verdict's latency")
            runs = prom.until('sum by (job) (ftbus_sandbox_runs_total{cause="ok",sandbox="local"})',
                              lambda a: {"data", "train"} <= set(_by("job", a)), "the sandbox runs")
            assert all(v >= 1 for v in runs.values()), runs
            # Every stage's queue, read from JetStream by its worker and by the dashboard, drained:
            # five consumers, and the lanes of the two fair-share stages (shared/lanes.py).
            queued = prom.until("ftbus_stage_queued", lambda a: len({k for k in a if "job=dashboard" in k}) == 7
                                and all(v == 0 for v in a.values()), "the stage queues")
            assert {stage for stage in _by("stage", queued)} == set(STAGES)
            lanes = {key for key in queued if "consumer=lanes" in key}
            assert {(job, stage) for job in ("dashboard", "train", "bench") for stage in ("train", "bench")
                    if any(f"job={job}" in k and f"stage={stage}" in k for k in lanes)} == {
                ("dashboard", "train"), ("dashboard", "bench"), ("train", "train"), ("bench", "bench")}
            # Nothing failed, nothing is in flight, and no label names a request.
            assert prom.query('ftbus_stage_outcomes_total{outcome!="ok"} > 0') == {}
            assert all(v == 0 for v in prom.query("ftbus_stage_in_flight").values())
            series = prom.query('{__name__=~"ftbus_.+"}')
            assert series and not any(rid in key for key in series)
    finally:
        for process in processes.values():
            process.stop()
    for name, process in processes.items():
        assert process.proc.returncode == 0, f"{name}:\n{process.output()[-3000:]}"


def test_prometheus_reads_the_stage_durations_of_ftbus_up(tmp_path: Path, standin_bin: Path,
                                                           assets_dir: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    env = _env(settings, standin_bin, assets_dir, FTBUS_DASHBOARD_PORT="0")
    up = Process([*FTBUS, "up"], env, tmp_path / "up.log")
    try:
        metrics_url = up.printed(r"metrics: (http://\S+)")
        dashboard_url = up.printed(r"dashboard: (http://\S+)")
        with prometheus(tmp_path / "prometheus", {"up": metrics_url, "dashboard": f"{dashboard_url}metrics"}) as prom:
            prom.until("up", lambda a: len(a) == 2 and all(v == 1 for v in a.values()), "both endpoints up")
            submit = subprocess.run(
                [*FTBUS, "submit", str(write_workspace(tmp_path / "ws")), "--base-model", "tiny-standin",
                 "--benchmark", "tiny-arith", "--wait", "--json"],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT_S, check=False,
            )
            assert submit.returncode == 0, submit.stderr[-3000:]
            # One process runs every stage: its one endpoint has each stage's durations. Its dashboard
            # serves the same process's metrics (scrape one of the two: docs/operations.md).
            _read_back_stage_durations(prom, "stage", ',job="up"')
            assert prom.query('ftbus_stage_duration_seconds_count{job="dashboard",stage="train",outcome="ok"}')
    finally:
        up.stop()
    assert up.proc.returncode == 0, up.output()[-3000:]
