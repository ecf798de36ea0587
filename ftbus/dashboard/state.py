"""The dashboard's NATS side: one read-only connection, named ``dashboard``.

It uses only what the ``dashboard`` user of deploy/nats/accounts.conf may do: watch the full
records (KV ``ftbus_requests``), read the campaigns (KV ``ftbus_campaigns``), subscribe to progress,
read consumer and stream info, read single messages of the report and dead-letter streams, read the
Object Stores. It publishes nothing and
creates nothing (no ``ensure_topology``): a missing bucket is waited for.

Everything the pages show is kept in memory and pushed to the browsers as small notices
(``Hub``); a page then re-reads its JSON. A NATS reconnect (server restart, failover) is noticed
from the client's reconnect counter and restarts the record watch from a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats.errors
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from ftbus.dashboard import views
from ftbus.dashboard.views import STAGE_ORDER
from shared import codec, metrics
from shared.artifacts import ArtifactStore
from shared.bus import Bus
from shared.campaigns import CampaignRecord, CampaignStore
from shared.events import DeadLetter, Progress, Report, Stage, Verdict
from shared.kv_scan import BucketWatch
from shared.lanes import Lane, lanes_listing
from shared.logs import get_logger
from shared.records import RequestRecord
from shared.settings import Settings
from shared.tasks import cancel_until_done

log = get_logger("ftbus.dashboard")

# The dashboard's own connection name: replies come to _INBOX.dashboard.>, the one inbox the
# `dashboard` NATS user may read (deploy/nats/accounts.conf).
CLIENT_NAME = "dashboard"
MAX_DEAD_LETTERS = 500


def redact(url: str) -> str:
    """A NATS URL without its password, fit for a page."""
    parts = []
    for one in url.split(","):
        split = urlsplit(one.strip())
        if split.password:
            host = f"{split.username}:***@{split.hostname}" + (f":{split.port}" if split.port else "")
            split = split._replace(netloc=host)
        parts.append(urlunsplit(split))
    return ",".join(parts)


class Hub:
    """Fans notices out to every open event stream (one queue per browser tab)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[dict[str, Any]]] = set()

    def publish(self, notice: dict[str, Any]) -> None:
        for queue in list(self._queues):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(notice)

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1000)
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)

    @property
    def listeners(self) -> int:
        return len(self._queues)


@dataclass
class DeadLetterRow:
    seq: int
    letter: DeadLetter | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        letter = self.letter
        return {
            "seq": self.seq,
            "request_id": letter.request_id if letter else None,
            "emitted_at": letter.emitted_at.isoformat() if letter else None,
            "original_subject": letter.original_subject if letter else None,
            "stage": letter.stage if letter and letter.stage else None,
            "reason": letter.reason if letter else self.error,
            "deliveries": letter.deliveries if letter else None,
            "payload_bytes": len(letter.payload) if letter else None,
        }


