"""The async Python client: submit, wait, watch, status, get, cancel.

    async with await FtbusClient.connect(Settings()) as client:
        rid = await client.submit(Path("examples/lora"), TaskSpec(base_model="tiny-llama", benchmark="tiny-arith"))
        verdict = await client.wait(rid, on_progress=print)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from nats.js import api
from nats.js.errors import KeyNotFoundError, NotFoundError

from shared import codec
from shared.artifacts import upload_dir
from shared.bus import Bus, NotConnected
from shared.campaigns import CampaignRecord, CampaignStore
from shared.events import (
    CAMPAIGN_NAME,
    CAMPAIGN_NAME_RULE,
    CancelRequested,
    EvalRequested,
    Progress,
    Report,
    RequestContext,
    TaskSpec,
    Timeouts,
    Verdict,
)
from shared.records import RequestStatusView
from shared.settings import Settings
from shared.subjects import msg_id
from shared.taskcheck import assets_visible, check_task

#: The artifact ``submit`` leaves beside a request's workspace, ``<request_id>/submitted.json``.
SUBMITTED_MARKER = "submitted.json"

ProgressCallback = Callable[[Progress], Awaitable[None] | None]


def new_request_id() -> str:
    """Sortable by submission time, unique without coordination."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(4)


class WaitTimeout(TimeoutError):
    pass


