"""The event loop every ftbus process runs on: uvloop by default (docs/dependencies.md).

The light stages' cost in a burst is mostly the event loop's own (tasks, callbacks, sockets: a
third of the aggregator's CPU, profiled): uvloop does that work in C. ``event_loop: asyncio``
(``FTBUS_EVENT_LOOP``) runs the standard loop instead, e.g. to rule the loop out of a bug.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoopName = Literal["uvloop", "asyncio"]


def run(main: Coroutine[Any, Any, T], event_loop: EventLoopName = "uvloop") -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if event_loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
