"""The dashboard in a real headless browser (Playwright driving Debian's Chromium), against a
running pipeline on the stand-in tools and a real nats-server.

The dashboard runs as users run it: `ftbus dashboard` in a subprocess, with its own NATS
connection. Screenshots of each page go to a folder printed at the end of the run
(FTBUS_SCREENSHOT_DIR overrides it).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ftbus.embedded import EmbeddedServer, free_port
from ftbus.stages import PIPELINE
from shared.events import Report, Stage, TaskSpec
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace

REPO = Path(__file__).resolve().parents[2]
FTBUS = [sys.executable, "-m", "ftbus.cli"]
TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")
CHROMIUM = os.environ.get("FTBUS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STAGES = [spec.stage for spec in PIPELINE]  # the cards follow the pipeline table (ftbus/stages.py)
WAIT_MS = 90_000
#: The campaign test's benchmark: tiny-arith under another name (the env fixture adds it).
CAMPAIGN_BENCHMARK = "tiny-arith-campaigns"
#: The ranking test's benchmark: tiny-arith under a third name, so that its board holds its own three
#: candidates whatever this module's other tests (in any order) submitted before it.
LEADERBOARD_BENCHMARK = "tiny-arith-leaderboard"


def _browser_missing() -> str | None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (make install)"
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (make browser: apt-get install -y chromium)"
    return None


pytestmark = pytest.mark.skipif(_browser_missing() is not None, reason=str(_browser_missing()))


# ---------------------------------------------------------------------- fixtures


class Env:
    def __init__(self, server: EmbeddedServer, settings: Settings, pipeline: Pipeline, url: str, shots: Path,
                 tmp: Path) -> None:
        self.server = server
        self.settings = settings
        self.pipeline = pipeline
        self.url = url.rstrip("/")
        self.shots = shots
        self.tmp = tmp

    async def submit(self, name: str, task: TaskSpec = TASK, **train: Any) -> str:
        ws = write_workspace(self.tmp / f"ws-{name}-{secrets.token_hex(3)}", train=train or None)
        assert self.pipeline.client is not None
        return await self.pipeline.client.submit(ws, task)

    async def verdict(self, rid: str) -> Any:
        assert self.pipeline.client is not None
        return await self.pipeline.client.wait(rid, timeout_s=180)

    async def report(self, rid: str) -> Report:
        assert self.pipeline.client is not None
        report = await self.pipeline.client.wait_report(rid, timeout_s=120)
        assert isinstance(report, Report)
        return report


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    chosen = os.environ.get("FTBUS_SCREENSHOT_DIR")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("dashboard-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    shots = sorted(p.name for p in folder.glob("*.png"))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and shots:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(f"\ndashboard screenshots ({len(shots)}) in {folder}: {', '.join(shots)}")


def _start_dashboard(settings: Settings, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")},
        "FTBUS_HOME": str(settings.home),
        "FTBUS_NATS_URL": str(settings.nats_url),
        "FTBUS_SUBJECT_PREFIX": settings.subject_prefix,
        "FTBUS_DASHBOARD_POLL_S": "0.5",
        "FTBUS_LOG_FORMAT": "json",
        "FTBUS_LOG_LEVEL": "INFO",
    }
    log = log_path.open("wb")
    proc = subprocess.Popen([*FTBUS, "dashboard", "--port", "0"], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"dashboard: (http://\S+)", log_path.read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"`ftbus dashboard` printed no URL:\n{log_path.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory, standin_bin: Path, assets_dir: Path,
              screenshot_dir: Path) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("dashboard")
    assets = tmp / "assets"
    shutil.copytree(assets_dir, assets)
    for name in (CAMPAIGN_BENCHMARK, LEADERBOARD_BENCHMARK):
        bench = assets / "benchmarks" / name
        shutil.copytree(assets / "benchmarks" / TASK.benchmark, bench)
        spec = bench / "benchmark.yaml"
        spec.write_text(spec.read_text().replace(f"name: {TASK.benchmark}\n", f"name: {name}\n", 1))
    # A server of this module's own, on a fixed port: the reconnect test restarts it.
    server = EmbeddedServer(tmp / "store", port=free_port(), log_file=tmp / "nats.log")
    server.start()
    settings = Settings(
        home=tmp / "home", assets_dir=assets, nats_url=server.url, subject_prefix="d" + secrets.token_hex(4),
        toolchain_bin=standin_bin, ack_wait_s=4.0, heartbeat_s=1.0, max_deliver=3, retry_backoff_s=[0.2, 0.5],
        sweep_interval_s=1.0, log_format="console", log_level="WARNING",
    )
    pipeline = Pipeline(settings)
    await pipeline.start()
    proc, url = await asyncio.to_thread(_start_dashboard, settings, tmp / "dashboard.log")
    try:
        yield Env(server, settings, pipeline, url, screenshot_dir, tmp)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
        await pipeline.stop()
        server.stop()
    # Ctrl-C stops it cleanly (and it stopped at all).
    assert proc.returncode == 0, (tmp / "dashboard.log").read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = await context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # Offline: the pages must load nothing from outside the dashboard.
    outside: list[str] = []
    pg.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("http://127.0.0.1", "data:")) else None)
    try:
        yield pg
    finally:
        await context.close()
    assert not errors, f"script errors on the page: {errors}"
    assert not outside, f"the page fetched from outside: {outside}"


async def _text(page: Any, selector: str) -> str:
    return (await page.text_content(selector) or "").strip()


async def _rows(page: Any, selector: str) -> list[str]:
    return await page.eval_on_selector_all(selector, "rows => rows.map(r => r.dataset.requestId)")


# ---------------------------------------------------------------------- tests


async def test_overview_shows_stage_cards_requests_and_dead_letters(env: Env, page: Any) -> None:
    rid = await env.submit("overview")
    verdict = await env.verdict(rid)
    assert verdict.status == "completed", verdict.execution
    # An undecodable request: the data stage dead-letters it.
    assert env.pipeline.bus is not None
    await env.pipeline.bus.js.publish(env.pipeline.bus.subjects.eval_requested, b"not an event")

    await page.goto(env.url + "/")
    await page.wait_for_function(f"document.querySelectorAll('#stages .card').length === {len(STAGES)}",
                                 timeout=WAIT_MS)
    assert await page.eval_on_selector_all("#stages .card", "cs => cs.map(c => c.dataset.stage)") == STAGES
    # Each card is titled with the table's label: the page keeps no stage names of its own.
    headings = await page.eval_on_selector_all("#stages .card h3", "hs => hs.map(h => h.firstChild.textContent)")
    assert headings == [spec.label for spec in PIPELINE]
    # Every stage has its worker bound (idle workers wait in a pull request on the server).
    await page.wait_for_function(
        "[...document.querySelectorAll('#stages .card [data-key=workers] .v')].every(v => +v.textContent >= 1)",
        timeout=WAIT_MS)
    for stage in STAGES:
        for key in ("pending", "in_flight", "redeliveries", "workers"):
            assert re.fullmatch(r"\d+", await _text(page, f".card[data-stage={stage}] [data-key={key}] .v"))
    row = f"#requests tr[data-request-id='{rid}']"
    # Completed, once the dashboard has read the record's last change (it may come after the verdict).
    await page.wait_for_selector(f"{row}[data-status='completed']", timeout=WAIT_MS)
    assert "tiny-arith" in await _text(page, row)
    await page.wait_for_function("document.getElementById('dlq-count').textContent === '1'", timeout=WAIT_MS)
    # The stage cards agree with the server's own consumer state.
    subjects = env.pipeline.bus.subjects
    info = await env.pipeline.bus.js.consumer_info(subjects.stream_events, subjects.durable(Stage.data))
    assert info.num_pending == 0
    assert await _text(page, ".card[data-stage=data] [data-key=pending] .v") == "0"
    await page.screenshot(path=str(env.shots / "overview.png"), full_page=True)

    await page.click("#dlq")
    await page.wait_for_selector("#dead-letters tbody tr", timeout=WAIT_MS)
    text = await _text(page, "#dead-letters tbody")
    assert "eval.requested" in text and "data" in text
    await page.screenshot(path=str(env.shots / "dead-letters.png"), full_page=True)


async def test_request_page_draws_the_loss_curve_live_then_complete(env: Env, page: Any) -> None:
    steps = 10
    # The training stops before its third step until the gate opens: the page sees it live with two
    # points, however long the page takes to load (not a training just long enough for it).
    gate = env.tmp / f"gate-{secrets.token_hex(3)}"
    rid = await env.submit("loss", standin_step_s=0.2, max_steps=steps, standin_gate_file=str(gate),
                           standin_gate_step=3)
    await page.goto(f"{env.url}/requests/{rid}")
    # Live, while training runs: some points, not yet all of them, from the progress events.
    await page.wait_for_function(
        f"(() => {{ const d = document.getElementById('loss').dataset;"
        f" return d.source === 'live' && +d.points >= 2 && +d.points < {steps}; }})()",
        timeout=WAIT_MS)
    live_points = int(await page.get_attribute("#loss", "data-points") or 0)
    assert 2 <= live_points < steps
    await page.screenshot(path=str(env.shots / "request-training.png"), full_page=True)
    # The curve grows without a reload.
    await page.evaluate("window.__samePage = true")
    gate.touch()
    await page.wait_for_function(f"+document.getElementById('loss').dataset.points > {live_points}", timeout=WAIT_MS)

    verdict = await env.verdict(rid)
    assert verdict.status == "completed", verdict.execution
    report = await env.report(rid)
    # Complete afterwards, from the loss history: one drawn point per step.
    await page.wait_for_function("document.getElementById('loss').dataset.source === 'history'", timeout=WAIT_MS)
    assert await page.evaluate("window.__samePage") is True
    drawn = await page.eval_on_selector_all("#loss .scatterlayer .trace:first-child path.point", "ps => ps.length")
    assert drawn == steps == len(verdict.result.training_metrics.loss_history.train)
    assert await page.evaluate("document.getElementById('loss').data[0].y") == [
        p.loss for p in verdict.result.training_metrics.loss_history.train]

    await page.wait_for_selector("#validation-table", timeout=WAIT_MS)
    await page.wait_for_selector("#test-table", timeout=WAIT_MS)
    await page.wait_for_selector("#logs li[data-log='training.log']", timeout=WAIT_MS)
    # Validation per subset beside the baseline and the difference, as the verdict says.
    bench, base = verdict.result.benchmark, verdict.result.baseline
    for subset, metrics in bench.accuracy_summary.items():
        cells = await page.eval_on_selector_all(
            f"#validation-table tbody tr[data-subset='{subset}'] td", "tds => tds.map(t => t.textContent)")
        base_value = base.baseline.accuracy_summary[subset]["exact_match"]
        assert cells[2:] == [f"{metrics['exact_match']:.4f}", f"{base_value:.4f}",
                             f"{metrics['exact_match'] - base_value:+.4f}"]
    # Which scorer made those numbers (tiny-arith: lm-eval's exact match).
    assert bench.scorer == "exact"
    assert await _text(page, "#validation-scorer") == "scorer: exact · protocol: validation"
    # The paired comparison with the base model on the same items: its words, difference, interval, p, items.
    paired = base.paired
    assert paired is not None and base.summary is not None
    assert await _text(page, "#paired-summary") == base.summary
    assert await page.get_attribute("#paired", "data-direction") == paired.direction
    cells = await page.eval_on_selector_all("#paired-table tbody td", "tds => tds.map(t => t.textContent)")
    p_text = "< 0.001" if paired.p_value < 0.001 else f"{paired.p_value:.3f}"
    assert cells[:4] == [f"{paired.difference:+.4f}", f"{paired.ci_low:+.4f} to {paired.ci_high:+.4f}", p_text,
                         str(paired.items)]
    # The hidden test split, as the report (read with the dashboard's own user) has it.
    assert report.benchmark_test is not None
    for subset, metrics in report.benchmark_test.accuracy_summary.items():
        assert await _text(page, f"#test-table tr[data-subset='{subset}'] td.num") == f"{metrics['exact_match']:.4f}"
    # The verdict's four texts, data statistics, error samples, timeline.
    for field in ("execution", "return_checking", "code", "raw_execution"):
        assert await _text(page, f"#feedback details[data-field={field}] pre") == getattr(verdict, field).strip()
    assert "40 samples" in await _text(page, "#data")
    # What the code ran under, as the verdict says (the stand-in tests run without isolation: shown).
    assert verdict.sandbox == "local"
    assert await page.get_attribute("#task [data-sandbox]", "data-sandbox") == "local"
    assert await _text(page, "#task [data-sandbox]") == "no sandbox"
    assert await page.eval_on_selector_all("#errors tbody tr", "rs => rs.length") == len(bench.error_samples) > 0
    stages = await page.eval_on_selector_all("#timeline tbody tr",
                                             "rs => rs.map(r => [r.dataset.stage, r.dataset.attempts])")
    assert [s for s, _ in stages][:4] == ["data", "train", "bench", "judge"]
    view = await env.pipeline.client.status(rid)
    assert view is not None
    assert stages == [[name, str(t.attempts)] for name, t in sorted(
        view.stages.items(), key=lambda kv: STAGES.index(kv[0]) if kv[0] in STAGES else 99)]
    # Stage logs open, the test split's from the private store.
    log = await page.request.get(f"{env.url}/requests/{rid}/logs/training.log")
    assert log.ok and "Running training" in await log.text()
    test_log = await page.request.get(f"{env.url}/requests/{rid}/logs/benchmark-test.log")
    assert test_log.ok
    assert (await page.request.get(f"{env.url}/requests/{rid}/logs/..%2F..%2Fetc%2Fpasswd")).status == 404
    # Read-only: no route accepts anything but GET.
    for path in ("/api/overview", f"/api/requests/{rid}", f"/requests/{rid}", "/leaderboard.csv"):
        assert (await page.request.post(env.url + path, data="{}")).status == 405
    await page.screenshot(path=str(env.shots / "request.png"), full_page=True)


async def test_the_request_page_shows_the_verdicts_sandbox_and_llm_usage(env: Env, page: Any) -> None:
    """A finished request whose process_data.py called an LLM through the gateway, in a Docker sandbox
    (the stand-in pipeline runs neither): its record as the aggregator leaves it, read by the page."""
    from shared.events import LlmUsage, Verdict
    from shared.records import RequestRecord

    rid = "llm-" + secrets.token_hex(4)
    usage = LlmUsage(requests=7, prompt_tokens=1234, completion_tokens=567, refused=2, budget_requests=9)
    verdict = Verdict(request_id=rid, status="completed", execution="ok", return_checking="", code="",
                      final_decision=True, sandbox="docker:ftbus-sandbox:latest", llm_usage=usage)
    record = RequestRecord(request_id=rid, status="completed", task=TASK, verdict=verdict, verdict_published=True,
                           report_published=True, final_decision=True)
    bus = env.pipeline.bus
    assert bus is not None
    await (await bus.kv(bus.subjects.kv_requests)).put(rid, record.stored_json())
    await page.goto(f"{env.url}/requests/{rid}")
    await page.wait_for_selector("#task [data-sandbox]", timeout=WAIT_MS)
    assert await page.get_attribute("#task [data-sandbox]", "data-sandbox") == "docker:ftbus-sandbox:latest"
    assert await _text(page, "#task [data-sandbox]") == "sandbox docker:ftbus-sandbox:latest"
    said = " ".join((await _text(page, "[data-llm-usage]")).split())
    assert "LLM calls by process_data.py: 7" in said and "1234 prompt + 567 completion tokens" in said
    assert "2 refused (budget spent)" in said and "budget 9 calls" in said


async def test_leaderboard_ranks_candidates_by_validation_and_exports(env: Env, page: Any) -> None:
    # Three candidates that score differently on validation (the stand-in answers every k-th item),
    # on a board of their own.
    task = TASK.model_copy(update={"benchmark": LEADERBOARD_BENCHMARK})
    weak, best, middle = await asyncio.gather(
        env.submit("weak", task, standin_accuracy_every=3),
        env.submit("best", task, standin_accuracy_every=1),
        env.submit("middle", task, standin_accuracy_every=2),
    )
    verdicts = {rid: await env.verdict(rid) for rid in (weak, best, middle)}
    scores = {rid: v.result.benchmark.primary_value for rid, v in verdicts.items()}
    assert scores[best] > scores[middle] > scores[weak]
    reports = {rid: await env.report(rid) for rid in (weak, best, middle)}

    await page.goto(env.url + "/leaderboard")
    board = f"section.board[data-base-model='tiny-standin'][data-benchmark='{LEADERBOARD_BENCHMARK}']"
    await page.wait_for_function(
        f"[{json.dumps(weak)}, {json.dumps(best)}, {json.dumps(middle)}].every("
        f"id => document.querySelector(`{board} tr[data-request-id='${{id}}']`))", timeout=WAIT_MS)
    assert "(scorer exact, protocol validation)" in await _text(page, f"{board} h2 small.scorer")
    order = await _rows(page, f"{board} tbody tr")
    assert order == [best, middle, weak]  # the board's own three
    values = [float(v) for v in await page.eval_on_selector_all(f"{board} td.val", "ts => ts.map(t => t.textContent)")]
    assert values == sorted(values, reverse=True)
    ranks = await page.eval_on_selector_all(f"{board} tbody tr", "rs => rs.map(r => +r.dataset.rank)")
    assert ranks == list(range(1, len(order) + 1))
    best_cells = await page.eval_on_selector_all(f"{board} tr[data-request-id='{best}'] td",
                                                 "tds => tds.map(t => t.textContent)")
    b = verdicts[best].result.baseline
    assert best_cells[2] == f"{b.candidate_value:.4f}"
    assert best_cells[5:8] == [f"{b.baseline_value:.4f}", f"{b.difference:+.4f}",
                               f"{reports[best].benchmark_test.primary_value:.4f}"]
    # Intervals: the leader's own (Wilson's on the estimand's effective items: never a point, though it
    # answers every item right); the others' paired difference from the leader on the same items.
    # Answering half or a third of the items is beyond noise: behind, not tied.
    from shared.power import effective_items
    from shared.statistics import score_interval

    leader_bench = verdicts[best].result.benchmark
    assert leader_bench.overall is not None
    low, high = score_interval(leader_bench.overall.mean,
                               effective_items([s.items for s in leader_bench.run_stats.values()]))
    assert best_cells[3] == f"[{low:.4f}, {high:.4f}]" and low < high
    assert best_cells[4] == "leader"
    standing = await page.eval_on_selector_all(f"{board} tbody tr", "rs => rs.map(r => r.dataset.standing)")
    assert dict(zip(order, standing, strict=True))[best] == "leader"
    from shared.paired import compare_scores

    # Each comparison with the leader is made at the level Holm's correction tested it at (the board's
    # comparisons with the leader are one family), and that is the interval the row shows.
    board_rows = {r["request_id"]: r for b in json.loads(
        await (await page.request.get(env.url + "/api/leaderboard")).text())["boards"] for r in b["rows"]}
    family = board_rows[middle]["vs_leader"]["comparisons"]
    assert family == len(order) * (len(order) - 1) // 2  # Holm over every pair of rows
    for rid in (middle, weak):
        row = f"{board} tr[data-request-id='{rid}']"
        assert await page.get_attribute(row, "data-tie-basis") == "paired"
        level = board_rows[rid]["vs_leader"]["level"]
        assert 0.95 <= level <= 1 - 0.05 / family + 1e-12
        paired, _ = compare_scores(verdicts[rid].result.benchmark, verdicts[best].result.benchmark, level=level)
        assert paired is not None and paired.difference < 0
        # 16 items, three pairs in Holm's family: the betting test may leave half right tied with all right;
        # the standing is what the comparison at its tested level says, and the interval the row shows.
        standing = "behind" if paired.ci_high < 0 else "tied"
        assert await page.get_attribute(row, "data-standing") == standing
        shown = " ".join((await _text(page, f"{row} td.vs-leader")).split()).removeprefix("tied ")
        assert shown.startswith(f"{paired.difference:+.4f} [{paired.ci_low:+.4f}, {paired.ci_high:+.4f}]"), shown
        assert shown.endswith(f"{paired.items} items")
        assert (await _text(page, f"{row} td.rank") != "=1") == (standing == "behind")
    await page.screenshot(path=str(env.shots / "leaderboard.png"), full_page=True)

    # Exports: the same ranking.
    rows = list(csv.DictReader(io.StringIO(await (await page.request.get(env.url + "/leaderboard.csv")).text())))
    rows = [r for r in rows if r["benchmark"] == LEADERBOARD_BENCHMARK]
    assert [r["request_id"] for r in rows] == order
    assert float(rows[0]["test"]) == pytest.approx(reports[best].benchmark_test.primary_value)
    exported = json.loads(await (await page.request.get(env.url + "/leaderboard.json")).text())
    (exported_board,) = [b for b in exported["boards"] if b["benchmark"] == LEADERBOARD_BENCHMARK]
    assert [r["request_id"] for r in exported_board["rows"]] == order
    link = await page.get_attribute(f"{board} tr[data-request-id='{best}'] a", "href")
    assert link == f"/requests/{best}"
    assert rows[0]["standing"] == "leader"
    assert {r["request_id"]: r["standing"] for r in rows if r["request_id"] in (middle, weak)} == {
        rid: board_rows[rid]["standing"] for rid in (middle, weak)}  # the CSV says what the page says
    assert exported_board["rows"][0]["interval"] is not None


async def test_the_leaderboard_marks_a_candidate_inside_the_leaders_noise_as_tied(env: Env, page: Any) -> None:
    """Three finished requests as the aggregator leaves them (per-item outcomes in their verdicts): one
    answers a single item fewer than the leader (noise: tied, rank =1), one twenty fewer (behind)."""
    from shared.events import BenchmarkScores, RunStats, Verdict, VerdictResult
    from shared.records import RequestRecord
    from shared.statistics import mean_stderr

    bench = "noise-" + secrets.token_hex(3)
    task = TaskSpec(base_model="tiny-standin", benchmark=bench)
    kv = await env.pipeline.bus.kv(env.pipeline.bus.subjects.kv_requests)  # type: ignore[union-attr]
    ids = {}
    for minute, (name, right) in enumerate((("lead", 30), ("close", 29), ("far", 10))):
        rid = f"{name}-{secrets.token_hex(3)}"
        ids[name] = rid
        outcomes = [1.0] * right + [0.0] * (40 - right)
        mean, stderr = mean_stderr(outcomes)
        scores = BenchmarkScores(accuracy_summary={"a": {"exact_match": mean}}, primary_metric="exact_match",
                                 primary_value=mean, item_scores={"a": {str(i): [v] for i, v in enumerate(outcomes)}},
                                 overall=RunStats(items=40, num_runs=1, mean=mean, stderr=stderr))
        verdict = Verdict(request_id=rid, status="completed", execution="ok", return_checking="", code="",
                          final_decision=True, result=VerdictResult(benchmark=scores))
        record = RequestRecord(request_id=rid, status="completed", task=task, verdict=verdict, verdict_published=True,
                               report_published=True, final_decision=True,
                               submitted_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC))
        await kv.put(rid, record.stored_json())
    await page.goto(env.url + "/leaderboard")
    board = f"section.board[data-benchmark='{bench}']"
    await page.wait_for_selector(f"{board} tr[data-request-id='{ids['far']}']", timeout=WAIT_MS)
    assert await _rows(page, f"{board} tbody tr") == [ids["lead"], ids["close"], ids["far"]]
    standing = await page.eval_on_selector_all(f"{board} tbody tr", "rs => rs.map(r => r.dataset.standing)")
    assert standing == ["leader", "tied", "behind"]
    ranks = await page.eval_on_selector_all(f"{board} td.rank", "ts => ts.map(t => t.textContent)")
    assert ranks == ["1", "=1", "3"]
    close = " ".join((await _text(page, f"{board} tr[data-request-id='{ids['close']}'] td.vs-leader")).split())
    assert close.startswith("tied -0.0250 [-") and close.endswith("p = 1.000, 40 items"), close
    far = " ".join((await _text(page, f"{board} tr[data-request-id='{ids['far']}'] td.vs-leader")).split())
    assert far.startswith("-0.5000 [-0.") and "p < 0.001" in far, far
    await page.screenshot(path=str(env.shots / "leaderboard-ties.png"), full_page=True)


async def test_campaigns_show_the_incumbent_its_history_and_each_requests_comparison(env: Env, page: Any) -> None:
    """Three candidates of one campaign, one after the other: the first (every item right) is accepted
    against the base model, a copy of it is refused as not distinguishable from it, a weaker one as worse."""
    name = "dash-" + secrets.token_hex(3)
    # A benchmark of its own (a copy of tiny-arith), so a board of its own: its candidates that answer
    # every item right would otherwise lead tiny-arith's, which the leaderboard test's best candidate
    # must lead, whichever test of the module runs first.
    task = TASK.model_copy(update={"campaign": name, "benchmark": CAMPAIGN_BENCHMARK})
    assert env.pipeline.client is not None
    rids = []
    for label, every in (("first", 1), ("copy", 1), ("weaker", 3)):
        ws = write_workspace(env.tmp / f"ws-{label}-{secrets.token_hex(3)}", train={"standin_accuracy_every": every})
        rid = await env.pipeline.client.submit(ws, task)
        assert (await env.verdict(rid)).status == "completed"
        rids.append(rid)
    first, copy, weaker = rids

    await page.goto(env.url + "/campaigns")
    row = f"#campaigns tr[data-campaign='{name}']"
    await page.wait_for_selector(row, timeout=WAIT_MS)
    assert await _text(page, f"{row} td.incumbent") == first
    await page.click(f"{row} a")
    await page.wait_for_selector(f"#history tr[data-request-id='{weaker}']", timeout=WAIT_MS)
    assert await _text(page, "#incumbent") == first
    assert await _rows(page, "#history tbody tr") == rids
    accepted = await page.eval_on_selector_all("#history tbody tr", "rs => rs.map(r => r.dataset.accepted)")
    assert accepted == ["true", "false", "false"]
    reasons = [" ".join(t.split()) for t in await page.eval_on_selector_all(
        "#history td.reason", "ts => ts.map(t => t.textContent)")]
    assert reasons[0].startswith("better than the base model (no incumbent yet) by +")
    assert reasons[1].startswith(f"not distinguishable from the incumbent {first}")
    assert reasons[2].startswith((f"worse than the incumbent {first} by -",
                                  f"not distinguishable from the incumbent {first} (difference -")), reasons[2]
    await page.screenshot(path=str(env.shots / "campaign.png"), full_page=True)
    # The request page: its comparison with the incumbent, linking to the campaign.
    await page.goto(env.url + f"/requests/{copy}")
    await page.wait_for_selector("#campaign-section:not([hidden]) #campaign-summary", timeout=WAIT_MS)
    assert (await _text(page, "#campaign-summary")).startswith(f"not distinguishable from the incumbent {first}")
    assert await page.get_attribute("#campaign-check a", "href") == f"/campaigns/{name}"
    missing = await page.request.get(env.url + "/api/campaigns/no-such-campaign")
    assert missing.status == 404


async def test_a_request_that_failed_in_a_stage_says_failed_not_completed_and_rejected(env: Env, page: Any) -> None:
    """Issue 38: a failure in data processing showed a green "completed" pill beside "rejected"."""
    ws = write_workspace(env.tmp / f"ws-fails-{secrets.token_hex(3)}", script="raise SystemExit('no data today')\n")
    assert env.pipeline.client is not None
    failed = await env.pipeline.client.submit(ws, TASK)
    good = await env.submit("judged")
    verdict = await env.verdict(failed)
    assert verdict.status == "completed" and verdict.failed_stage == "data_processing", verdict.execution
    assert (await env.verdict(good)).failed_stage is None

    await page.goto(env.url + "/")
    row = f"#requests tr[data-request-id='{failed}']"
    await page.wait_for_selector(f"{row} .badge[data-status='failed']", timeout=WAIT_MS)
    badge = f"{row} .badge[data-status='failed']"
    assert await _text(page, badge) == "failed"
    # Read in one evaluation in the page: the table re-renders as the page refreshes, and a badge
    # found by one call and read by the next may be a replaced one, whose computed colour is ''.
    read = await page.wait_for_function(
        "(sel) => { const b = document.querySelector(sel); return b ? getComputedStyle(b).color : null; }",
        arg=badge, timeout=WAIT_MS)
    colour = await read.json_value()
    assert colour == "rgb(185, 28, 28)", colour  # var(--red), as an error
    assert await page.get_attribute(f"{row} [data-decision]", "data-decision") == "none"
    assert "rejected" not in await _text(page, row) and "completed" not in await _text(page, row)
    good_row = f"#requests tr[data-request-id='{good}']"
    await page.wait_for_selector(f"{good_row} .badge[data-status='completed']", timeout=WAIT_MS)

    await page.goto(f"{env.url}/requests/{failed}")
    await page.wait_for_selector("#status[data-status='failed']", timeout=WAIT_MS)
    assert await _text(page, "#status") == "failed"
    assert await page.get_attribute("#decision", "data-decision") == "none"
    assert "failed at data_processing" in await _text(page, "#task")
    await page.screenshot(path=str(env.shots / "request-failed.png"), full_page=True)


async def test_a_new_request_appears_without_a_reload(env: Env, page: Any) -> None:
    await page.goto(env.url + "/")
    await page.wait_for_function("+document.body.dataset.loaded >= 1", timeout=WAIT_MS)
    await page.evaluate("window.__samePage = true")
    # Its training waits until the gate opens: the page sees it running, however slowly it updates.
    gate = env.tmp / f"gate-{secrets.token_hex(3)}"
    rid = await env.submit("new", max_steps=6, standin_gate_file=str(gate))
    row = f"#requests tr[data-request-id='{rid}']"
    await page.wait_for_selector(row, timeout=WAIT_MS)
    await page.wait_for_selector(f"{row}[data-status='running']", timeout=WAIT_MS)
    await page.screenshot(path=str(env.shots / "overview-running.png"), full_page=True)
    gate.touch()
    await env.verdict(rid)
    await page.wait_for_selector(f"{row}[data-status='completed']", timeout=WAIT_MS)
    assert await page.evaluate("window.__samePage") is True
    assert await page.evaluate("performance.getEntriesByType('navigation').length") == 1


async def test_pages_survive_a_nats_restart(env: Env, page: Any) -> None:
    await page.goto(env.url + "/")
    await page.wait_for_function("+document.body.dataset.loaded >= 1", timeout=WAIT_MS)
    await page.evaluate("window.__samePage = true")
    env.server.stop()
    await page.wait_for_selector("#conn[data-state=warn]", timeout=WAIT_MS)  # NATS reconnecting
    env.server.start()
    await page.wait_for_function(
        "(c => c.dataset.state === 'ok' && /reconnected/.test(c.textContent))(document.getElementById('conn'))",
        timeout=WAIT_MS)
    rid = await env.submit("after-restart")
    await page.wait_for_selector(f"#requests tr[data-request-id='{rid}']", timeout=WAIT_MS)
    verdict = await env.verdict(rid)
    assert verdict.status == "completed"
    await page.wait_for_selector(f"#requests tr[data-request-id='{rid}'][data-status='completed']", timeout=WAIT_MS)
    assert await page.evaluate("window.__samePage") is True


def test_ftbus_up_serves_the_dashboard_and_prints_its_url(tmp_path: Path, standin_bin: Path,
                                                          assets_dir: Path) -> None:
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")},
        "FTBUS_HOME": str(home), "FTBUS_ASSETS_DIR": str(assets_dir), "FTBUS_TOOLCHAIN_BIN": str(standin_bin),
        "FTBUS_LOG_FORMAT": "json", "FTBUS_DASHBOARD_PORT": "0",
        "FTBUS_SANDBOX": os.environ.get("FTBUS_SANDBOX", "local"),  # the stand-in tools run on the host
        # The stand-in `lm_eval` is a command: the warm engine imports the real harness.
        "FTBUS_BENCH_ENGINE": os.environ.get("FTBUS_BENCH_ENGINE", "cold"),
    }
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen([*FTBUS, "up"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        match = None
        while match is None and time.monotonic() < deadline:
            assert up.poll() is None, log_path.read_text(errors="replace")[-3000:]
            match = re.search(r"dashboard: (http://\S+)", log_path.read_text(errors="replace"))
            time.sleep(0.2)
        assert match, log_path.read_text(errors="replace")[-3000:]
        url = match.group(1).rstrip("/")
        overview = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url + "/api/overview", timeout=60) as response:  # a hang guard
                overview = json.loads(response.read())
            if overview["stages"] and all(s["workers"] >= 1 for s in overview["stages"]):
                break
            time.sleep(0.5)
        assert [s["stage"] for s in overview["stages"]] == STAGES
        assert all(s["workers"] >= 1 for s in overview["stages"]), overview["stages"]
        assert overview["connection"]["connected"] is True
        with urllib.request.urlopen(url + "/", timeout=60) as response:  # a hang guard
            assert b"/static/overview.js" in response.read()
        # The services of that same process evaluate a request, and its dashboard shows it.
        submit = subprocess.run(
            [*FTBUS, "submit", str(write_workspace(tmp_path / "ws")), "--base-model", "tiny-standin",
             "--benchmark", "tiny-arith", "--wait", "--json"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False,
        )
        # The default policy (`better`): tiny-arith has no confirmation pool, so nothing can be confirmed
        # better on it: refused, exit code 1 (final_decision false), and the dashboard says the same.
        assert submit.returncode == 1, submit.stderr[-3000:]
        shown = json.loads(submit.stdout)
        rid = shown["request_id"]
        assert shown["final_decision"] is False and shown["judge"]["policy"] == "better", shown
        assert shown["result"]["decision"]["answer"] == "indistinguishable", shown["result"]["decision"]
        assert "no confirmation pool" in shown["result"]["decision"]["pool_note"]
        detail: dict[str, Any] = {}
        while time.monotonic() < deadline + 60:
            with contextlib.suppress(urllib.error.HTTPError):
                with urllib.request.urlopen(f"{url}/api/requests/{rid}", timeout=60) as response:  # a hang guard
                    detail = json.loads(response.read())
                if detail.get("status") == "completed" and detail.get("test"):
                    break
            time.sleep(0.5)
        assert detail["status"] == "completed" and detail["loss"]["source"] == "history", detail
        assert (detail["final_decision"], detail["policy"], detail["answer"]) == (False, "better", "indistinguishable")
        assert len(detail["loss"]["train"]) == 5 and detail["test"]["rows"]
    finally:
        up.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            up.wait(timeout=60)
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, log_path.read_text(errors="replace")[-3000:]

