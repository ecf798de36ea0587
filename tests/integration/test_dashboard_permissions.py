"""The dashboard runs as the `dashboard` NATS user of deploy/nats/accounts.conf, and needs nothing more.

A real nats-server with the repository's own config; the pipeline runs as `admin` (as `ftbus up
--nats-url` does); the dashboard connects as `dashboard`, serves every page's data, including the
hidden test split and its private log, and the server records no permission violation.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ftbus.dashboard.app import DashboardServer
from shared.events import Report, TaskSpec
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace
from tests.integration.secured_nats import SecuredServer

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecuredServer]:
    server = SecuredServer(tmp_path_factory.mktemp("dashboard-secured-nats"))
    server.start()
    yield server
    server.stop()


def _settings(server: SecuredServer, user: str, home: Path, standin_bin: Path, assets_dir: Path) -> Settings:
    return Settings(
        home=home / user, assets_dir=assets_dir, nats_url=server.url(user),
        subject_prefix="ftbus",  # accounts.conf is written for the default prefix
        toolchain_bin=standin_bin, ack_wait_s=4.0, heartbeat_s=1.0, max_deliver=3, retry_backoff_s=[0.2, 0.5],
        sweep_interval_s=1.0, log_format="console", log_level="WARNING", dashboard_poll_s=0.3, dashboard_port=0,
    )


async def _get(url: str) -> tuple[int, Any]:
    def fetch() -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:  # a hang guard
                body = response.read()
                kind = response.headers.get("content-type", "")
                return response.status, json.loads(body) if "json" in kind else body.decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    return await asyncio.to_thread(fetch)


async def test_the_dashboard_needs_only_the_dashboard_users_grants(
    secured: SecuredServer, standin_bin: Path, assets_dir: Path, tmp_path: Path
) -> None:
    pipeline = Pipeline(_settings(secured, "admin", tmp_path, standin_bin, assets_dir))
    dashboard = DashboardServer(_settings(secured, "dashboard", tmp_path, standin_bin, assets_dir))
    try:
        await pipeline.start()
        assert pipeline.client is not None
        rid = await pipeline.client.submit(write_workspace(tmp_path / "ws"), TASK)
        await pipeline.client.wait(rid, timeout_s=120)
        report = await pipeline.client.wait_report(rid, timeout_s=60)
        assert isinstance(report, Report) and report.benchmark_test is not None

        since = secured.log_size()
        url = (await dashboard.start()).rstrip("/")
        assert dashboard.state.bus is not None
        polls = 0  # the dashboard's consumer polls (its stats loop), counted
        refresh = dashboard.state.refresh_stats

        async def counted_refresh() -> None:
            nonlocal polls
            try:
                await refresh()
            finally:
                polls += 1

        dashboard.state.refresh_stats = counted_refresh  # type: ignore[method-assign]
        # Every page's data, read with the dashboard user's grants only.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60  # a hang guard
        overview: dict[str, Any] = {}
        while loop.time() < deadline:
            status, overview = await _get(url + "/api/overview")
            assert status == 200
            if overview["requests"] and len(overview["stages"]) == 5 and all(
                    s["error"] is None and s["workers"] >= 1 for s in overview["stages"]):
                break
            await asyncio.sleep(0.3)
        assert [r["request_id"] for r in overview["requests"]] == [rid]
        assert len(overview["stages"]) == 5 and all(s["workers"] >= 1 for s in overview["stages"]), overview
        assert overview["dead_letters"] == 0

        status, detail = await _get(f"{url}/api/requests/{rid}")
        assert status == 200, detail
        assert detail["test"]["primary_value"] == report.benchmark_test.primary_value
        assert {log["name"] for log in detail["logs"]} >= {"training.log", "benchmark-test.log"}
        status, text = await _get(f"{url}/requests/{rid}/logs/benchmark-test.log")
        assert status == 200 and text
        status, board = await _get(url + "/api/leaderboard")
        assert status == 200 and board["boards"][0]["rows"][0]["request_id"] == rid
        assert (await _get(url + "/api/dead-letters"))[0] == 200
        # A few more consumer polls (60 s: a hang guard), then a round trip on the dashboard's
        # connection: the server has handled (and logged any refusal of) everything it sent before.
        seen = polls
        deadline = loop.time() + 60
        while polls < seen + 3:
            assert loop.time() < deadline, f"the dashboard's consumer polls stopped at {polls}"
            await asyncio.sleep(0.1)
        await dashboard.state.bus.nc.flush()

        violations = [v for v in secured.violations(since) if v.user == "dashboard"]
        assert violations == [], violations
        assert "Authorization Error" not in secured.log_text(since)
    finally:
        await dashboard.stop()
        await pipeline.stop()
