"""The event loop every ftbus process runs on: uvloop by default (docs/dependencies.md), and the
garbage collector's pace.

The light stages' cost in a burst is mostly the event loop's own (tasks, callbacks, sockets: a
third of the aggregator's CPU, profiled): uvloop does that work in C. ``event_loop: asyncio``
(``FTBUS_EVENT_LOOP``) runs the standard loop instead, e.g. to rule the loop out of a bug.

The cyclic garbage collector ran a young-generation collection every 700 objects a burst kept
alive for a while (records, futures, messages in flight): in a burst of 500 pre-check failures the
aggregator spent 383 ms in it, a quarter of its CPU, two full collections included (each walks
every object the process has, the imports' too). Everything loaded at start is frozen out of the
collector's sight (``gc.freeze``), and a young collection waits for GC_YOUNG_THRESHOLD objects:
the same burst then costs the aggregator 0-30 ms of collection, data and judge none. Reference
counting still frees almost everything at once; the collector only finds cycles, which now live
a little longer (bench/precheck_burst.py; bench/soak.py watches memory).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoopName = Literal["uvloop", "asyncio"]

#: New container objects (net of those freed) between two young-generation collections (CPython: 700).
GC_YOUNG_THRESHOLD = 10_000


def run(main: Coroutine[Any, Any, T], event_loop: EventLoopName = "uvloop") -> T:
    """``asyncio.run(main)`` on the chosen loop, what is loaded by now frozen out of the collector's
    sight and young collections paced by GC_YOUNG_THRESHOLD."""
    # No collection first: it would cost every command 0.1 s, to free the few cycles start-up left.
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *threshold[1:])
    try:
        if event_loop == "uvloop":
            import uvloop

            return uvloop.run(main)
        return asyncio.run(main)
    finally:  # as it was, for a caller that goes on (a test)
        gc.set_threshold(*threshold)
        gc.unfreeze()
