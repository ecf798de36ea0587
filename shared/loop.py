"""The event loop every ftbus process runs on: uvloop by default (docs/dependencies.md), and the
garbage collector's pace.

The light stages' cost in a burst is mostly the event loop's own (tasks, callbacks, sockets: a
third of the aggregator's CPU, profiled): uvloop does that work in C. ``event_loop: asyncio``
(``FTBUS_EVENT_LOOP``) runs the standard loop instead, e.g. to rule the loop out of a bug.

Everything loaded at start-up (the imports, the settings) is frozen out of the garbage collector's
sight (``gc.freeze``): its collections then walk only what the service makes as it runs.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoopName = Literal["uvloop", "asyncio"]


def run(main: Coroutine[Any, Any, T], event_loop: EventLoopName = "uvloop") -> T:
    """``asyncio.run(main)`` on the chosen loop, what is loaded by now frozen out of the collector's sight."""
    gc.freeze()
    try:
        if event_loop == "uvloop":
            import uvloop

            return uvloop.run(main)
        return asyncio.run(main)
    finally:  # as it was, for a caller that goes on (a test)
        gc.unfreeze()
