"""The ``ftbus`` command line.

Exit codes of ``submit --wait`` (and ``get``): 0 = final_decision true, 1 = false,
2 = usage or infrastructure error (including an error verdict).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from collections.abc import Coroutine, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from ftbus.cli_common import FlagCommand, Output, WorkflowGroup, console, print_columns
from shared import loop as event_loop
from shared.bus import Bus, NotConnected, PermissionDenied
from shared.events import (
    CAMPAIGN_NAME,
    CAMPAIGN_NAME_RULE,
    MAX_RUNS,
    Progress,
    Report,
    Stage,
    TaskSpec,
    Timeouts,
    Verdict,
)
from shared.logs import get_logger, setup_logging
from shared.settings import Settings, load_settings

CONTEXT = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="ftbus",
    help="Evaluate LLM fine-tuning candidates over NATS JetStream: data -> train -> benchmark -> judge.\n\n"
    "Start with `ftbus assets init`, `ftbus up`, then `ftbus submit WORKSPACE --base-model M --benchmark B "
    "--wait` (README.md, docs/cli.md). Exit codes: 0 = done (final_decision true), 1 = final_decision "
    "false, 2 = usage, input or infrastructure error.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=WorkflowGroup,
    context_settings=CONTEXT,
)
from ftbus.benchmarks_cli import benchmarks_app  # noqa: E402
from ftbus.score import score as score_command  # noqa: E402

assets_app = typer.Typer(help="Offline assets: base models, raw datasets, benchmarks.", no_args_is_help=True,
                         cls=WorkflowGroup, context_settings=CONTEXT)
app.add_typer(assets_app, name="assets")
app.add_typer(benchmarks_app, name="benchmarks")
app.command("score", cls=FlagCommand)(score_command)

err = console(stderr=True)
out = console()

#: --log-format, given before the command (`ftbus --log-format json ls`): the client's log lines.
_log_format: list[str] = []


class LogFormat(StrEnum):
    auto = "auto"
    json = "json"
    console = "console"


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"ftbus {version('ftbus')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("ftbus (not installed: run from a source tree)")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
    log_format: Annotated[LogFormat | None, typer.Option(
        "--log-format", help="Log lines on stderr. Default (auto): plain `warning: ...` lines from client "
        "commands; from services (up, worker, dashboard) readable on a terminal, JSON lines otherwise. "
        "Setting log_format.", show_default=False)] = None,
) -> None:
    _log_format[:] = [log_format.value] if log_format else []

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML settings file (same keys as FTBUS_* variables).")
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--nats-url", help="NATS server (a comma-separated list for a cluster). Default: FTBUS_NATS_URL, "
                 "else the one `ftbus up` started on this machine (its URL is in ~/.ftbus/nats.url).",
                 show_default=False),
]
OutputOpt = Annotated[Output, typer.Option(
    "--output", "-o", help="table: a table on a terminal, plain columns in a pipe; plain: plain columns (nothing "
    "cut); wide: plain columns with every field; json: one JSON array.")]

from ftbus.client import LOG_FILES  # noqa: E402

LogStage = StrEnum("LogStage", {name: name for name in LOG_FILES})  # type: ignore[misc]


def _error(message: str) -> None:
    """``error: MESSAGE`` on stderr, the message taken literally (no rich markup in it)."""
    err.print(f"[red]error:[/] {escape(message)}")


def _settings(config: Path | None, url: str | None = None, *, service: bool = False) -> Settings:
    """The settings of a command; ``service``: it runs services (their log lines: JSON off a terminal)."""
    try:
        settings = load_settings(str(config) if config else None)
    except Exception as exc:
        _error(f"invalid settings: {exc}")
        raise typer.Exit(2) from None
    if url:
        from ftbus.bus_client import URL_ORIGIN

        settings = settings.model_copy(update={"nats_url": url})
        URL_ORIGIN.set("from --nats-url")
    fmt = _log_format[0] if _log_format else settings.log_format
    setup_logging(fmt, settings.log_level, client=not service)  # type: ignore[arg-type]
    return settings


def _run(coro: Coroutine[Any, Any, int], settings: Settings) -> None:
    """Run a command on the configured event loop; anything unexpected is an infrastructure error:
    exit 2, never 1 (1 means final_decision false)."""
    try:
        code = event_loop.run(coro, settings.event_loop)
    except NotConnected as exc:
        _error(str(exc))
        code = 2
    except PermissionDenied as exc:
        # The server's own refusal, e.g. an `agent` user asking for `get --report`.
        err.print(
            f"[red]error:[/] permission denied for {escape(exc.subject)} "
            f"(the NATS server refused this user's {exc.operation}; see deploy/nats/accounts.conf)"
        )
        code = 2
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        hint = " (is the server up, and may this user do that?)" if "timeout" in type(exc).__name__.lower() else ""
        _error(f"{type(exc).__name__}: {exc}{hint}")
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


@app.command(cls=FlagCommand)
def up(
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
    concurrency: Annotated[int | None, typer.Option(
        help="Messages each stage handles at once, overriding every stage's own default "
        "(light stages many, train and bench one; setting stage_concurrency).")] = None,
) -> None:
    """Start everything on this machine: an embedded nats-server (unless --nats-url) and all five services.

    It prints the NATS and dashboard URLs and records the NATS URL in ~/.ftbus/nats.url, where the other
    commands find it; Ctrl-C stops everything.

    Example: ftbus up &"""
    settings = _settings(config, nats_url, service=True)
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

    Example: ftbus worker train --concurrency 2 --nats-url nats://gpu-host:4222"""
    settings = _settings(config, nats_url, service=True)

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


