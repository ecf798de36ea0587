"""Opening a client's connection, and saying in one line why it failed: the URL, where it came from
(``--nats-url``, FTBUS_NATS_URL, the settings, or the file `ftbus up` left) and what to do."""

from __future__ import annotations

import json
import os
from contextvars import ContextVar

from shared.bus import Bus, NotConnected
from shared.settings import Settings

#: Set by the CLI when --nats-url was given: the settings alone cannot tell a flag from FTBUS_NATS_URL.
URL_ORIGIN: ContextVar[str | None] = ContextVar("ftbus_url_origin", default=None)


async def connect_bus(settings: Settings) -> Bus:
    """Connect as ``settings.client_name``, trying the first connection for ``settings.connect_budget_s``
    (0: without limit), and make sure the topology exists.

    Raises NotConnected whose message names the URL, where it came from and what to do."""
    try:
        bus = await Bus.connect(settings, name=settings.client_name, first_connect_s=settings.connect_budget_s or None)
    except NotConnected as exc:
        if exc.url is None:
            raise
        raise NotConnected(unreachable_message(exc.url, exc.reason or "", nats_url_origin(settings)),
                           url=exc.url, reason=exc.reason) from None
    try:
        await bus.guard(bus.ensure_topology())
    except BaseException:
        await bus.close()
        raise
    return bus


def _up_state(settings: Settings) -> str:
    """Whether the `ftbus up` that wrote the home's nats.url still runs (its server's pid file)."""
    from ftbus.embedded import PID_FILE, start_time

    try:
        record = json.loads((settings.home / "nats" / PID_FILE).read_text())
        pid, owner = int(record["pid"]), int(record["owner"])
        alive = start_time(pid) == str(record["start"]) and start_time(owner) == str(record["owner_start"])
    except (OSError, ValueError, KeyError, TypeError):
        return "the `ftbus up` that wrote it is no longer running"
    return f"its `ftbus up` (pid {owner}) is still running" if alive else \
        f"the `ftbus up` that wrote it (pid {owner}) is no longer running"


def nats_url_origin(settings: Settings) -> str:
    """Where the URL a client uses came from, in words: for "cannot reach NATS at URL (ORIGIN)"."""
    if URL_ORIGIN.get():
        return URL_ORIGIN.get() or ""
    if settings.nats_url:
        if os.environ.get("FTBUS_NATS_URL") == settings.nats_url:
            return "from FTBUS_NATS_URL"
        return "from nats_url in the settings (--config or FTBUS_CONFIG file, or given in code)"
    return f"from {settings.url_file}, left by `ftbus up`; {_up_state(settings)}"


def unreachable_message(url: str, reason: str, origin: str) -> str:
    """One line: the URL, where it came from, why it failed, and what to do."""
    if "ftbus up" in origin:
        todo = "start it again with `ftbus up`, or give --nats-url / FTBUS_NATS_URL"
    elif "--nats-url" in origin:
        todo = "check the URL, or leave --nats-url out to use the server `ftbus up` started"
    elif "FTBUS_NATS_URL" in origin:
        todo = "check the URL, or unset FTBUS_NATS_URL to use the server `ftbus up` started"
    else:
        todo = "check the URL and that the server runs (`ftbus up` starts one here)"
    return f"cannot reach NATS at {url} ({origin}): {reason}; {todo}"