class FtbusClient:
    """Every method raises shared.bus.PermissionDenied ("permission denied for <subject>") as soon as
    the server refuses this user one of its publishes or subscriptions."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.s = bus.subjects

    @classmethod
    async def connect(cls, settings: Settings, url: str | None = None, *, origin: str | None = None) -> FtbusClient:
        """Connect, trying the first connection for ``settings.connect_budget_s`` (0: without limit).

        Raises NotConnected whose message names the URL, where it came from (``origin``, else
        :func:`nats_url_origin`) and what to do."""
        try:
            bus = await Bus.connect(settings, name=settings.client_name, url=url,
                                    first_connect_s=settings.connect_budget_s or None)
        except NotConnected as exc:
            if exc.url is None:
                raise
            raise NotConnected(unreachable_message(exc.url, exc.reason or "", origin or nats_url_origin(settings, url)),
                               url=exc.url, reason=exc.reason) from None
        try:
            await bus.guard(bus.ensure_topology())
        except BaseException:
            await bus.close()
            raise
        return cls(bus)

    async def close(self) -> None:
        await self.bus.close()

    async def __aenter__(self) -> FtbusClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ submit

    async def submit(
        self,
        workspace: Path,
        task: TaskSpec,
        timeouts: Timeouts | None = None,
        request_id: str | None = None,
    ) -> str:
        if not workspace.is_dir():
            raise FileNotFoundError(f"workspace {workspace} is not a folder")
        if assets_visible(self.bus.settings.assets):
            check_task(task, self.bus.settings.assets)  # UnknownAsset, with the known names
        return await self.bus.guard(self._submit(workspace, task, timeouts, request_id or new_request_id()))

    async def _submit(self, workspace: Path, task: TaskSpec, timeouts: Timeouts | None, rid: str) -> str:
        settings = self.bus.settings
        files = await upload_dir(
            await self.bus.submitter_artifacts(),
            f"{rid}/workspace",
            workspace,
            max_bytes=settings.max_workspace_bytes,
            max_files=settings.max_workspace_files,
            exclude=_exclude_outputs,
        )
        event = EvalRequested(
            request_id=rid,
            context=RequestContext(task=task, workspace=files, timeouts=timeouts or Timeouts()),
        )
        # Beside the request, a marker that `status` finds before the aggregator has written the
        # request's first view (an agent reads the artifacts store's metadata, nothing else of it).
        marker = f'{{"submitted_at": "{event.emitted_at.isoformat()}"}}'.encode()
        await asyncio.gather(self.bus.publish(self.s.eval_requested, event, msg_id(rid, "submit", "requested")),
                             (await self.bus.submitter_artifacts()).put_bytes(f"{rid}/{SUBMITTED_MARKER}", marker))
        return rid

    async def submit_retrying(
        self,
        workspace: Path,
        task: TaskSpec,
        timeouts: Timeouts | None = None,
        request_id: str | None = None,
        *,
        attempts: int = 10,
        delay_s: float = 0.5,
    ) -> int:
        """``submit`` through failovers: every attempt uses the same request id, so a request whose
        first attempt was accepted (its acknowledgement lost) is not submitted twice: the stream drops
        the repeated ``Nats-Msg-Id``. Returns how many attempts it took; re-raises the last error."""
        from shared.artifacts import WorkspaceTooLarge

        rid = request_id or new_request_id()
        for attempt in range(1, attempts + 1):
            try:
                await self.submit(workspace, task, timeouts, request_id=rid)
                return attempt
            except (FileNotFoundError, ValueError, WorkspaceTooLarge):
                raise  # the request itself is wrong (UnsafePath, UnknownAsset, ...): no retry helps
            except Exception:
                if attempt == attempts:
                    raise
                await asyncio.sleep(min(delay_s * attempt, 5.0))
        return attempts

    async def cancel(self, request_id: str, reason: str = "cancelled by user") -> None:
        event = CancelRequested(request_id=request_id, reason=reason)
        await self.bus.guard(self.bus.publish(self.s.cancel, event, msg_id(request_id, "control", "cancel")))

    # ------------------------------------------------------------------ results

    async def get(self, request_id: str, report: bool = False) -> Verdict | Report | None:
        stream = self.s.stream_reports if report else self.s.stream_verdicts
        subject = self.s.report(request_id) if report else self.s.verdict(request_id)
        try:
            raw = await self.bus.guard(self.bus.js.get_last_msg(stream, subject))
        except NotFoundError:
            return None
        return codec.decode(raw.data or b"", Report if report else Verdict)

    async def status(self, request_id: str) -> RequestStatusView | None:
        """The request's public view; ``queued`` for one submitted whose view the aggregator has not
        written yet; None for a request nobody submitted (or one forgotten after record_max_age_s)."""
        kv = await self.bus.guard(self.bus.kv(self.s.kv_status))
        try:
            entry = await self.bus.guard(kv.get(request_id))
        except KeyNotFoundError:
            entry = None
        if entry is not None and entry.value:
            return RequestStatusView.model_validate_json(entry.value)
        store = await self.bus.guard(self.bus.submitter_artifacts())
        try:
            submitted = await self.bus.guard(store.stat(f"{request_id}/{SUBMITTED_MARKER}"))
        except ValueError:  # not a request id that submit could have made (UnsafePath)
            return None
        return RequestStatusView(request_id=request_id, status="queued") if submitted is not None else None

    async def campaign(self, name: str) -> CampaignRecord | None:
        """The campaign's record (shared/campaigns.py), or None when no candidate of it was judged yet."""
        if not re.fullmatch(CAMPAIGN_NAME, name):
            raise ValueError(f"{name!r}: {CAMPAIGN_NAME_RULE}")
        return await self.bus.guard(CampaignStore(self.bus).get(name))

    async def wait(
        self,
        request_id: str,
        on_progress: ProgressCallback | None = None,
        timeout_s: float | None = None,
        report: bool = False,
    ) -> Verdict | Report:
        """Block until the verdict (or report) exists; progress events go to ``on_progress``."""
        return await self.bus.guard(self._wait(request_id, on_progress, timeout_s, report))

    async def _wait(
        self, request_id: str, on_progress: ProgressCallback | None, timeout_s: float | None, report: bool
    ) -> Verdict | Report:
        progress_sub = None
        if on_progress is not None:

            async def _progress(msg: Any) -> None:
                with contextlib.suppress(codec.CodecError):
                    result = on_progress(codec.decode(msg.data, Progress))
                    if asyncio.iscoroutine(result):
                        await result

            progress_sub = await self.bus.nc.subscribe(self.s.progress(request_id), cb=_progress)
        subject = self.s.report(request_id) if report else self.s.verdict(request_id)
        sub = await self.bus.js.subscribe(subject, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL)
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

    async def watch(self) -> AsyncIterator[Progress | Verdict]:
        """Every progress event and every new verdict, as they happen."""
        queue: asyncio.Queue[Progress | Verdict] = asyncio.Queue()

        async def _push(msg: Any) -> None:
            with contextlib.suppress(codec.CodecError):
                await queue.put(codec.decode(msg.data, (Progress, Verdict)))

        progress_sub = await self.bus.nc.subscribe(self.s.progress(), cb=_push)
        verdict_sub = await self.bus.guard(
            self.bus.js.subscribe(
                self.s.verdict(), cb=_push, ordered_consumer=True, deliver_policy=api.DeliverPolicy.NEW
            )
        )
        try:
            while True:
                yield await self.bus.guard(queue.get())
        finally:
            for sub in (progress_sub, verdict_sub):
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()


async def _next(sub: Any) -> Any:
    while True:
        try:
            return await sub.next_msg(timeout=3600)
        except TimeoutError:
            continue


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


#: Set by the CLI when --nats-url was given: the settings alone cannot tell a flag from FTBUS_NATS_URL.
URL_ORIGIN: ContextVar[str | None] = ContextVar("ftbus_url_origin", default=None)


def nats_url_origin(settings: Settings, url: str | None = None) -> str:
    """Where the URL a client uses came from, in words: for "cannot reach NATS at URL (ORIGIN)"."""
    if URL_ORIGIN.get() and (url is None or url == settings.nats_url):
        return URL_ORIGIN.get() or ""
    if url:
        return "given in code" if url != settings.nats_url else "from --nats-url"
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


def _exclude_outputs(path: Any) -> bool:
    """Leftovers of a local run are not part of the candidate (the reference's clear_workspace)."""
    top = path.parts[0] if path.parts else ""
    return top in {"output", "benchmark_results", "merged_model", "data.json", "data_stats.json"}
