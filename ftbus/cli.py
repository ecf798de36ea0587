"""The ``ftbus`` command line: the commands of ftbus/cli_*.py, put together on one typer app.

Exit codes of ``submit --wait`` (and ``get``): 0 = final_decision true, 1 = final_decision false,
2 = usage or infrastructure error (including an error verdict).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape

from ftbus import cli_follow, cli_results, cli_serve, cli_submit  # noqa: F401  (each registers its commands)
from ftbus.benchmarks_cli import benchmarks_app
from ftbus.cli_app import CONTEXT, ConfigOpt, app, cli_settings, err, error
from ftbus.cli_common import FlagCommand, WorkflowGroup
from ftbus.cli_serve import run_services  # what tests and bench/ start the stages with
from ftbus.score import score as score_command

__all__ = ["app", "main", "run_services"]

assets_app = typer.Typer(help="Offline assets: base models, raw datasets, benchmarks.", no_args_is_help=True,
                         cls=WorkflowGroup, context_settings=CONTEXT)
app.add_typer(assets_app, name="assets")
app.add_typer(benchmarks_app, name="benchmarks")
app.command("score", cls=FlagCommand)(score_command)


# ---------------------------------------------------------------------- assets


@assets_app.command("init", cls=FlagCommand)
def assets_init(config: ConfigOpt = None) -> None:
    """Build, offline, with the fine-tuning toolchain, under the assets directory (~/.ftbus/assets):
    the base model models/tiny-llama; the raw datasets datasets/tiny-qa, tiny-reviews and
    grade-school-arith; the benchmarks benchmarks/tiny-arith, tiny-arith-mc, tiny-sentiment and
    gsm8k-synth. What is already built is left alone.

    Example: ftbus assets init"""
    settings = cli_settings(config)
    from ftbus.assets import AssetsError, build_assets

    toolchain = settings.toolchain_path()
    try:
        build_assets(settings.assets, (toolchain / "python") if toolchain else Path("python"))
    except AssetsError as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    err.print(f"assets ready in {escape(str(settings.assets))}")


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(2)


if __name__ == "__main__":
    main()
