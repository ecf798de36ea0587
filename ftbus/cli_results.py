"""A request's results: `ftbus get`, `pull`, `compare`, `campaign`."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ftbus.cli_app import (
    ConfigOpt,
    UrlOpt,
    app,
    cli_settings,
    err,
    error,
    exit_code,
    known_request,
    out,
    print_lm_eval,
    print_verdict,
    run_command,
)
from ftbus.cli_common import FlagCommand
from shared.events import CAMPAIGN_NAME, CAMPAIGN_NAME_RULE


class VerdictFormat(StrEnum):
    verdict = "verdict"
    lm_eval = "lm-eval"


class PullWhat(StrEnum):
    adapter = "adapter"
    merged = "merged"


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
        error("--format lm-eval is the validation split's results: not with --report")
        raise typer.Exit(2)
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from ftbus.client import Client

        async with Client(settings=settings) as client:
            verdict = await (client.report(request_id) if report else client.get(request_id))
            view = await client.status(request_id) if output_format == VerdictFormat.lm_eval or verdict is None \
                else None
        if verdict is None:
            if view is None:
                error(f"unknown request {request_id}: nothing was submitted under that id (or it was forgotten, "
                       "record_max_age_s after it ended); `ftbus ls` lists the requests")
                return 2
            err.print(f"no {'report' if report else 'verdict'} for {escape(request_id)} yet (it is {view.status}; "
                      f"see `ftbus status {escape(request_id)}`)")
            return 2
        if output_format == VerdictFormat.lm_eval:
            return print_lm_eval(verdict, view, settings)
        print_verdict(verdict, as_json)
        return exit_code(verdict)

    run_command(main(), settings)


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
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

        from ftbus.client import Client
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
            async with Client(settings=settings) as client:
                if not await known_request(client, request_id):
                    return 2
                with bars:
                    pulled = await pull_model(client, request_id, to or Path(request_id), what=what.value,  # type: ignore[arg-type]
                                              base_model=base_model, python=python, on_progress=on_progress)
        except PullError as exc:
            error(str(exc))
            return 2
        if as_json:
            print(json.dumps({"request_id": pulled.request_id, "path": str(pulled.path), "what": pulled.what,
                              "model_kind": pulled.model_kind, "files": pulled.files, "bytes": pulled.bytes}))
        else:
            err.print(f"{pulled.model_kind} model of {request_id} ({pulled.what}, {len(pulled.files)} files, "
                      f"{pulled.bytes / 2**20:.1f} MiB) in {pulled.path}")
        return 0

    run_command(main(), settings)


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
    p-value of McNemar's exact test (right/wrong items, subsets of one size) or the betting test of
    the mean difference, the interval built on the same test so that the two never disagree (seeded: the
    same on every rerun): "FIRST is better than SECOND by +0.12 (95% CI +0.05 to +0.19, p = 0.002,
    60 items)", or "not distinguishable", and what the comparison could have detected at 80% power.
    Fewer than 10 items: "too few items to say". Then the decision function's answer on these items
    (shared/decision.py, the benchmark stage's): worse, not distinguishable, or screened in for the
    hidden confirmation pool, which only the benchmark stage reads. Requests without a verdict or
    per-item outcomes, on different benchmarks, with different --num-runs or different items are
    refused, saying why.

    Exit 0 when compared (whatever the result), 2 when refused, on bad usage or no server.

    Example: ftbus compare 20260101-120000-1a2b3c4d 20260101-110000-5e6f7a8b --json"""
    from shared.statistics import check_level

    try:
        check_level(level, "--level")
    except ValueError as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from ftbus.client import Client
        from ftbus.compare import NotComparable, compare_requests

        async with Client(settings=settings) as client:
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
        out.print(escape(result.decision_summary), highlight=False, soft_wrap=True)
        return 0

    run_command(main(), settings)


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
        error(f"{name!r}: {CAMPAIGN_NAME_RULE}")
        raise typer.Exit(2)
    settings = cli_settings(config, nats_url)

    async def main() -> int:
        from ftbus.campaign_view import render_campaign
        from ftbus.client import Client

        async with Client(settings=settings) as client:
            record = await client.campaign(name)
        if record is None:
            error(f"no campaign {name}: no candidate submitted with --campaign {name} has been judged yet "
                   "(a campaign is kept record_max_age_s after its last judgement)")
            return 2
        render_campaign(out, record, as_json)
        return 0

    run_command(main(), settings)