@app.command(cls=FlagCommand)
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
                     "datasets, timeouts, num_runs, campaign}; the options above fill what a line leaves out."),
    ] = None,
    wait: Annotated[
        bool | None,
        typer.Option("--wait/--no-wait", help="Show live progress, then the verdict(s). Default: wait for a "
                     "batch (several workspaces or --tasks), not for one workspace.", show_default=False),
    ] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON on stdout: waiting, the verdict as one object (a batch: an array of verdicts); "
        'not waiting, {"request_id": ...} (a batch: an array of {"request_id", "workspace"}).')] = False,
    data_timeout: Annotated[float | None, typer.Option(help="Lower the data-processing timeout (s).")] = None,
    train_timeout: Annotated[float | None, typer.Option(help="Lower the training timeout (s).")] = None,
    bench_timeout: Annotated[float | None, typer.Option(help="Lower the benchmark timeout (s).")] = None,
    num_runs: Annotated[
        int | None,
        typer.Option("--num-runs", min=1, max=MAX_RUNS,
                     help="Samples per benchmark item (repeated runs; meaningful with sampling): each item's "
                     "outcome is kept per run, the scores are their mean. Default: the benchmark's num_runs (1)."),
    ] = None,
    campaign: Annotated[
        str | None,
        typer.Option("--campaign", help="The campaign the candidate belongs to (letters, digits, _ and -): it is "
                     "accepted only if it beats the campaign's incumbent beyond noise, and then becomes the "
                     "incumbent; the first is compared with the base model. `ftbus campaign NAME` shows it."),
    ] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Upload workspace(s) and request their evaluation; print the request id(s) (or, waiting, the verdicts).

    Several workspaces, or --tasks FILE.jsonl, make a batch: one progress view for all, then a summary
    (exit 0 when every final_decision is true, 1 when one is false, 2 on any error verdict).

    Each workspace is checked here first, as `ftbus check` does (the files, train.yaml, dataset_info.json,
    the names of models, benchmarks and datasets where the assets are on this machine): a problem is
    reported at once, exit 2, before anything connects or uploads.

    Example: ftbus submit examples/lora --base-model tiny-llama --benchmark tiny-sentiment --wait"""
    if campaign is not None and not re.fullmatch(CAMPAIGN_NAME, campaign):
        _error(f"--campaign {campaign!r}: {CAMPAIGN_NAME_RULE}")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)
    timeouts = Timeouts(data_processing=data_timeout, training=train_timeout, benchmark=bench_timeout)
    if tasks_file is not None or len(workspaces or []) > 1:
        _submit_batch(settings, workspaces or [], tasks_file, wait is not False, as_json, timeouts,
                      {"base_model": base_model, "benchmark": benchmark, "description": description,
                       "datasets": dataset or [], "num_runs": num_runs, "campaign": campaign})
        return
    if not workspaces or base_model is None or benchmark is None:
        _error("give a WORKSPACE with --base-model and --benchmark, or --tasks FILE.jsonl")
        raise typer.Exit(2)
    workspace = workspaces[0]
    wait = bool(wait)
    task = TaskSpec(
        base_model=base_model, benchmark=benchmark, description=description, involving_datasets=dataset or [],
        num_runs=num_runs, campaign=campaign,
    )
    _refuse_unless_checked([(workspace, task)], settings)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient
        from shared.artifacts import ArtifactError
        from shared.paths import UnsafePath
        from shared.taskcheck import UnknownAsset

        async with await FtbusClient.connect(settings) as client:
            try:
                rid = await client.submit(workspace, task, timeouts)
            except (FileNotFoundError, UnsafePath, ArtifactError, UnknownAsset) as exc:
                _error(str(exc))
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


def _refuse_unless_checked(items: Sequence[tuple[Path, TaskSpec]], settings: Settings) -> None:
    """`ftbus check` of each workspace, before anything connects: exit 2 with every problem found."""
    from ftbus.check import check_workspace

    failed = False
    for workspace, task in items:
        result = check_workspace(workspace, settings.assets, task, max_train_yaml_bytes=settings.max_train_yaml_bytes)
        for problem in result.problems:
            _error(problem if len(items) == 1 else f"{workspace}: {problem}")
        failed = failed or not result.ok
    if failed:
        err.print("nothing was submitted: fix the above (`ftbus check WORKSPACE` checks again without a server)")
        raise typer.Exit(2)


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
        _error(str(exc))
        raise typer.Exit(2) from None
    _refuse_unless_checked([(t.workspace, t.task_spec()) for t in tasks], settings)
    _run(submit_batch(settings, tasks, wait=wait, as_json=as_json, out=out, err=err), settings)


@app.command(cls=FlagCommand)
def check(
    workspaces: Annotated[list[Path], typer.Argument(
        help="Folder(s) with process_data.py, train.yaml, dataset_info.json.", show_default=False)],
    base_model: Annotated[str | None, typer.Option(
        "--base-model", help="Also check that this base model is under the assets' models/.")] = None,
    benchmark: Annotated[str | None, typer.Option(
        "--benchmark", help="Also check that this benchmark is under the assets' benchmarks/.")] = None,
    dataset: Annotated[list[str] | None, typer.Option(
        "--dataset", help="Also check that this raw dataset is under the assets' datasets/ (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print one JSON array on stdout: {"workspace", "ok", "problems", "notes"} per workspace.')]
    = False,
    config: ConfigOpt = None,
) -> None:
    """Check workspace(s) as `submit` does before it connects, with no server.

    It checks the folder, its three files, train.yaml's syntax and keys (as LlamaFactory reads it),
    dataset_info.json and the datasets train.yaml names, and, where the assets are on this machine,
    the names of models, benchmarks and datasets.

    Exit 0 when every workspace passes, 2 when one has a problem (each printed, with what to change).
    What runs only on a worker (process_data.py itself, the data it writes, training) is not checked.

    Example: ftbus check examples/lora --base-model tiny-llama --benchmark tiny-sentiment"""
    import json as json_module

    from ftbus.check import check_names, check_workspace

    settings = _settings(config)
    results = [check_names(check_workspace(ws, settings.assets, max_train_yaml_bytes=settings.max_train_yaml_bytes),
                           settings.assets, base_model, benchmark, dataset or []) for ws in workspaces]
    if as_json:
        print(json_module.dumps([{"workspace": str(r.workspace), "ok": r.ok, "problems": r.problems,
                                  "notes": r.notes} for r in results]))
    else:
        for result in results:
            if result.ok:
                out.print(f"ok: {escape(str(result.workspace))}")
            for problem in result.problems:
                _error(f"{result.workspace}: {problem}")
            for note in result.notes:
                err.print(f"note: {escape(note)}")
    raise typer.Exit(0 if all(r.ok for r in results) else 2)


class VerdictFormat(StrEnum):
    verdict = "verdict"
    lm_eval = "lm-eval"


class PullWhat(StrEnum):
    adapter = "adapter"
    merged = "merged"


async def _known(client: Any, request_id: str) -> bool:
    """Whether ``request_id`` was submitted (and not yet forgotten), or has a verdict; says "unknown
    request" if not."""
    if await client.status(request_id) is not None or await client.get(request_id) is not None:
        return True
    _error(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
           "record_max_age_s after it ended); `ftbus ls` lists the requests")
    return False


