"""Following requests: `ftbus status`, `cancel`, `watch`, `ls`, `logs`."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer
from rich.markup import escape

from ftbus.cli_app import ConfigOpt, OutputOpt, UrlOpt, app, cli_settings, err, error, known_request, out, run_command
from ftbus.cli_common import FlagCommand, Output, print_columns
from ftbus.client import LOG_FILES
from shared.events import Progress


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
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from ftbus.client import Client

        async with Client(settings=settings) as client:
            record = await client.status(request_id)
        if record is None:
            # The aggregator writes a request's arrival with its next event, or after a second.
            error(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
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

    run_command(main(), settings)


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
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from ftbus.client import Client

        async with Client(settings=settings) as client:
            view = await client.status(request_id)
            if view is None:
                await known_request(client, request_id)
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

    run_command(main(), settings)


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
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from ftbus.client import Client

        async with Client(settings=settings) as client:
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

    run_command(main(), settings)


# ---------------------------------------------------------------------- dashboard


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
        error(f"unknown status {', '.join(bad)}: one of {', '.join(sorted(allowed))}")
        raise typer.Exit(2)
    settings = cli_settings(config, nats_url)
    from ftbus.batch import ls_main

    run_command(ls_main(settings, status_filter or [], limit, Output.json if as_json else output, out, err), settings)


LogStage = StrEnum("LogStage", {name: name for name in LOG_FILES})  # type: ignore[misc]


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
    settings = cli_settings(config, nats_url)
    from ftbus.batch import logs_main

    run_command(logs_main(settings, request_id, stage.value if stage else None, follow, out, err, as_json=as_json),
         settings)
