"""`ftbus up`, `ftbus worker`, `ftbus dashboard`: the commands that run services, and run_services."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from ftbus.cli_app import ConfigOpt, UrlOpt, app, cli_settings, err, run_command
from ftbus.cli_common import FlagCommand
from shared.bus import Bus
from shared.events import Stage
from shared.logs import get_logger
from shared.settings import Settings

if TYPE_CHECKING:
    from ftbus.dashboard.app import DashboardServer
    from shared.stagespec import StageSpec


async def run_services(bus: Bus, stages: list[Stage], concurrency: int | None, stop: asyncio.Event,
                       pipeline: Sequence[StageSpec] | None = None) -> None:
    """Run ``stages`` here until ``stop``; ``concurrency`` None: each stage's own (its spec, settings).
    ``pipeline``: ftbus's own (``ftbus.stages.PIPELINE``) unless given."""
    if pipeline is None:
        from ftbus.stages import PIPELINE  # every service: imported by the commands that run them, not by `ftbus ls`

        pipeline = PIPELINE
    tasks = [
        asyncio.create_task(spec.run(bus, stop, concurrency, pipeline), name=spec.stage)
        for spec in pipeline
        if spec.stage in stages
    ]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if task.exception():
            raise task.exception()  # type: ignore[misc]


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


# ---------------------------------------------------------------------- up / worker


@app.command(cls=FlagCommand)
def up(
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
    concurrency: Annotated[int | None, typer.Option(
        help="Messages each stage handles at once, overriding every stage's own default "
        "(light stages many, train and bench one; setting stage_concurrency).")] = None,
) -> None:
    """Start everything on this machine: an embedded nats-server (unless --nats-url) and all five services.

    It prints the NATS, dashboard and metrics URLs and records the NATS URL in ~/.ftbus/nats.url, where the
    other commands find it; Ctrl-C stops everything.

    Example: ftbus up &"""
    settings = cli_settings(config, nats_url, service=True)
    log = get_logger("ftbus.up")

    async def main() -> int:
        from ftbus.embedded import EmbeddedServer

        server = None
        url = settings.nats_url
        if not url:
            settings.home.mkdir(parents=True, exist_ok=True)
            server = EmbeddedServer(
                settings.home / "nats", url_file=settings.url_file, log_file=settings.home / "nats-server.log"
            )
            url = server.start()
        from ftbus.undertaker import start_undertaker

        start_undertaker(server.pid if server else None)  # nothing of ours outlives us, even a kill -9
        err.print(f"ftbus is up: NATS at [bold]{url}[/] (home {settings.home}). Ctrl-C stops it.")
        _print_sandbox(settings)
        _serve_metrics(settings)
        log.info("ftbus up", nats_url=url, embedded=server is not None)
        stop = asyncio.Event()
        stop_on_signals(stop)
        try:
            bus = await Bus.connect(settings, name="ftbus-up", url=url)
            try:
                await bus.ensure_topology()
                dashboard = await _up_dashboard(settings, url)
                try:
                    await run_services(bus, list(Stage), concurrency, stop)
                finally:
                    if dashboard is not None:
                        await dashboard.stop()
            finally:
                await bus.close()
        finally:
            if server:
                server.stop()
        return 0

    run_command(main(), settings)


def _serve_metrics(settings: Settings) -> None:
    """This process's Prometheus metrics (every stage it runs), served until it exits; the URL printed."""
    from shared.metrics import serve

    if (served := serve(settings)) is not None:
        err.print(f"metrics: {served.url}", highlight=False, soft_wrap=True)


def _print_sandbox(settings: Settings) -> None:
    """Where candidate code runs; with no isolation, loudly (docs/sandbox.md)."""
    from runners.choice import describe_sandbox
    from runners.sandbox import LOCAL_WARNING

    if settings.sandbox == "local":
        err.print(f"[bold red]WARNING: {LOCAL_WARNING}[/]")
    else:
        err.print(f"candidate code runs in the sandbox: {describe_sandbox(settings)}")


@app.command(cls=FlagCommand)
def worker(
    stage: Annotated[Stage, typer.Argument(help="Which stage this worker runs.")],
    concurrency: Annotated[int | None, typer.Option(
        help="Messages handled at once by this worker. Default: the stage's own (light stages many, "
        "train and bench one; setting stage_concurrency).")] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Run one stage's worker against a running server (scale a stage by starting more of these).

    It prints the URL of its Prometheus metrics (settings metrics_port, metrics_host).

    Example: ftbus worker train --concurrency 2 --nats-url nats://gpu-host:4222"""
    settings = cli_settings(config, nats_url, service=True)

    async def main() -> int:
        stop = asyncio.Event()
        stop_on_signals(stop)
        from ftbus.stages import BY_STAGE

        if BY_STAGE[stage].sandboxed:  # it runs candidate code: say where
            _print_sandbox(settings)
        _serve_metrics(settings)
        from ftbus.undertaker import start_undertaker

        start_undertaker()  # kills our candidates' processes if this worker is killed
        bus = await Bus.connect(settings, name=f"ftbus-{stage}")
        try:
            from shared.retry import retry_transient

            await retry_transient(bus.ensure_topology, "the topology")  # a cluster may be electing leaders
            await run_services(bus, [stage], concurrency, stop)
        finally:
            await bus.close()
        return 0

    run_command(main(), settings)


# ---------------------------------------------------------------------- submit and friends


@app.command(cls=FlagCommand)
def dashboard(
    host: Annotated[str | None, typer.Option(help="Address to serve on (default: dashboard_host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: dashboard_port; 0 = any free port).")] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Serve the read-only web dashboard: stage queues, requests, loss curves, scores, leaderboard.

    Example: ftbus dashboard --port 8470 --nats-url nats://host:4222"""
    settings = cli_settings(config, nats_url, service=True)

    async def main() -> int:
        from ftbus.dashboard.app import DashboardServer

        stop = asyncio.Event()
        stop_on_signals(stop)
        server = DashboardServer(settings, host=host, port=port)
        url = await server.start()
        err.print(f"dashboard: {url}", highlight=False, soft_wrap=True)
        if settings.metrics_enabled:
            err.print(f"metrics: {url}metrics", highlight=False, soft_wrap=True)
        err.print("Ctrl-C stops it.")
        try:
            serving = asyncio.create_task(server.wait())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        finally:
            await server.stop()
        return 0

    run_command(main(), settings)


async def _up_dashboard(settings: Settings, nats_url: str) -> DashboardServer | None:
    """`ftbus up`'s dashboard, if enabled; a dashboard that cannot start never stops the services."""
    if not settings.dashboard_in_up:
        return None
    try:
        from ftbus.dashboard.app import DashboardServer

        server = DashboardServer(settings, nats_url)
        url = await server.start(fallback_port=True)
    except Exception as exc:
        err.print(f"[yellow]warning:[/] dashboard not started: {type(exc).__name__}: {exc}")
        return None
    err.print(f"dashboard: {url}", highlight=False, soft_wrap=True)
    return server