class DashboardState:
    def __init__(self, settings: Settings, url: str | None = None) -> None:
        self.settings = settings
        self.url = url
        self.bus: Bus | None = None
        self.hub = Hub()
        self.records: dict[str, RequestRecord] = {}
        self.live_loss: dict[str, views.LossBuffer] = {}
        self.last_progress: dict[str, Progress] = {}
        self.stages: list[views.StageStats] = []
        self.dead_letters: int | None = None
        self.records_ready = asyncio.Event()
        self._reports: dict[str, Report] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._progress_sub: Any = None
        self._restart_watch = asyncio.Event()
        self._stores: dict[str, ArtifactStore] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.bus = await Bus.connect(self.settings, name=CLIENT_NAME, url=self.url)
        s = self.bus.subjects
        # Core subscription: nats-py re-subscribes it by itself after a reconnect.
        self._progress_sub = await self.bus.nc.subscribe(s.progress(), cb=self._on_progress)
        self._tasks = [
            asyncio.create_task(self._watch_records(), name="dashboard-records"),
            asyncio.create_task(self._poll(), name="dashboard-poll"),
            asyncio.create_task(self._supervise(), name="dashboard-connection"),
        ]

    async def stop(self) -> None:
        await cancel_until_done(self._tasks)
        self._tasks = []
        if self._progress_sub is not None:
            with contextlib.suppress(Exception):
                await self._progress_sub.unsubscribe()
        if self.bus is not None:
            await self.bus.close()

    def connection(self) -> dict[str, Any]:
        nc = self.bus.nc if self.bus else None
        return {
            "connected": bool(nc and nc.is_connected),
            "reconnects": int(nc.stats["reconnects"]) if nc else 0,
            "url": redact(str(nc.connected_url.geturl())) if nc and nc.connected_url else None,
            "client_name": CLIENT_NAME,
        }

    # ------------------------------------------------------------------ records

    async def _watch_records(self) -> None:
        """Follow KV ftbus_requests: a snapshot of every record, then each change as it happens."""
        assert self.bus is not None
        bucket = self.bus.subjects.kv_requests
        failures = 0
        while True:
            self._restart_watch.clear()
            try:
                await self.bus.js.key_value(bucket)  # raises until the bucket exists
                async with BucketWatch(self.bus.js, bucket) as watch:
                    seen: set[str] = set()
                    initial = True
                    while not self._restart_watch.is_set():
                        try:
                            change = await watch.next(timeout_s=1.0)
                        except nats.errors.TimeoutError:
                            continue  # nothing changed this second: look at _restart_watch again
                        if change is None:  # the snapshot is complete
                            if initial:
                                for gone in set(self.records) - seen:
                                    self.records.pop(gone, None)
                                initial = False
                                self.records_ready.set()
                                self.hub.publish({"type": "records", "request_id": None})
                            continue
                        seen.add(change.key)
                        self._apply(change.key, change.value, change.operation)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Say it once per outage (a bucket not created yet, a server away), not every second.
                failures += 1
                report = log.warning if failures in (1, 60) else log.debug
                report("record watch interrupted; restarting", error=f"{type(exc).__name__}: {exc}",
                       bucket=bucket, attempts=failures)
                await asyncio.sleep(1.0)
            else:
                failures = 0

    def _apply(self, key: str, value: bytes | None, operation: str | None) -> None:
        if operation in ("DEL", "PURGE") or not value:
            self.records.pop(key, None)
        else:
            try:
                record = RequestRecord.model_validate_json(value)
            except Exception as exc:
                log.warning("unreadable record", request_id=key, error=str(exc))
                return
            self.records[key] = record
            if record.terminal:
                self.last_progress.pop(key, None)
                if _has_history(record):
                    self.live_loss.pop(key, None)  # the complete history replaces the live points
        self.hub.publish({"type": "records", "request_id": key})

    async def _on_progress(self, msg: Any) -> None:
        try:
            event = codec.decode(msg.data, Progress)
        except codec.CodecError:
            return
        record = self.records.get(event.request_id)
        if record is not None and record.terminal:
            return  # a late event of a finished request
        self.last_progress[event.request_id] = event
        if event.stage == Stage.train:
            self.live_loss.setdefault(event.request_id, views.LossBuffer()).add(event)
        self.hub.publish({
            "type": "progress",
            "request_id": event.request_id,
            "stage": event.stage,
            "state": event.state,
            "step": event.step,
            "total": event.total,
            "loss": event.loss,
        })

    # ------------------------------------------------------------------ consumer state, dead letters

    async def _poll(self) -> None:
        while True:
            try:
                await self.refresh_stats()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("stats poll failed", error=str(exc))
            await asyncio.sleep(self.settings.dashboard_poll_s)

    async def _lanes(self, stage: str) -> list[Lane] | None:
        """A fair-share stage's lanes (shared/lanes.py), where its requests wait; None: it has none."""
        assert self.bus is not None
        try:
            lanes = await lanes_listing(self.bus.js, self.bus.subjects, stage)
        except NotFoundError:
            return None
        metrics.lanes_seen(stage, sum(lane.waiting for lane in lanes), sum(lane.working for lane in lanes))
        return lanes

    async def refresh_stats(self) -> None:
        assert self.bus is not None
        s = self.bus.subjects
        stats: list[views.StageStats] = []
        for stage in STAGE_ORDER:
            durable = s.durable(stage)
            try:
                info = await self.bus.js.consumer_info(s.stream_events, durable, timeout=5)
                stats.append(views.stage_stats_from_info(stage, durable, info, await self._lanes(stage)))
                metrics.queue_seen(stage, durable, info)  # read here also when a stage has no worker
            except NotFoundError:
                stats.append(views.StageStats(stage, durable, error="no worker has started yet"))
            except Exception as exc:
                stats.append(views.StageStats(stage, durable, error=f"{type(exc).__name__}"))
        try:
            dlq = (await self.bus.js.stream_info(s.stream_dlq)).state.messages
            metrics.DEAD_LETTERS_STORED.set(dlq)
        except Exception:
            dlq = None
        changed = [x.to_json() for x in stats] != [x.to_json() for x in self.stages] or dlq != self.dead_letters
        self.stages, self.dead_letters = stats, dlq
        if changed:
            self.hub.publish({"type": "stages"})

    async def dead_letter_rows(self) -> list[DeadLetterRow]:
        assert self.bus is not None
        stream = self.bus.subjects.stream_dlq
        info = await self.bus.js.stream_info(stream)
        first, last = info.state.first_seq, info.state.last_seq
        rows: list[DeadLetterRow] = []
        for seq in range(last, max(first, last - MAX_DEAD_LETTERS + 1) - 1, -1):
            if seq <= 0:
                break
            try:
                raw = await self.bus.js.get_msg(stream, seq=seq)
            except NotFoundError:
                continue
            try:
                rows.append(DeadLetterRow(seq, codec.decode(raw.data or b"", DeadLetter)))
            except codec.CodecError as exc:
                rows.append(DeadLetterRow(seq, None, f"unreadable dead letter: {exc.reason}"))
        return rows

    async def _supervise(self) -> None:
        """Tell the pages about the connection; after a reconnect, re-read everything."""
        assert self.bus is not None
        last = self.connection()
        while True:
            await asyncio.sleep(0.5)
            now = self.connection()
            if now["reconnects"] != last["reconnects"] and now["connected"]:
                log.info("reconnected to NATS: re-reading the records", reconnects=now["reconnects"])
                self._restart_watch.set()
                self._reports.clear()
                with contextlib.suppress(Exception):
                    await self.refresh_stats()
            if now != last:
                self.hub.publish({"type": "connection", **now})
            last = now

    # ------------------------------------------------------------------ one request

    async def report(self, request_id: str) -> Report | None:
        """The report, read from FTBUS_REPORTS as `ftbus get --report` does (it never changes)."""
        if request_id in self._reports:
            return self._reports[request_id]
        assert self.bus is not None
        s = self.bus.subjects
        try:
            raw = await self.bus.js.get_last_msg(s.stream_reports, s.report(request_id))
        except NotFoundError:
            return None
        report = codec.decode(raw.data or b"", Report)
        self._reports[request_id] = report
        return report

    async def verdict(self, request_id: str) -> Verdict | None:
        assert self.bus is not None
        s = self.bus.subjects
        try:
            raw = await self.bus.js.get_last_msg(s.stream_verdicts, s.verdict(request_id))
        except NotFoundError:
            return None
        return codec.decode(raw.data or b"", Verdict)

    async def store(self, which: str) -> ArtifactStore:
        if which not in self._stores:
            assert self.bus is not None
            self._stores[which] = await (self.bus.private_artifacts() if which == "private" else self.bus.artifacts())
        return self._stores[which]

    async def logs(self, request_id: str) -> list[dict[str, Any]]:
        found = []
        for name, which in views.LOG_FILES:
            try:
                ref = await (await self.store(which)).stat(f"{request_id}/logs/{name}")
            except Exception:
                ref = None
            if ref is not None:
                found.append({"name": name, "size": ref.size, "hidden_test": which == "private",
                              "url": f"/requests/{request_id}/logs/{name}"})
        return found

    async def read_log(self, request_id: str, name: str) -> bytes | None:
        which = dict(views.LOG_FILES).get(name)
        if which is None:
            return None
        store = await self.store(which)
        ref = await store.stat(f"{request_id}/logs/{name}")
        if ref is None:
            return None
        return await store.get_bytes(ref)

    async def request_detail(self, request_id: str) -> dict[str, Any] | None:
        record = self.records.get(request_id)
        if record is None:
            return None
        report = await self.report(request_id) if record.terminal else None
        verdict = None if report else (await self.verdict(request_id) if record.terminal else None)
        return views.request_detail(
            record, live=self.live_loss.get(request_id), seen=self.last_progress.get(request_id),
            verdict=verdict, report=report,
            logs=await self.logs(request_id),
        )

    # ------------------------------------------------------------------ campaigns

    async def campaigns(self) -> list[CampaignRecord]:
        """Every campaign, read when a page asks (shared/campaigns.py: ``CampaignStore.records``)."""
        assert self.bus is not None
        return await CampaignStore(self.bus).records()

    async def campaign(self, name: str) -> CampaignRecord | None:
        """One campaign (None: unknown). Read directly, not by ``CampaignStore``, whose ``Bus.kv`` would
        create a missing bucket: the dashboard creates nothing."""
        assert self.bus is not None
        try:
            kv = await self.bus.js.key_value(self.bus.subjects.kv_campaigns)
            entry = await kv.get(name)
        except (BucketNotFoundError, KeyNotFoundError):
            return None
        return CampaignRecord.model_validate_json(entry.value) if entry.value else None

    def overview(self) -> dict[str, Any]:
        return views.overview(self.records.values(), self.stages, self.dead_letters, self.connection(),
                              datetime.now(UTC), seen=self.last_progress)


def _has_history(record: RequestRecord) -> bool:
    result = views.verdict_result(record)
    return bool(result and result.training_metrics.loss_history.train)
