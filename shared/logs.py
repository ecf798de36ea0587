"""structlog set-up: JSON lines in deployment, readable lines in a terminal.

Services bind ``request_id`` and ``stage`` with ``bound(...)`` (contextvars), so every line a
handler logs, including from shared code it calls, names the request and stage.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import structlog

_configured = False


def setup_logging(fmt: Literal["auto", "json", "console"] = "auto", level: str = "INFO") -> None:
    global _configured
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str | None = None) -> Any:
    if not _configured:
        setup_logging()
    return structlog.get_logger(name) if name else structlog.get_logger()


@contextmanager
def bound(**values: Any) -> Iterator[None]:
    """Bind values (request_id, stage) to every log line inside the block, then restore."""
    tokens = structlog.contextvars.bind_contextvars(**values)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
