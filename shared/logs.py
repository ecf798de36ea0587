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


class _StderrLogger:
    """Writes each line to the ``sys.stderr`` of the moment it is written.

    ``PrintLoggerFactory(file=sys.stderr)`` keeps the stream that was current at configure time;
    a CLI run in-process (a test's runner, a notebook) swaps ``sys.stderr`` for a buffer it closes
    afterwards, and every later line in that process then fails with "I/O operation on closed
    file"."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _stderr_logger(*_: Any) -> _StderrLogger:
    return _StderrLogger()


def _plain(_: Any, __: str, event: dict[str, Any]) -> str:
    """``warning: nats connection error (error=...)``: a client's log line, for people."""
    level = event.pop("level", "info")
    message = str(event.pop("event", ""))
    for key in ("timestamp", "logger"):
        event.pop(key, None)
    details = ", ".join(f"{k}={v}" for k, v in event.items())
    return f"{level}: {message}" + (f" ({details})" if details else "")


def setup_logging(fmt: Literal["auto", "json", "console"] = "auto", level: str = "INFO", *,
                  client: bool = False) -> None:
    """``auto``: readable lines on a terminal, JSON lines otherwise (a service's log collector);
    with ``client`` (a CLI command that is not a service) ``auto`` means plain one-line text
    (``warning: ...``) wherever it goes: JSON only when asked for (``--log-format json``)."""
    global _configured
    renderer: Any
    if fmt == "auto" and client:
        renderer = _plain
    else:
        if fmt == "auto":
            fmt = "console" if sys.stderr.isatty() else "json"
        renderer = (
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
        logger_factory=_stderr_logger,
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
