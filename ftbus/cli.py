"""The ``ftbus`` command line.

Exit codes of ``submit --wait`` (and ``get``): 0 = final_decision true, 1 = false,
2 = usage or infrastructure error (including an error verdict).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shared import loop as event_loop
from shared.bus import Bus, NotConnected, PermissionDenied
from shared.events import MAX_RUNS, Progress, Report, Stage, TaskSpec, Timeouts, Verdict
from shared.logs import get_logger, setup_logging
from shared.settings import Settings, load_settings

app = typer.Typer(
    name="ftbus",
    help="Evaluate LLM fine-tuning candidates over NATS JetStream: data -> train -> benchmark -> judge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
from ftbus.benchmarks_cli import benchmarks_app  # noqa: E402
from ftbus.score import score as score_command  # noqa: E402

assets_app = typer.Typer(help="Offline assets: base models, raw datasets, benchmarks.", no_args_is_help=True)
app.add_typer(assets_app, name="assets")
app.add_typer(benchmarks_app, name="benchmarks")
app.command("score")(score_command)

err = Console(stderr=True)
out = Console()

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML settings file (same keys as FTBUS_* variables).")
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--nats-url", envvar="FTBUS_NATS_URL", help="NATS server; default: the one `ftbus up` started."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout, for scripts.")]


def _settings(config: Path | None, url: str | None = None) -> Settings:
    try:
        settings = load_settings(str(config) if config else None)
    except Exception as exc:
        err.print(f"[red]error:[/] invalid settings: {exc}")
        raise typer.Exit(2) from None
    if url:
        settings = settings.model_copy(update={"nats_url": url})
    setup_logging(settings.log_format, settings.log_level)
    return settings


def _run(coro: Coroutine[Any, Any, int], settings: Settings) -> None:
    """Run a command on the configured event loop; anything unexpected is an infrastructure error:
    exit 2, never 1 (1 means final_decision false)."""
    try:
        code = event_loop.run(coro, settings.event_loop)
    except NotConnected as exc:
        err.print(f"[red]error:[/] {exc}")
        code = 2
    except PermissionDenied as exc:
        # The server's own refusal, e.g. an `agent` user asking for `get --report`.
        from rich.markup import escape

        err.print(
            f"[red]error:[/] permission denied for {escape(exc.subject)} "
            f"(the NATS server refused this user's {exc.operation}; see deploy/nats/accounts.conf)"
        )
        code = 2
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        hint = " (is the server up, and may this user do that?)" if "timeout" in type(exc).__name__.lower() else ""
        err.print(f"[red]error:[/] {type(exc).__name__}: {exc}{hint}")
        code = 2
    raise typer.Exit(code)


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


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


# ---------------------------------------------------------------------- up / worker


@app.command()
def up(
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
    concurrency: Annotated[int | None, typer.Option(
        help="Messages each stage handles at once, overriding every stage's own default "
        "(light stages many, train and bench one; setting stage_concurrency).")] = None,
) -> None:
    """Start everything on this machine: an embedded nats-server (unless --nats-url) and all five services."""
    settings = _settings(config, nats_url)
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
        log.info("ftbus up", nats_url=url, embedded=server is not None)
        stop = asyncio.Event()
        _stop_on_signals(stop)
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

    _run(main(), settings)


def _print_sandbox(settings: Settings) -> None:
    """Where candidate code runs; with no isolation, loudly (docs/sandbox.md)."""
    from runners.choice import describe_sandbox
    from runners.sandbox import LOCAL_WARNING

    if settings.sandbox == "local":
        err.print(f"[bold red]WARNING: {LOCAL_WARNING}[/]")
    else:
        err.print(f"candidate code runs in the sandbox: {describe_sandbox(settings)}")


@app.command()
def worker(
    stage: Annotated[Stage, typer.Argument(help="Which stage this worker runs.")],
    concurrency: Annotated[int | None, typer.Option(
        help="Messages handled at once by this worker. Default: the stage's own (light stages many, "
        "train and bench one; setting stage_concurrency).")] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Run one stage's worker against a running server (scale a stage by starting more of these)."""
    settings = _settings(config, nats_url)

    async def main() -> int:
        stop = asyncio.Event()
        _stop_on_signals(stop)
        if stage in (Stage.data, Stage.train, Stage.bench):
            _print_sandbox(settings)
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

    _run(main(), settings)


