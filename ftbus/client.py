"""The Python API: ``from ftbus import Client``.

Async, for services and agent loops::

    async with Client() as client:                      # the server `ftbus up` started, or FTBUS_NATS_URL
        rid = await client.submit("examples/lora", base_model="tiny-llama", benchmark="tiny-sentiment")
        verdict = await client.wait(rid)

Blocking, for scripts and notebooks (it opens and closes its own connection, and works inside a
running event loop such as Jupyter's)::

    verdict = Client().evaluate("examples/lora", base_model="tiny-llama", benchmark="tiny-sentiment")
    verdict.final_decision, verdict.result.baseline.difference

Results are the bus's own pydantic models: :class:`Verdict` (what an agent may see), :class:`Report`
(the verdict plus the hidden test split; only users granted it may read it), :class:`RequestStatusView`.
It is the one client: the CLI uses it too. Every call raises shared.bus.PermissionDenied ("permission
denied for <subject>") as soon as the server refuses this user one of its publishes or subscriptions.
A ``Client`` that is not connected holds only its settings, so it pickles (RD-Agent sends its
evaluators to worker processes). The parts live beside it: ftbus/connect.py (connecting, and why it
failed), ftbus/submitting.py (the upload and the request), ftbus/following.py (wait, watch, follow).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from nats.js.errors import KeyNotFoundError, NotFoundError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ftbus.connect import connect_bus
from ftbus.following import ProgressCallback, WaitTimeout, follow_stage, wait_for, watch_all
from ftbus.submitting import SUBMITTED_MARKER, new_request_id, submit_workspace
from shared import codec
from shared.bus import Bus
from shared.campaigns import CampaignNotYours, CampaignRecord, CampaignStore, foreign_owner
from shared.events import (
    CAMPAIGN_NAME,
    CAMPAIGN_NAME_RULE,
    MAX_RUNS,
    CampaignName,
    CancelRequested,
    Progress,
    Report,
    TaskSpec,
    Timeouts,
    Verdict,
)
from shared.kv_scan import latest
from shared.records import TERMINAL, RequestStatus, RequestStatusView
from shared.settings import Settings
from shared.subjects import msg_id
from shared.taskcheck import assets_visible, check_task

if TYPE_CHECKING:
    from ftbus.compare import RequestComparison
    from ftbus.pull import Pulled

T = TypeVar("T")

#: ``--stage`` name -> the log the stage leaves in the artifact store (``<request_id>/logs/<file>``).
#: The hidden test split's logs are in the private store, which agents cannot read: not listed.
LOG_FILES: dict[str, str] = {
    "data": "data_processing.log",
    "train": "training.log",
    "bench": "benchmark-validation.log",
    "baseline": "benchmark-baseline-validation.log",
}
#: Which pipeline stage (as in RequestStatusView.stages) writes each log: stages of the table
#: (ftbus/stages.py), every sandboxed one with a log of its own name (tests/unit/test_ui_lists.py).
LOG_STAGE: dict[str, str] = {"data": "data", "train": "train", "bench": "bench", "baseline": "bench"}

__all__ = [
    "LOG_FILES",
    "Client",
    "EvalTask",
    "Progress",
    "Report",
    "RequestStatusView",
    "Timeouts",
    "Verdict",
    "WaitTimeout",
]


class EvalTask(BaseModel):
    """One evaluation: a workspace and its task. One line of ``ftbus submit --tasks FILE.jsonl``."""

    model_config = ConfigDict(extra="forbid")

    workspace: Path
    base_model: str = Field(min_length=1)
    benchmark: str = Field(min_length=1)
    description: str = ""
    datasets: list[str] = Field(default_factory=list, description="raw datasets under assets/datasets it reads")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    num_runs: int | None = Field(default=None, ge=1, le=MAX_RUNS,
                                 description="samples per benchmark item; default: the benchmark's num_runs")
    campaign: CampaignName | None = Field(
        default=None, description="the campaign it belongs to: accepted only if it beats the campaign's incumbent "
        "beyond noise (docs/judge.md, \"Campaigns\")")

    def task_spec(self) -> TaskSpec:
        return TaskSpec(base_model=self.base_model, benchmark=self.benchmark, description=self.description,
                        involving_datasets=list(self.datasets), num_runs=self.num_runs, campaign=self.campaign)


class Client:
    """A handle on one ftbus installation. Use ``async with Client() as c`` for the async calls;
    :meth:`evaluate` and :meth:`evaluate_many` block and need no ``async with``."""

    def __init__(self, nats_url: str | None = None, *, settings: Settings | None = None, **overrides: Any) -> None:
        """``nats_url``: the server (default: FTBUS_NATS_URL, else the one `ftbus up` recorded in its
        home). ``settings``: a full ``Settings`` (default: read from FTBUS_* variables).
        ``overrides``: single settings by name, e.g. ``client_name="agent-7"``."""
        base = settings or Settings()
        unknown = sorted(set(overrides) - set(Settings.model_fields))
        if unknown:
            raise TypeError(f"unknown ftbus settings: {', '.join(unknown)} (see docs/configuration.md)")
        update = dict(overrides)
        if nats_url:
            update["nats_url"] = nats_url
        self.settings = base.model_copy(update=update) if update else base
        self._bus: Bus | None = None

    @classmethod
    def on_bus(cls, bus: Bus) -> Client:
        """A client over a connection that is already open (its topology made); closing it closes ``bus``."""
        client = cls(settings=bus.settings)
        client._bus = bus
        return client

    # ------------------------------------------------------------------ connection

    async def connect(self) -> Client:
        """Connect (as ``client_name``, trying for ``connect_budget_s``). Raises NotConnected whose
        message names the URL, where it came from and what to do."""
        if self._bus is None:
            self._bus = await connect_bus(self.settings)
        return self

    async def close(self) -> None:
        if self._bus is not None:
            bus, self._bus = self._bus, None
            await bus.close()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def bus(self) -> Bus:
        """The connection (for the lower-level calls: its streams, buckets and stores)."""
        if self._bus is None:
            raise RuntimeError("the Client is not connected: use `async with Client() as client:` "
                               "(or the blocking Client().evaluate(...))")
        return self._bus

    def __getstate__(self) -> dict[str, Any]:
        # A live connection belongs to one event loop in one process: never pickled.
        return {"settings": self.settings, "_bus": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # ------------------------------------------------------------------ async calls

    async def submit(
        self,
        workspace: str | Path,
        task: TaskSpec | None = None,
        timeouts: Timeouts | None = None,
        *,
        base_model: str | None = None,
        benchmark: str | None = None,
        description: str = "",
        datasets: Sequence[str] = (),
        request_id: str | None = None,
        num_runs: int | None = None,
        campaign: str | None = None,
    ) -> str:
        """Upload the workspace and request its evaluation; return the request id at once. The task is
        either a ``TaskSpec`` or its fields as keywords: ``base_model`` and ``benchmark``; ``num_runs``:
        samples per benchmark item (default: the benchmark's own, 1 unless its descriptor says);
        ``campaign``: the campaign it belongs to (letters, digits, ``_`` and ``-``): it is accepted only
        if it beats the campaign's incumbent beyond noise, and then becomes the incumbent
        (docs/judge.md, "Campaigns"; :meth:`campaign` shows one).

        Raises FileNotFoundError (no such folder), UnknownAsset (with the known names, where this
        machine sees the assets), CampaignNotYours (the campaign is another identity's) or
        WorkspaceTooLarge before anything is sent."""
        if task is None:
            if base_model is None or benchmark is None:
                raise TypeError("submit needs a TaskSpec or both base_model= and benchmark=")
            task = EvalTask(workspace=Path(workspace), base_model=base_model, benchmark=benchmark,
                            description=description, datasets=list(datasets), num_runs=num_runs,
                            campaign=campaign).task_spec()
        elif base_model or benchmark or description or datasets or num_runs or campaign:
            raise TypeError("submit takes a TaskSpec or the task's fields as keywords, not both")
        workspace = Path(workspace)
        if not workspace.is_dir():
            raise FileNotFoundError(f"workspace {workspace} is not a folder")
        bus = self.bus
        if assets_visible(bus.settings.assets):
            check_task(task, bus.settings.assets)  # UnknownAsset, with the known names
        if task.campaign is not None:
            # The judge refuses a request into another identity's campaign; say so before uploading.
            record = await bus.guard(CampaignStore(bus).get(task.campaign))
            foreign = foreign_owner(record, bus.settings.submit_owner())
            if foreign is not None:
                raise CampaignNotYours(foreign)
        rid = request_id or new_request_id()
        return await bus.guard(submit_workspace(bus, workspace, task, timeouts, rid))

    async def submit_task(self, task: EvalTask, *, request_id: str | None = None) -> str:
        return await self.submit(task.workspace, task.task_spec(), task.timeouts, request_id=request_id)

    async def submit_retrying(
        self, workspace: Path, task: TaskSpec, timeouts: Timeouts | None = None, request_id: str | None = None,
        *, attempts: int = 10, delay_s: float = 0.5,
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

    async def wait(
        self, request_id: str, *, timeout_s: float | None = None, on_progress: ProgressCallback | None = None
    ) -> Verdict:
        """The verdict, once there is one (raises WaitTimeout after ``timeout_s``); progress events go
        to ``on_progress`` meanwhile."""
        verdict = await self.bus.guard(wait_for(self.bus, request_id, on_progress, timeout_s, report=False))
        assert isinstance(verdict, Verdict)
        return verdict

    async def wait_report(self, request_id: str, *, timeout_s: float | None = None) -> Report:
        """The report (the verdict plus the hidden test split), once there is one."""
        report = await self.bus.guard(wait_for(self.bus, request_id, None, timeout_s, report=True))
        assert isinstance(report, Report)
        return report

    async def watch(self) -> AsyncIterator[Progress | Verdict]:
        """Every progress event and every new verdict of every request, as they happen."""
        async for item in watch_all(self.bus):
            yield item

    async def aevaluate(
        self,
        workspace: str | Path,
        *,
        base_model: str,
        benchmark: str,
        description: str = "",
        datasets: Sequence[str] = (),
        timeouts: Timeouts | None = None,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        campaign: str | None = None,
    ) -> Verdict:
        """Submit and wait: the async form of :meth:`evaluate`."""
        rid = await self.submit(workspace, base_model=base_model, benchmark=benchmark, description=description,
                                datasets=datasets, timeouts=timeouts, campaign=campaign)
        return await self.wait(rid, timeout_s=timeout_s, on_progress=on_progress)

    async def aevaluate_many(
        self,
        tasks: Iterable[EvalTask],
        *,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        on_submitted: Callable[[EvalTask, str], None] | None = None,
    ) -> list[Verdict]:
        """Submit every task, then wait for all of them at once; verdicts in the order of ``tasks``."""
        rids = await self.submit_many(tasks, on_submitted=on_submitted)
        return list(await asyncio.gather(*(self.wait(rid, timeout_s=timeout_s, on_progress=on_progress)
                                           for rid in rids)))

    async def submit_many(
        self, tasks: Iterable[EvalTask], *, on_submitted: Callable[[EvalTask, str], None] | None = None
    ) -> list[str]:
        rids = []
        for task in tasks:
            rid = await self.submit_task(task)
            if on_submitted is not None:
                on_submitted(task, rid)
            rids.append(rid)
        return rids

    async def get(self, request_id: str) -> Verdict | None:
        """The verdict, or None while there is none."""
        return await self._last(self.bus.subjects.stream_verdicts, self.bus.subjects.verdict(request_id), Verdict)

    async def report(self, request_id: str) -> Report | None:
        """The verdict plus the hidden test split (dashboards and evaluation owners only)."""
        return await self._last(self.bus.subjects.stream_reports, self.bus.subjects.report(request_id), Report)

    async def _last(self, stream: str, subject: str, kind: type[T]) -> T | None:
        try:
            raw = await self.bus.guard(self.bus.js.get_last_msg(stream, subject))
        except NotFoundError:
            return None
        return codec.decode(raw.data or b"", kind)

    async def status(self, request_id: str) -> RequestStatusView | None:
        """The request's public view; ``queued`` for one submitted whose view the aggregator has not
        written yet; None for a request nobody submitted (or one forgotten after record_max_age_s)."""
        bus = self.bus
        kv = await bus.guard(bus.kv(bus.subjects.kv_status))
        try:
            entry = await bus.guard(kv.get(request_id))
        except KeyNotFoundError:
            entry = None
        if entry is not None and entry.value:
            return RequestStatusView.model_validate_json(entry.value)
        store = await bus.guard(bus.submitter_artifacts())
        try:
            submitted = await bus.guard(store.stat(f"{request_id}/{SUBMITTED_MARKER}"))
        except ValueError:  # not a request id that submit could have made (UnsafePath)
            return None
        return RequestStatusView(request_id=request_id, status="queued") if submitted is not None else None

    async def compare(self, first: str, second: str, *, level: float = 0.95) -> RequestComparison:
        """The paired comparison of two requests on their shared validation items (``first`` minus
        ``second``; ``.summary`` says it in words, ``.paired`` has the interval and p-value). Raises
        ``ftbus.compare.NotComparable`` saying why when they cannot be compared (no verdict or no
        per-item outcomes yet, different benchmarks, runs per item or items). Blocking:
        ``Client().run(lambda c: c.compare(a, b))``."""
        from ftbus.compare import compare_requests

        return await compare_requests(self, first, second, level=level)

    async def cancel(self, request_id: str, reason: str = "cancelled by user") -> None:
        event = CancelRequested(request_id=request_id, reason=reason)
        await self.bus.guard(self.bus.publish(self.bus.subjects.cancel, event,
                                              msg_id(request_id, "control", "cancel")))

    async def campaign(self, name: str) -> CampaignRecord | None:
        """A campaign as the judge keeps it (None: no candidate of it was judged yet): its incumbent
        (``.incumbent``, the accepted request that is currently best), the incumbents in order
        (``.incumbents``), every judged candidate with its comparison (``.history``) and the online
        procedure's state (``.state``: tests made, the next level). Blocking:
        ``Client().run(lambda c: c.campaign(name))``."""
        if not re.fullmatch(CAMPAIGN_NAME, name):
            raise ValueError(f"{name!r}: {CAMPAIGN_NAME_RULE}")
        return await self.bus.guard(CampaignStore(self.bus).get(name))

    async def requests(self, status: RequestStatus | Iterable[str] | None = None) -> list[RequestStatusView]:
        """Every request the server remembers (the public status views), oldest first; ``status``
        keeps those in that status (or any of several)."""
        wanted = {status} if isinstance(status, str) else (set(status) if status is not None else None)
        views: list[RequestStatusView] = []
        # One pass over the bucket's latest values: a read per key took a round trip each (5,000
        # requests: bench/ls_cost.py).
        for change in await latest(self.bus.js, self.bus.subjects.kv_status):
            if change.value:
                try:
                    view = RequestStatusView.model_validate_json(change.value)
                except ValidationError:
                    continue  # only the aggregator writes views: left out, as a key deleted meanwhile was
                if wanted is None or view.status in wanted:
                    views.append(view)
        epoch = datetime.min.replace(tzinfo=UTC)
        views.sort(key=lambda v: (v.submitted_at or epoch, v.request_id))
        return views

    async def log(self, request_id: str, stage: str = "train") -> str | None:
        """A stage's log (``data``, ``train``, ``bench``, ``baseline``), or None when it does not
        exist (yet): stages upload their log when they finish."""
        if stage not in LOG_FILES:
            raise ValueError(f"unknown log {stage!r}: one of {', '.join(LOG_FILES)}")
        store = await self.bus.artifacts()
        ref = await store.stat(f"{request_id}/logs/{LOG_FILES[stage]}")
        if ref is None:
            return None
        return (await store.get_bytes(ref)).decode("utf-8", errors="replace")

    async def pull(
        self,
        request_id: str,
        to: str | Path | None = None,
        *,
        what: Literal["adapter", "merged"] = "adapter",
        base_model: str | Path | None = None,
        python: str | None = None,
        on_progress: Callable[[str, int, int], None] | None = None,
    ) -> Pulled:
        """Download the request's trained model into ``to`` (default ``./<request_id>``), a folder
        that ``transformers``/``peft`` load as it is: the adapter or full weights, the tokenizer and
        config, ``trainer_state.json`` and the loss history, each checked against its sha256 (a
        mismatch raises PullError naming the file; nothing half-written is left). ``what="merged"``
        merges an adapter into its base model with peft (in ``python``, default the toolchain's)."""
        from ftbus.pull import pull

        return await pull(self, request_id, Path(to) if to is not None else Path(request_id), what=what,
                          base_model=Path(base_model) if base_model is not None else None, python=python,
                          on_progress=on_progress)

    async def follow_log(
        self, request_id: str, stage: str = "train", *, poll_s: float = 1.0
    ) -> AsyncIterator[Progress | str]:
        """Follow a stage: its progress events as they happen, then its log (a ``str``) once the
        stage has uploaded it. Ends after the log, or when the request ends without one."""
        if stage not in LOG_FILES:
            raise ValueError(f"unknown log {stage!r}: one of {', '.join(LOG_FILES)}")

        async def _ended() -> bool:
            view = await self.status(request_id)
            return view is not None and view.status in TERMINAL

        async for item in follow_stage(self.bus, request_id, LOG_STAGE[stage], lambda: self.log(request_id, stage),
                                       _ended, poll_s):
            yield item

    # ------------------------------------------------------------------ blocking calls

    def evaluate(
        self,
        workspace: str | Path,
        *,
        base_model: str,
        benchmark: str,
        description: str = "",
        datasets: Sequence[str] = (),
        timeouts: Timeouts | None = None,
        timeout_s: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        campaign: str | None = None,
    ) -> Verdict:
        """Submit a workspace, block until its verdict, return it. For scripts and notebooks."""
        return self.run(lambda c: c.aevaluate(
            workspace, base_model=base_model, benchmark=benchmark, description=description, datasets=datasets,
            timeouts=timeouts, timeout_s=timeout_s, on_progress=on_progress, campaign=campaign,
        ))

    def evaluate_many(
        self,
        tasks: Iterable[EvalTask],
        *,
        timeout_s: float | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> list[Verdict]:
        """Submit every task, block until all verdicts are in; verdicts in the order of ``tasks``."""
        task_list = list(tasks)
        return self.run(lambda c: c.aevaluate_many(task_list, timeout_s=timeout_s, on_progress=on_progress))

    def run(self, call: Callable[[Client], Awaitable[T]]) -> T:
        """Run ``call(connected_client)`` to completion on a connection of its own, from blocking code."""

        async def _main() -> T:
            async with Client(settings=self.settings) as client:
                return await call(client)

        return _run_blocking(_main)


def _run_blocking(main: Callable[[], Awaitable[T]]) -> T:
    """asyncio.run, or, when this thread already runs an event loop (Jupyter), a thread that can."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftbus-client") as pool:
        return pool.submit(lambda: asyncio.run(main())).result()  # type: ignore[arg-type]