@app.command(cls=FlagCommand)
def get(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    report: Annotated[bool, typer.Option("--report", help="The full report, with the hidden test split.")] = False,
    output_format: Annotated[VerdictFormat, typer.Option(
        "--format", help="verdict: ftbus's verdict (--json: as JSON); lm-eval: the validation results as an "
        "lm-eval results file (JSON: results, versions, n-shot, config...), for tools that read lm-eval's."
    )] = VerdictFormat.verdict,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the verdict (with --report: the report) as one JSON object on stdout.")] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Print a request's verdict (or report). Exit 0/1 by final_decision, 2 when there is none yet
    or the id is unknown.

    Example: ftbus get 20260101-120000-1a2b3c4d --json"""
    if output_format == VerdictFormat.lm_eval and report:
        _error("--format lm-eval is the validation split's results: not with --report")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            verdict = await client.get(request_id, report=report)
            view = await client.status(request_id) if output_format == VerdictFormat.lm_eval or verdict is None \
                else None
        if verdict is None:
            if view is None:
                _error(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
                       "record_max_age_s after it ended); `ftbus ls` lists the requests")
                return 2
            err.print(f"no {'report' if report else 'verdict'} for {escape(request_id)} yet (it is {view.status}; "
                      f"see `ftbus status {escape(request_id)}`)")
            return 2
        if output_format == VerdictFormat.lm_eval:
            return _print_lm_eval(verdict, view, settings)
        _print_verdict(verdict, as_json)
        return _exit_code(verdict)

    _run(main(), settings)


@app.command(cls=FlagCommand)
def pull(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    to: Annotated[Path | None, typer.Option("--to", help="The folder to create (default: ./ID).")] = None,
    what: Annotated[PullWhat, typer.Option(
        "--what", help="adapter: the files as trained (a LoRA adapter, or full weights); merged: the adapter "
        "merged into its base model with peft, on this machine.")] = PullWhat.adapter,
    base_model: Annotated[Path | None, typer.Option(
        "--base-model", help="--what merged: the base model's folder (default: the adapter's own, or assets).")] = None,
    python: Annotated[str | None, typer.Option(
        "--python", help="--what merged: a Python with peft and transformers (default: the toolchain's).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print one JSON object on stdout: {"request_id", "path", "what", "model_kind", "files", '
        '"bytes"}.')] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Download a request's trained model into a folder that transformers/peft load as it is
    (weights, tokenizer and config, trainer_state.json), every file checked against its sha256.

    Example: ftbus pull 20260101-120000-1a2b3c4d --to model --what merged"""
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
                if not await _known(client, request_id):
                    return 2
                with bars:
                    pulled = await pull_model(client, request_id, to or Path(request_id), what=what.value,  # type: ignore[arg-type]
                                              base_model=base_model, python=python, on_progress=on_progress)
        except PullError as exc:
            _error(str(exc))
            return 2
        if as_json:
            print(json.dumps({"request_id": pulled.request_id, "path": str(pulled.path), "what": pulled.what,
                              "model_kind": pulled.model_kind, "files": pulled.files, "bytes": pulled.bytes}))
        else:
            err.print(f"{pulled.model_kind} model of {request_id} ({pulled.what}, {len(pulled.files)} files, "
                      f"{pulled.bytes / 2**20:.1f} MiB) in {pulled.path}")
        return 0

    _run(main(), settings)


@app.command(cls=FlagCommand)
def compare(
    first: Annotated[str, typer.Argument(help="A request id (the candidate), as printed by submit.")],
    second: Annotated[str, typer.Argument(help="The request id it is compared with.")],
    level: Annotated[float, typer.Option(
        "--level", help="Confidence level of the interval, at least 0.9; the p-value must be below 1 - level to "
        "call one better.")] = 0.95,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the comparison as one JSON object on stdout (difference, interval, p-value, items...).")]
    = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Is FIRST better than SECOND, or only luckier? The paired comparison of two requests on their
    shared validation items (the verdicts' per-item outcomes; never the hidden test split).

    It prints the difference FIRST - SECOND of the primary metric (each item's mean over its runs),
    with each subset weighing the same (as the headline score does), its confidence interval and the
    p-value of McNemar's exact test (right/wrong items, subsets of one size) or a paired sign-flip
    permutation test, the interval built on the same test so that the two never disagree (seeded: the
    same on every rerun): "FIRST is better than SECOND by +0.12 (95% CI +0.05 to +0.19, p = 0.002,
    60 items)", or "not distinguishable", and what the comparison could have detected at 80% power.
    Fewer than 10 items: "too few items to say". Requests without a verdict or per-item outcomes, on
    different benchmarks, with different --num-runs or different items are refused, saying why.

    Exit 0 when compared (whatever the result), 2 when refused, on bad usage or no server.

    Example: ftbus compare 20260101-120000-1a2b3c4d 20260101-110000-5e6f7a8b --json"""
    from shared.statistics import check_level

    try:
        check_level(level, "--level")
    except ValueError as exc:
        _error(str(exc))
        raise typer.Exit(2) from None
    settings = _settings(config, nats_url)

    async def main() -> int:
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


@app.command(cls=FlagCommand)
def campaign(
    name: Annotated[str, typer.Argument(help="The campaign's name, as given to `submit --campaign`.")],
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print the campaign as one JSON object on stdout: its record ("incumbent", "history" of '
        'judged candidates with their comparisons, "state" of the online procedure, "incumbent_scores") plus '
        '"incumbents" (the accepted ones, in order) and "next_level".')] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """A campaign's incumbent (the accepted candidate that is currently best) and its history: every
    candidate judged in it, what it was compared with (the incumbent of its moment, or the base model
    before the first acceptance), at which level, and the decision. Validation data only. Exit 2 for a
    campaign no candidate of which was judged yet.

    Example: ftbus campaign lora-search --json"""
    if not re.fullmatch(CAMPAIGN_NAME, name):
        _error(f"{name!r}: {CAMPAIGN_NAME_RULE}")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient
        from ftbus.campaign_view import render_campaign

        async with await FtbusClient.connect(settings) as client:
            record = await client.campaign(name)
        if record is None:
            _error(f"no campaign {name}: no candidate submitted with --campaign {name} has been judged yet "
                   "(a campaign is kept record_max_age_s after its last judgement)")
            return 2
        render_campaign(out, record, as_json)
        return 0

    _run(main(), settings)


@app.command(cls=FlagCommand)
def status(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the request's status view as one JSON object on stdout (status, stage, stages with "
        "attempts and timings, the training's resumed_from_step, progress, final_decision).")] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Where a request is: status, current stage, per-stage timings, last progress. Exit 2 for an unknown id.

    Example: ftbus status 20260101-120000-1a2b3c4d"""
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            record = await client.status(request_id)
        if record is None:
            # The aggregator writes a request's arrival with its next event, or after a second.
            _error(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
                   "record_max_age_s after it ended); `ftbus ls` lists the requests")
            return 2
        if as_json:
            print(record.model_dump_json())
            return 0
        title = f"{request_id}: {record.status}" + (f" ({record.stage})" if record.stage else "")
        if record.failed_stage:
            title += f", failed in {record.failed_stage}"
        rows = [
            [name, str(t.attempts), t.started_at.strftime("%H:%M:%S") if t.started_at else "",
             t.finished_at.strftime("%H:%M:%S") if t.finished_at else "",
             f"{t.duration_s:.1f}" if t.duration_s is not None else "",
             "" if t.ok is None else ("yes" if t.ok else "no")]
            for name, t in record.stages.items()
        ]
        if not out.is_terminal:
            print(title)
        print_columns(out, ("stage", "attempts", "started", "finished", "seconds", "ok"), rows, title=title)
        if record.progress and not record.terminal:
            p = record.progress
            print(f"last progress: {p.stage} {p.message} step {p.step}/{p.total} loss {p.loss}")
        if record.final_decision is not None:
            print(f"final_decision: {record.final_decision}")
        return 0

    _run(main(), settings)


@app.command(cls=FlagCommand)
def cancel(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    reason: Annotated[str, typer.Option(help="Recorded in the verdict.")] = "cancelled by user",
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print one JSON object on stdout: {"request_id", "status" (before the cancel), '
        '"cancel_requested" (false when it had already finished)}.')] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Cancel a request: its running process tree is killed and its verdict says cancelled.
    A request that has finished keeps its verdict; exit 2 for an unknown id.

    Example: ftbus cancel 20260101-120000-1a2b3c4d --reason 'wrong base model'"""
    settings = _settings(config, nats_url)

    async def main() -> int:
        from ftbus.bus_client import FtbusClient

        async with await FtbusClient.connect(settings) as client:
            view = await client.status(request_id)
            if view is None:
                await _known(client, request_id)
                return 2
            if not view.terminal:
                await client.cancel(request_id, reason)
        if as_json:
            print(json.dumps({"request_id": request_id, "status": view.status, "cancel_requested": not view.terminal}))
        elif view.terminal:
            err.print(f"{escape(request_id)} has already finished ({view.status}): nothing to cancel")
        else:
            err.print(f"cancel requested for {escape(request_id)} (it was {view.status}); its verdict will say "
                      "cancelled")
        return 0

    _run(main(), settings)


@app.command(cls=FlagCommand)
def watch(
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print JSON lines on stdout: one object per event, {"type": "Progress" or "Verdict", ...}.')]
    = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Follow every request: progress events and verdicts as they happen (Ctrl-C stops).

    A stage shows once it has run for a second or reports progress (training steps, the benchmark's
    splits); one over sooner (a pre-check's refusal, a judgement by the rules) shows only in the
    verdict, and with its timings in `ftbus status ID`.

    Example: ftbus watch --json | jq -c 'select(.type == "Verdict")'"""
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
                    print(f"{item.request_id}  {item.stage:<9} {item.state:<8}{step}{loss} {item.message}", flush=True)
                else:
                    failed = f" failed_stage={item.failed_stage}" if item.failed_stage else ""
                    print(f"{item.request_id}  verdict   {item.status} final_decision={item.final_decision}{failed}",
                          flush=True)
        return 0

    _run(main(), settings)


# ---------------------------------------------------------------------- dashboard

if TYPE_CHECKING:
    from ftbus.dashboard.app import DashboardServer
    from shared.stagespec import StageSpec


@app.command(cls=FlagCommand)
def dashboard(
    host: Annotated[str | None, typer.Option(help="Address to serve on (default: dashboard_host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: dashboard_port; 0 = any free port).")] = None,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Serve the read-only web dashboard: stage queues, requests, loss curves, scores, leaderboard.

    Example: ftbus dashboard --port 8470 --nats-url nats://host:4222"""
    settings = _settings(config, nats_url, service=True)

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


@app.command("ls", cls=FlagCommand)
def ls_requests(
    status_filter: Annotated[
        list[str] | None,
        typer.Option("--status", help="Only requests in this status: queued, running, completed, error, "
                     "cancelled (repeatable)."),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the newest N.")] = None,
    output: OutputOpt = Output.table,
    as_json: Annotated[bool, typer.Option("--json", help="The same as -o json: one JSON array on stdout, an object "
                                          "per request.")] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """List requests, oldest first: status, current stage, age, decision.

    Example: ftbus ls --status running -o plain"""
    from shared.records import RequestStatusView

    allowed = set(RequestStatusView.model_fields["status"].annotation.__args__)  # type: ignore[union-attr]
    bad = sorted(set(status_filter or []) - allowed)
    if bad:
        _error(f"unknown status {', '.join(bad)}: one of {', '.join(sorted(allowed))}")
        raise typer.Exit(2)
    settings = _settings(config, nats_url)
    from ftbus.batch import ls_main

    _run(ls_main(settings, status_filter or [], limit, Output.json if as_json else output, out, err), settings)


@app.command(cls=FlagCommand)
def logs(
    request_id: Annotated[str, typer.Argument(help="The id printed by submit.")],
    stage: Annotated[
        LogStage | None, typer.Option("--stage", help="Only this stage's log. Default: data, train and bench "
                                      "(baseline: the base model's benchmark run).", show_default=False)
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Wait for stages still running (their progress goes to stderr).")
    ] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print one JSON object on stdout: {"request_id", "logs": {stage: the log\'s text, or null '
        'when it has none (yet)}}.')] = False,
    config: ConfigOpt = None,
    nats_url: UrlOpt = None,
) -> None:
    """Print a request's stage logs (each is uploaded when its stage ends). Exit 2 when none was printed
    or the id is unknown.

    Example: ftbus logs 20260101-120000-1a2b3c4d --stage train --follow"""
    settings = _settings(config, nats_url)
    from ftbus.batch import logs_main

    _run(logs_main(settings, request_id, stage.value if stage else None, follow, out, err, as_json=as_json),
         settings)


# ---------------------------------------------------------------------- assets


@assets_app.command("init", cls=FlagCommand)
def assets_init(config: ConfigOpt = None) -> None:
    """Build, offline, with the fine-tuning toolchain, under the assets directory (~/.ftbus/assets):
    the base model models/tiny-llama; the raw datasets datasets/tiny-qa, tiny-reviews and
    grade-school-arith; the benchmarks benchmarks/tiny-arith, tiny-arith-mc, tiny-sentiment and
    gsm8k-synth. What is already built is left alone.

    Example: ftbus assets init"""
    settings = _settings(config)
    from ftbus.assets import AssetsError, build_assets

    toolchain = settings.toolchain_path()
    try:
        build_assets(settings.assets, (toolchain / "python") if toolchain else Path("python"))
    except AssetsError as exc:
        _error(str(exc))
        raise typer.Exit(2) from None
    err.print(f"assets ready in {escape(str(settings.assets))}")


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