# ---------------------------------------------------------------------- submit and friends


def _exit_code(verdict: Verdict) -> int:
    if verdict.status == "error":
        return 2
    return 0 if verdict.final_decision else 1


@app.command()
def submit(
    workspaces: Annotated[
        list[Path] | None,
        typer.Argument(help="Folder(s) with process_data.py, train.yaml, dataset_info.json.", show_default=False),
    ] = None,
    base_model: Annotated[
        str | None, typer.Option("--base-model", help="Folder under assets/models, or absolute path.")
    ] = None,
    benchmark: Annotated[str | None, typer.Option("--benchmark", help="Benchmark name from the registry.")] = None,
    description: Annotated[str, typer.Option(help="What the candidate tries to achieve.")] = "",
    dataset: Annotated[
        list[str] | None, typer.Option("--dataset", help="Raw dataset under assets/datasets it reads (repeatable).")
    ] = None,
    tasks_file: Annotated[
        Path | None,
        typer.Option("--tasks", help="JSONL, one task a line: {workspace, base_model, benchmark, description, "
                     "datasets, timeouts, num_runs}; the options above fill what a line leaves out."),
    ] = None,
    wait: Annotated[
        bool | None,
        typer.Option("--wait/--no-wait", help="Show live progress, then the verdict(s). Default: wait for a "
                     "batch (several workspaces or --tasks), not for one workspace.", show_default=False),
    ] = None,
    as_json: JsonOpt = False,
    data_timeout: Annotated[float | None, typer.Option(help="Lower the data-processing timeout (s).")] = None,
    train_timeout: Annotated[float | None, typer.Option(help="Lower the training timeout (s).")] = None,
    bench_timeout: Annotated[float | None, typer.Option(help="Lower the benchmark timeout (s).")] = None,
    num_runs: Annotated[
        int | None,
        typer.Option("--num-runs", min=1, max=MAX_RUNS,
                     help="Samples per benchmark item (repeated runs; meaningful with sampling): each item's "
                     "outcome is kept per run, the scores are their mean. Default: the benchmark's num_runs (1)."),
    ] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Upload workspace(s) and request their evaluation; print the request id(s) (or, waiting, the verdicts).

    Several workspaces, or --tasks FILE.jsonl, make a batch: one progress view for all, then a summary
    (exit 0 when every final_decision is true, 1 when one is false, 2 on any error verdict)."""
    settings = _settings(config, nats_url)
    timeouts = Timeouts(data_processing=data_timeout, training=train_timeout, benchmark=bench_timeout)
    if tasks_file is not None or len(workspaces or []) > 1:
        _submit_batch(settings, workspaces or [], tasks_file, wait is not False, as_json, timeouts,
                      {"base_model": base_model, "benchmark": benchmark, "description": description,
                       "datasets": dataset or [], "num_runs": num_runs})
        return
    if not workspaces or base_model is None or benchmark is None:
        err.print("[red]error:[/] give a WORKSPACE with --base-model and --benchmark, or --tasks FILE.jsonl")
        raise typer.Exit(2)
    workspace = workspaces[0]
    wait = bool(wait)
    task = TaskSpec(
        base_model=base_model, benchmark=benchmark, description=description, involving_datasets=dataset or [],
        num_runs=num_runs,
    )

    async def main() -> int:
        from ftbus.bus_client import FtbusClient
        from shared.artifacts import ArtifactError
        from shared.paths import UnsafePath
        from shared.taskcheck import UnknownAsset

        async with await FtbusClient.connect(settings) as client:
            try:
                rid = await client.submit(workspace, task, timeouts)
            except (FileNotFoundError, UnsafePath, ArtifactError, UnknownAsset) as exc:
                err.print(f"[red]error:[/] {exc}")
                return 2
            if not wait:
                if as_json:
                    print(json.dumps({"request_id": rid}))
                else:
                    out.print(rid)
                return 0
            err.print(f"submitted [bold]{rid}[/]")
            from ftbus.progress_view import ProgressView

            with ProgressView(err) as view:
                verdict = await client.wait(rid, on_progress=view.update)
            _print_verdict(verdict, as_json)
            return _exit_code(verdict)

    _run(main(), settings)


def _submit_batch(settings: Settings, workspaces: list[Path], tasks_file: Path | None, wait: bool, as_json: bool,
                  timeouts: Timeouts, defaults: dict[str, object]) -> None:
    from ftbus.batch import TaskFileError, load_tasks, submit_batch
    from ftbus.client import EvalTask

    if timeouts.model_dump(exclude_none=True):
        defaults = {**defaults, "timeouts": timeouts}
    try:
        tasks = load_tasks(tasks_file, defaults) if tasks_file is not None else []
        if workspaces:
            if defaults["base_model"] is None or defaults["benchmark"] is None:
                raise TaskFileError("workspaces given on the command line need --base-model and --benchmark")
            tasks += [EvalTask.model_validate({"timeouts": timeouts, **defaults, "workspace": ws}) for ws in workspaces]
    except TaskFileError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    _run(submit_batch(settings, tasks, wait=wait, as_json=as_json, out=out, err=err), settings)


@app.command()
def get(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    report: Annotated[bool, typer.Option("--report", help="The full report, with the hidden test split.")] = False,
    output_format: Annotated[str, typer.Option(
        "--format", help="verdict: ftbus's verdict (--json: as JSON); lm-eval: the validation results as an "
        "lm-eval results file (JSON: results, versions, n-shot, config...), for tools that read lm-eval's."
    )] = "verdict",
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Print a request's verdict (or report). Exit 0/1 by final_decision, 2 when there is none yet."""
    if output_format not in ("verdict", "lm-eval") or (output_format == "lm-eval" and report):
        err.print(f"[red]error:[/] --format {output_format}: verdict, or lm-eval (the validation split's results: "
                  "not with --report)")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            verdict = await client.get(request_id, report=report)
            view = await client.status(request_id) if output_format == "lm-eval" else None
        if verdict is None:
            err.print(f"no {'report' if report else 'verdict'} for {request_id} yet (see `ftbus status {request_id}`)")
            return 2
        if output_format == "lm-eval":
            return _print_lm_eval(verdict, view, settings)
        _print_verdict(verdict, as_json)
        return _exit_code(verdict)

    _run(main(), settings)


@app.command()
def pull(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    to: Annotated[Path | None, typer.Option("--to", help="The folder to create (default: ./ID).")] = None,
    what: Annotated[str, typer.Option(
        "--what", help="adapter: the files as trained (a LoRA adapter, or full weights); merged: the adapter "
        "merged into its base model with peft, on this machine.")] = "adapter",
    base_model: Annotated[Path | None, typer.Option(
        "--base-model", help="--what merged: the base model's folder (default: the adapter's own, or assets).")] = None,
    python: Annotated[str | None, typer.Option(
        "--python", help="--what merged: a Python with peft and transformers (default: the toolchain's).")] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Download a request's trained model into a folder that transformers/peft load as it is
    (weights, tokenizer and config, trainer_state.json), every file checked against its sha256."""
    if what not in ("adapter", "merged"):
        err.print(f"[red]error:[/] --what {what}: adapter or merged")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)

    async def main() -> int:
        from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

        from ftbus.bus_client import FtbusClient
        from ftbus.pull import PullError
        from ftbus.pull import pull as pull_model

        bars = Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(), console=err,
                        transient=True, disable=as_json)
        tasks: dict[str, Any] = {}

        def on_progress(name: str, done: int, size: int) -> None:
            if name not in tasks:
                tasks[name] = bars.add_task(name, total=size or 1)
            bars.update(tasks[name], completed=done if size else 1)

        try:
            async with await FtbusClient.connect(settings) as client:
                with bars:
                    pulled = await pull_model(client, request_id, to or Path(request_id), what=what,  # type: ignore[arg-type]
                                              base_model=base_model, python=python, on_progress=on_progress)
        except PullError as exc:
            err.print(f"[red]error:[/] {exc}")
            return 2
        if as_json:
            print(json.dumps({"request_id": pulled.request_id, "path": str(pulled.path), "what": pulled.what,
                              "model_kind": pulled.model_kind, "files": pulled.files, "bytes": pulled.bytes}))
        else:
            err.print(f"{pulled.model_kind} model of {request_id} ({pulled.what}, {len(pulled.files)} files, "
                      f"{pulled.bytes / 2**20:.1f} MiB) in {pulled.path}")
        return 0

    _run(main(), settings)


@app.command()
def compare(
    first: Annotated[str, typer.Argument(help="A request id (the candidate), as printed by submit.")],
    second: Annotated[str, typer.Argument(help="The request id it is compared with.")],
    level: Annotated[float, typer.Option(
        "--level", help="Confidence level of the interval; the p-value must be below 1 - level to call "
        "one better.")] = 0.95,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Is FIRST better than SECOND, or only luckier? The paired comparison of two requests on their
    shared validation items (the verdicts' per-item outcomes; never the hidden test split).

    It prints the difference FIRST - SECOND of the primary metric (each item's mean over its runs),
    its confidence interval from a paired bootstrap over items (seeded: the same on every rerun),
    and the p-value of McNemar's exact test (right/wrong items) or a paired permutation test
    (graded ones): "FIRST is better than SECOND by +0.12 (95% CI +0.05 to +0.19, p = 0.002,
    60 items)", or "not distinguishable". Requests without a verdict or per-item outcomes, on
    different benchmarks, with different --num-runs or different items are refused, saying why.

    Exit 0 when compared (whatever the result), 2 when refused, on bad usage or no server."""
    if not 0.0 < level < 1.0:
        err.print(f"[red]error:[/] --level {level}: a confidence level between 0 and 1 (exclusive), e.g. 0.95")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)

    async def main() -> int:
        from rich.markup import escape

        from ftbus.bus_client import FtbusClient
        from ftbus.compare import NotComparable, compare_requests

        async with await FtbusClient.connect(settings) as client:
            try:
                result = await compare_requests(client, first, second, level=level)
            except NotComparable as exc:
                err.print(f"[red]error:[/] cannot compare: {escape(str(exc))}")
                return 2
        if as_json:
            print(result.model_dump_json())
            return 0
        from ftbus.compare import describe_details

        out.print(escape(result.summary), highlight=False, soft_wrap=True)
        out.print(escape(describe_details(result)), highlight=False, soft_wrap=True, style="dim")
        return 0

    _run(main(), settings)


@app.command()
def status(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Where a request is: status, current stage, per-stage timings, last progress."""
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            record = await client.status(request_id)
        if record is None:
            # The aggregator writes a request's arrival with its next event, or after a second.
            err.print(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
                      "record_max_age_s after it ended)")
            return 2
        if as_json:
            print(record.model_dump_json())
            return 0
        table = Table(title=f"{request_id}: {record.status}" + (f" ({record.stage})" if record.stage else ""))
        for col in ("stage", "attempts", "started", "finished", "seconds", "ok"):
            table.add_column(col)
        for name, t in record.stages.items():
            table.add_row(
                name,
                str(t.attempts),
                t.started_at.strftime("%H:%M:%S") if t.started_at else "",
                t.finished_at.strftime("%H:%M:%S") if t.finished_at else "",
                f"{t.duration_s:.1f}" if t.duration_s is not None else "",
                "" if t.ok is None else ("yes" if t.ok else "no"),
            )
        out.print(table)
        if record.progress and not record.terminal:
            p = record.progress
            out.print(f"last progress: {p.stage} {p.message} step {p.step}/{p.total} loss {p.loss}")
        if record.final_decision is not None:
            out.print(f"final_decision: {record.final_decision}")
        return 0

    _run(main(), settings)


@app.command()
def cancel(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    reason: Annotated[str, typer.Option(help="Recorded in the verdict.")] = "cancelled by user",
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Cancel a request: its running process tree is killed and its verdict says cancelled."""
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            await client.cancel(request_id, reason)
        err.print(f"cancel requested for {request_id}")
        return 0

    _run(main(), settings)


@app.command()
def watch(
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Follow every request: progress events and verdicts as they happen (Ctrl-C stops).

    A stage shows once it has run for a second or reports progress (training steps, the benchmark's
    splits); one over sooner (a pre-check's refusal, a judgement by the rules) shows only in the
    verdict, and with its timings in `ftbus status ID`.
    """
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            async for item in client.watch():
                if as_json:
                    print(json.dumps({"type": type(item).__name__, **item.model_dump(mode="json")}), flush=True)
                elif isinstance(item, Progress):
                    step = f" step {item.step}/{item.total}" if item.step is not None else ""
                    loss = f" loss {item.loss:.4f}" if item.loss is not None else ""
                    out.print(f"{item.request_id}  {item.stage:<9} {item.state:<8}{step}{loss} {item.message}")
                else:
                    out.print(f"{item.request_id}  [bold]verdict[/] {item.status} final_decision={item.final_decision}")
        return 0

    _run(main(), settings)


# ---------------------------------------------------------------------- dashboard

if TYPE_CHECKING:
    from ftbus.dashboard.app import DashboardServer
    from shared.stagespec import StageSpec


@app.command()
def dashboard(
    host: Annotated[str | None, typer.Option(help="Address to serve on (default: dashboard_host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: dashboard_port; 0 = any free port).")] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Serve the read-only web dashboard: stage queues, requests, loss curves, scores, leaderboard."""
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.dashboard.app import DashboardServer

        stop = asyncio.Event()
        _stop_on_signals(stop)
        server = DashboardServer(settings, host=host, port=port)
        url = await server.start()
        err.print(f"dashboard: {url}", highlight=False, soft_wrap=True)
        err.print("Ctrl-C stops it.")
        try:
            serving = asyncio.create_task(server.wait())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        finally:
            await server.stop()
        return 0

    _run(main(), settings)


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


@app.command("ls")
def ls_requests(
    status_filter: Annotated[
        list[str] | None,
        typer.Option("--status", help="Only requests in this status: queued, running, completed, error, "
                     "cancelled (repeatable)."),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the newest N.")] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """List requests, oldest first: status, current stage, age, decision."""
    from shared.records import RequestStatusView

    allowed = set(RequestStatusView.model_fields["status"].annotation.__args__)  # type: ignore[union-attr]
    bad = sorted(set(status_filter or []) - allowed)
    if bad:
        err.print(f"[red]error:[/] unknown status {', '.join(bad)}: one of {', '.join(sorted(allowed))}")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)
    from ftbus.batch import ls_main

    _run(ls_main(settings, status_filter or [], limit, as_json, out), settings)


@app.command()
def logs(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    stage: Annotated[
        str | None, typer.Option("--stage", help="data, train, bench or baseline; default: data, train and bench.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Wait for stages still running (their progress goes to stderr).")
    ] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Print a request's stage logs (each is uploaded when its stage ends)."""
    from ftbus.client import LOG_FILES

    if stage is not None and stage not in LOG_FILES:
        err.print(f"[red]error:[/] unknown stage {stage}: one of {', '.join(LOG_FILES)}")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)
    from ftbus.batch import logs_main

    _run(logs_main(settings, request_id, stage, follow, out, err), settings)


# ---------------------------------------------------------------------- assets


@assets_app.command("init")
def assets_init(config: ConfigOpt = None) -> None:
    """Build, offline, a tiny base model, a raw dataset and a benchmark under the assets directory."""
    settings = _settings(config)
    from ftbus.assets import AssetsError, build_assets

    toolchain = settings.toolchain_path()
    try:
        build_assets(settings.assets, (toolchain / "python") if toolchain else Path("python"))
    except AssetsError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    err.print(f"assets ready in {settings.assets}")


# ---------------------------------------------------------------------- output


def _print_lm_eval(verdict: Verdict, view: Any, settings: Settings) -> int:
    from evaluation.registry import load_benchmark
    from ftbus.lmeval_format import NoResults, lm_eval_results

    version = None
    if view is not None and view.task is not None:
        with contextlib.suppress(Exception):  # assets not on this machine: the file says null
            version = load_benchmark(settings.assets, view.task.benchmark).version
    try:
        print(json.dumps(lm_eval_results(verdict, view, version), indent=2))
    except NoResults as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    return 0


def _print_verdict(verdict: Verdict | Report, as_json: bool) -> None:
    if as_json:
        print(verdict.model_dump_json())
        return
    from ftbus.verdict_view import render_verdict

    render_verdict(out, verdict)


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(2)



if __name__ == "__main__":
    main()
