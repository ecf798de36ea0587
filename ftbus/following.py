"""Following requests as they happen: waiting for a verdict or report, watching every request,
and a stage's progress until its log is uploaded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from nats.js import api

from shared import codec
from shared.bus import Bus
from shared.events import Progress, Report, Verdict

ProgressCallback = Callable[[Progress], Awaitable[None] | None]


class WaitTimeout(TimeoutError):
    pass


async def wait_for(
    bus: Bus, request_id: str, on_progress: ProgressCallback | None, timeout_s: float | None, report: bool
) -> Verdict | Report:
    """The request's verdict (or report) once it exists; progress events go to ``on_progress``."""
    s = bus.subjects
    progress_sub = None
    if on_progress is not None:

        async def _progress(msg: Any) -> None:
            with contextlib.suppress(codec.CodecError):
                result = on_progress(codec.decode(msg.data, Progress))
                if asyncio.iscoroutine(result):
                    await result

        progress_sub = await bus.nc.subscribe(s.progress(request_id), cb=_progress)
    subject = s.report(request_id) if report else s.verdict(request_id)
    sub = await bus.js.subscribe(subject, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL)
    try:
        msg = await sub.next_msg(timeout=timeout_s) if timeout_s else await _next(sub)
    except TimeoutError as exc:
        raise WaitTimeout(f"no verdict for {request_id} within {timeout_s} s") from exc
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if progress_sub is not None:
            with contextlib.suppress(Exception):
                await progress_sub.unsubscribe()
    return codec.decode(msg.data, Report if report else Verdict)


async def _next(sub: Any) -> Any:
    while True:
        try:
            return await sub.next_msg(timeout=3600)
        except TimeoutError:
            continue


async def watch_all(bus: Bus) -> AsyncIterator[Progress | Verdict]:
    """Every progress event and every new verdict, as they happen."""
    queue: asyncio.Queue[Progress | Verdict] = asyncio.Queue()

    async def _push(msg: Any) -> None:
        with contextlib.suppress(codec.CodecError):
            await queue.put(codec.decode(msg.data, (Progress, Verdict)))

    progress_sub = await bus.nc.subscribe(bus.subjects.progress(), cb=_push)
    verdict_sub = await bus.guard(
        bus.js.subscribe(bus.subjects.verdict(), cb=_push, ordered_consumer=True,
                         deliver_policy=api.DeliverPolicy.NEW)
    )
    try:
        while True:
            yield await bus.guard(queue.get())
    finally:
        for sub in (progress_sub, verdict_sub):
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def follow_stage(
    bus: Bus, request_id: str, stage: str, read_log: Callable[[], Awaitable[str | None]],
    ended: Callable[[], Awaitable[bool]], poll_s: float,
) -> AsyncIterator[Progress | str]:
    """A stage's progress events as they happen, then its log (``read_log``) once uploaded. Ends after
    the log, or when the request has ``ended`` without one."""
    queue: asyncio.Queue[Progress] = asyncio.Queue()

    async def _push(msg: Any) -> None:
        with contextlib.suppress(codec.CodecError):
            progress = codec.decode(msg.data, Progress)
            if progress.stage == stage:
                queue.put_nowait(progress)

    sub = await bus.nc.subscribe(bus.subjects.progress(request_id), cb=_push)
    try:
        while True:
            while not queue.empty():
                yield queue.get_nowait()
            text = await read_log()
            if text is not None:
                yield text
                return
            if await ended():
                # A last look: the log may have landed just before the verdict.
                text = await read_log()
                if text is not None:
                    yield text
                return
            with contextlib.suppress(TimeoutError):
                yield await asyncio.wait_for(queue.get(), timeout=poll_s)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
