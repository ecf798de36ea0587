"""What every ``ftbus`` command shares: help conventions, consoles that suit a pipe, and plain columns.

- Flags show no ``<bool>`` type in help (typer shows one for every option), and the commands are
  listed in the order of the workflow (:data:`WORKFLOW`), not the order they were registered in.
- On a terminal, tables are rich tables; in a pipe (no TTY) they are plain columns, as wide as
  their longest cell: a name or an id is never cut, and nothing is folded at 80 columns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import click
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

#: `ftbus --help` lists the commands in this order: set up, check and submit, follow, read, then the rest.
WORKFLOW = ("assets", "benchmarks", "up", "check", "submit", "status", "watch", "ls", "logs", "get", "compare",
            "campaign", "pull", "cancel", "score", "dashboard", "worker")


class _BareFlags:
    """Flags (``--json``, ``--wait/--no-wait``, ``--help``) without the ``<bool>`` typer shows."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params: list[click.Parameter] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class FlagCommand(_BareFlags, TyperCommand):
    """A command whose help shows flags as flags."""


class WorkflowGroup(_BareFlags, TyperGroup):
    """A group whose help shows flags as flags and lists its commands in :data:`WORKFLOW` order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = list(super().list_commands(ctx))
        rank = {name: i for i, name in enumerate(WORKFLOW)}
        return sorted(names, key=lambda name: (rank.get(name, len(rank)), names.index(name)))


class Output(StrEnum):
    """``-o``: how a list is printed. table: rich on a terminal, plain columns in a pipe (the default);
    wide: plain columns with every field; plain: plain columns; json: one JSON array."""

    table = "table"
    wide = "wide"
    plain = "plain"
    json = "json"


def is_tty(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def console(stderr: bool = False) -> Console:
    """A console that never hard-wraps: long lines (paths, messages) stay whole in a pipe."""
    return Console(stderr=stderr, soft_wrap=True, highlight=False)


def plain_columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, nothing cut; no trailing blanks.
    A cell's line breaks become spaces, so that each row stays one line (for grep and awk)."""
    cells = [[" ".join(str(c).split()) if c else "" for c in row] for row in [list(headers), *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def print_columns(out: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
                  rich_table: bool | None = None) -> None:
    """A table on a terminal (``rich_table`` None: when stdout is one), plain columns otherwise."""
    if rich_table is None:
        rich_table = out.is_terminal
    if not rich_table:
        sys.stdout.write(plain_columns(headers, rows))
        sys.stdout.flush()
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for i, header in enumerate(headers):  # folded if the terminal is narrow, never cut with an ellipsis
        table.add_column(header, no_wrap=i == 0, overflow="fold")
    for row in rows:
        table.add_row(*(escape(str(c)) for c in row))
    out.print(table)
