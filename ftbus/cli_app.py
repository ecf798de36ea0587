"""What the ``ftbus`` commands share: the typer app and its global options, the common options, reading
the settings, running a command (its exit code: 2 for anything unexpected, never 1), and printing
a verdict. The commands are in ftbus/cli_*.py by job; ftbus/cli.py puts them together.

Exit codes of ``submit --wait`` (and ``get``): 0 = final_decision true, 1 = final_decision false,
2 = usage or infrastructure error (including an error verdict).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ftbus.cli_common import Output, WorkflowGroup, console
from shared import loop as event_loop
from shared.bus import NotConnected
from shared.denials import PermissionDenied
from shared.events import Report, Verdict
from shared.logs import setup_logging
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

def error(message: str) -> None:
    """``error: MESSAGE`` on stderr, the message taken literally (no rich markup in it)."""
    err.print(f"[red]error:[/] {escape(message)}")


def cli_settings(config: Path | None, url: str | None = None, *, service: bool = False) -> Settings:
    """The settings of a command; ``service``: it runs services (their log lines: JSON off a terminal)."""
    try:
        settings = load_settings(str(config) if config else None)
    except Exception as exc:
        error(f"invalid settings: {exc}")
        raise typer.Exit(2) from None
    if url:
        from ftbus.connect import URL_ORIGIN

        settings = settings.model_copy(update={"nats_url": url})
        URL_ORIGIN.set("from --nats-url")
    fmt = _log_format[0] if _log_format else settings.log_format
    setup_logging(fmt, settings.log_level, client=not service)  # type: ignore[arg-type]
    return settings


def run_command(coro: Coroutine[Any, Any, int], settings: Settings) -> None:
    """Run a command on the configured event loop; anything unexpected is an infrastructure error:
    exit 2, never 1 (1 means final_decision false)."""
    try:
        code = event_loop.run(coro, settings.event_loop)
    except NotConnected as exc:
        error(str(exc))
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
        error(f"{type(exc).__name__}: {exc}{hint}")
        code = 2
    raise typer.Exit(code)


def exit_code(verdict: Verdict) -> int:
    if verdict.status == "error":
        return 2
    return 0 if verdict.final_decision else 1


async def known_request(client: Any, request_id: str) -> bool:
    """Whether ``request_id`` was submitted (and not yet forgotten), or has a verdict; says "unknown
    request" if not."""
    if await client.status(request_id) is not None or await client.get(request_id) is not None:
        return True
    error(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
           "record_max_age_s after it ended); `ftbus ls` lists the requests")
    return False


def print_lm_eval(verdict: Verdict, view: Any, settings: Settings) -> int:
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


def print_verdict(verdict: Verdict | Report, as_json: bool) -> None:
    if as_json:
        print(verdict.model_dump_json())
        return
    from ftbus.verdict_view import render_verdict

    render_verdict(out, verdict)
