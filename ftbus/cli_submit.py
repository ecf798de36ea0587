"""`ftbus submit` (one workspace, or a batch) and `ftbus check`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ftbus.cli_app import ConfigOpt, UrlOpt, app, cli_settings, err, error, exit_code, out, print_verdict, run_command
from ftbus.cli_common import FlagCommand
from shared.events import CAMPAIGN_NAME, CAMPAIGN_NAME_RULE, MAX_RUNS, TaskSpec, Timeouts
from shared.settings import Settings


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
        error(f"--campaign {campaign!r}: {CAMPAIGN_NAME_RULE}")
        raise typer.Exit(2)
    settings = cli_settings(config, nats_url)
    timeouts = Timeouts(data_processing=data_timeout, training=train_timeout, benchmark=bench_timeout)
    if tasks_file is not None or len(workspaces or []) > 1:
        _submit_batch(settings, workspaces or [], tasks_file, wait is not False, as_json, timeouts,
                      {"base_model": base_model, "benchmark": benchmark, "description": description,
                       "datasets": dataset or [], "num_runs": num_runs, "campaign": campaign})
        return
    if not workspaces or base_model is None or benchmark is None:
        error("give a WORKSPACE with --base-model and --benchmark, or --tasks FILE.jsonl")
        raise typer.Exit(2)
    workspace = workspaces[0]
    wait = bool(wait)
    task = TaskSpec(
        base_model=base_model, benchmark=benchmark, description=description, involving_datasets=dataset or [],
        num_runs=num_runs, campaign=campaign,
    )
    _refuse_unless_checked([(workspace, task)], settings)

    async def main() -> int:
        from ftbus.client import Client
        from shared.artifacts import ArtifactError
        from shared.campaigns import CampaignNotYours
        from shared.paths import UnsafePath
        from shared.taskcheck import UnknownAsset

        async with Client(settings=settings) as client:
            try:
                rid = await client.submit(workspace, task, timeouts)
            except (FileNotFoundError, UnsafePath, ArtifactError, UnknownAsset, CampaignNotYours) as exc:
                error(str(exc))
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
            print_verdict(verdict, as_json)
            return exit_code(verdict)

    run_command(main(), settings)


def _refuse_unless_checked(items: Sequence[tuple[Path, TaskSpec]], settings: Settings) -> None:
    """`ftbus check` of each workspace, before anything connects: exit 2 with every problem found."""
    from ftbus.check import check_workspace

    failed = False
    for workspace, task in items:
        result = check_workspace(workspace, settings.assets, task, max_train_yaml_bytes=settings.max_train_yaml_bytes)
        for problem in result.problems:
            error(problem if len(items) == 1 else f"{workspace}: {problem}")
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
        error(str(exc))
        raise typer.Exit(2) from None
    _refuse_unless_checked([(t.workspace, t.task_spec()) for t in tasks], settings)
    run_command(submit_batch(settings, tasks, wait=wait, as_json=as_json, out=out, err=err), settings)


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

    settings = cli_settings(config)
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
                error(f"{result.workspace}: {problem}")
            for note in result.notes:
                err.print(f"note: {escape(note)}")
    raise typer.Exit(0 if all(r.ok for r in results) else 2)
