"""Connection to NATS, and idempotent creation of the streams, buckets and durable consumers.

Everything here is safe to call from every process at start-up, concurrently: the first one
creates, the others find what it created.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from shared import codec
from shared.artifacts import ArtifactStore, FilesystemArtifacts, ObjectStoreArtifacts
from shared.events import Stage
from shared.logs import get_logger
from shared.settings import Settings
from shared.subjects import Subjects

log = get_logger("ftbus.bus")


class NotConnected(RuntimeError):
    pass


class Bus:
    """One NATS connection with JetStream, the subject names and the shared buckets."""

    def __init__(self, nc: NatsClient, settings: Settings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self._kv: dict[str, KeyValue] = {}
        self._artifacts: ArtifactStore | None = None
        self._private: ArtifactStore | None = None
        self._cache: ArtifactStore | None = None

    # ------------------------------------------------------------------ connection

    @classmethod
    async def connect(cls, settings: Settings, name: str = "ftbus", url: str | None = None) -> Bus:
        server = url or settings.resolve_nats_url()
        if not server:
            raise NotConnected(
                "no NATS server configured: start one with `ftbus up`, or set FTBUS_NATS_URL / --nats-url"
            )

        async def _error_cb(exc: Exception) -> None:
            log.warning("nats connection error", error=str(exc))

        # A comma-separated list names the members of a cluster.
        servers = [part.strip() for part in server.split(",") if part.strip()]
        try:
            nc = await nats.connect(
                servers,
                name=name,
                # Replies come to this connection's own inbox subjects, so NATS permissions can keep
                # one user from reading another's replies (a report fetched by a dashboard, say).
                inbox_prefix=f"_INBOX.{name}".encode(),
                connect_timeout=5,
                max_reconnect_attempts=-1,
                reconnect_time_wait=1,
                allow_reconnect=True,
                error_cb=_error_cb,
            )
        except Exception as exc:
            raise NotConnected(f"cannot reach NATS at {server}: {exc}. Is `ftbus up` running?") from exc
        return cls(nc, settings)

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        # Flush what we published, then close: drain() waits up to 30 s on idle pull
        # subscriptions, and every worker has already acked or naked its messages by now.
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        await self.nc.close()

    # ------------------------------------------------------------------ topology

    async def ensure_topology(self) -> None:
        s, cfg = self.subjects, self.settings
        common: dict[str, Any] = {
            "storage": api.StorageType.FILE,
            "num_replicas": cfg.stream_replicas,
            "max_age": cfg.event_max_age_s,
            "duplicate_window": cfg.duplicate_window_s,
        }
        await self._ensure_stream(
            api.StreamConfig(
                name=s.stream_events,
                subjects=s.event_stream_subjects(),
                retention=api.RetentionPolicy.LIMITS,
                description="ftbus requests and stage events",
                **common,
            )
        )
        await self._ensure_stream(
            api.StreamConfig(
                name=s.stream_test,
                subjects=[s.bench_test],
                description="hidden test split results: aggregator only",
                **common,
            )
        )
        # One message per subject, and the second one rejected: the server itself enforces
        # "exactly one verdict per request" on top of the aggregator's own bookkeeping.
        for name, subject in ((s.stream_verdicts, s.verdict()), (s.stream_reports, s.report())):
            await self._ensure_stream(
                api.StreamConfig(
                    name=name,
                    subjects=[subject],
                    max_msgs_per_subject=1,
                    discard=api.DiscardPolicy.NEW,
                    discard_new_per_subject=True,
                    **{**common, "max_age": cfg.result_max_age_s},  # retention: results
                )
            )
        await self._ensure_stream(
            api.StreamConfig(name=s.stream_dlq, subjects=[s.dlq], **{**common, "max_age": cfg.result_max_age_s})
        )
        await self._ensure_stream(
            api.StreamConfig(
                name=s.stream_advisories,
                subjects=[
                    s.max_deliveries_advisory(s.stream_events),
                    s.max_deliveries_advisory(s.stream_test),
                ],
                **common,
            )
        )
        await self.kv(s.kv_requests)
        await self.kv(s.kv_status)
        for stage in Stage:
            await self.kv(s.kv_stage_results(stage))
        await self.artifacts()
        await self.cache_artifacts()
        await self.private_artifacts()

    async def _ensure_stream(self, config: api.StreamConfig) -> None:
        assert config.name
        try:
            info = await self.js.stream_info(config.name)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
                return
            except BadRequestError:
                # Another process created it between our lookup and our add: fall through to update.
                info = await self.js.stream_info(config.name)
        # A changed retention setting applies to a stream that exists already, too.
        if info.config.subjects != config.subjects or abs((info.config.max_age or 0) - (config.max_age or 0)) > 1:
            await self.js.update_stream(config)

    async def kv(self, bucket: str) -> KeyValue:
        if bucket in self._kv:
            return self._kv[bucket]
        try:
            kv = await self.js.key_value(bucket)
        except Exception:
            try:
                kv = await self.js.create_key_value(
                    bucket=bucket,
                    history=1,
                    storage=api.StorageType.FILE,
                    replicas=self.settings.stream_replicas,
                    ttl=self.settings.record_max_age_s,  # retention: records
                )
            except BadRequestError:
                kv = await self.js.key_value(bucket)
        self._kv[bucket] = kv
        return kv

    async def artifacts(self) -> ArtifactStore:
        if self._artifacts is None:
            self._artifacts = await self._open_store(
                self.subjects.object_store, "ftbus artifacts: workspaces, data, training outputs, logs"
            )
        return self._artifacts

    async def cache_artifacts(self) -> ArtifactStore:
        if self._cache is None:
            self._cache = await self._open_store(
                self.subjects.object_store_cache, "ftbus caches: data and validation baselines (workers only)",
                ttl=self.settings.cache_max_age_s,
            )
        return self._cache

    async def private_artifacts(self) -> ArtifactStore:
        if self._private is None:
            self._private = await self._open_store(
                self.subjects.object_store_private,
                "ftbus hidden test split: logs and baselines (bench writes; aggregator, dashboards read)",
            )
        return self._private

    async def _open_store(self, bucket: str, description: str, ttl: float | None = None) -> ArtifactStore:
        cfg = self.settings
        if cfg.artifact_store == "filesystem":
            if cfg.artifact_dir is None:
                raise ValueError("artifact_store is 'filesystem' but artifact_dir is not set (FTBUS_ARTIFACT_DIR)")
            return FilesystemArtifacts(cfg.artifact_dir / bucket)
        return await ObjectStoreArtifacts.open(
            self.js, bucket, replicas=cfg.stream_replicas, description=description,
            ttl=ttl or cfg.artifact_max_age_s,  # retention: artifacts
        )

    async def ensure_consumer(
        self, stream: str, durable: str, filters: list[str], *, ack_wait: float | None = None
    ) -> None:
        cfg = self.settings
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait or cfg.ack_wait_s,
            max_deliver=cfg.max_deliver,
            max_ack_pending=1000,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        if len(filters) == 1:
            config.filter_subject = filters[0]
        else:
            config.filter_subjects = filters
        # The server treats a create with an existing durable name as create-or-update of the
        # editable fields (ack_wait, max_deliver, filters), so every worker may call this.
        await self.js.add_consumer(stream, config)

    # ------------------------------------------------------------------ publishing

    async def publish(
        self, subject: str, event: BaseModel, msg_id: str | None = None, *, retries: int = 5
    ) -> api.PubAck:
        """JetStream publish with de-duplication id, retried while the server is briefly away."""
        payload = codec.encode(event)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        delay = 0.2
        for attempt in range(retries):
            try:
                return await self.js.publish(subject, payload, headers=headers, timeout=10)
            except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError):
                if attempt == retries - 1:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5)
        raise AssertionError("unreachable")

    async def publish_core(self, subject: str, event: BaseModel) -> None:
        """Fire-and-forget publish (progress): lost if nobody listens, which is fine."""
        if self.nc.is_connected:
            await self.nc.publish(subject, codec.encode(event))


