"""Connection to NATS, and idempotent creation of the streams, buckets and durable consumers.

Everything here is safe to call from every process at start-up, concurrently: the first one
creates, the others find what it created.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, BucketNotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from shared import codec
from shared.artifacts import ArtifactStore
from shared.denials import PermissionDenied, SubjectMemoryClient, parse_permission_error
from shared.events import Stage
from shared.fs_artifacts import FilesystemArtifacts
from shared.logs import get_logger
from shared.object_artifacts import ObjectStoreArtifacts
from shared.settings import Settings
from shared.streams import ensure_stream, stream_configs
from shared.subjects import Subjects

log = get_logger("ftbus.bus")


class NotConnected(RuntimeError):
    """No connection to NATS: none configured, or the first connection failed. ``url`` and
    ``reason`` (the last error, in words) are set when a server was tried."""

    def __init__(self, message: str, *, url: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason


def _connect_reason(exc: BaseException) -> str:
    """A failed connection attempt in words: nats-py's errors often have an empty str()."""
    text = str(exc).strip()
    if isinstance(exc, ConnectionRefusedError) or "Connection refused" in text or "Connect call failed" in text:
        return "connection refused (nothing listens there)"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "the connection timed out"
    if isinstance(exc, nats.errors.NoServersError):
        return "no server answered"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return text or type(exc).__name__


T = TypeVar("T")


#: A publish that may not have reached a stream (the server briefly away): safe to send again.
_RETRYABLE_PUBLISH = (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)


#: The artifacts store's description (a stream's description is shown by `nats stream info`).
ARTIFACTS_DESCRIPTION = "ftbus artifacts: workspaces, data, training outputs, logs"


class Bus:
    """One NATS connection with JetStream, the subject names and the shared buckets."""

    def __init__(self, nc: NatsClient, settings: Settings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self._kv: dict[str, KeyValue] = {}
        self._stores: dict[tuple[str, bool], ArtifactStore] = {}  # (bucket, submitter): opened once
        # guard(): operations waiting to hear of a permission violation
        self._denial_waiters: set[asyncio.Future[PermissionDenied]] = set()

    # ------------------------------------------------------------------ connection

    @classmethod
    async def connect(cls, settings: Settings, name: str = "ftbus", url: str | None = None, *,
                      first_connect_s: float | None = None) -> Bus:
        """Connect; once connected, reconnect without limit (a server restart, a failover).

        ``first_connect_s``: how long the *first* connection is tried before :class:`NotConnected`
        (the CLI and the Python client: setting ``connect_budget_s``); None or 0: tried without limit,
        as services do (they start before their server, or during a cluster's restart), with a
        warning on each failed attempt. With a budget the failed attempts are not logged: the
        NotConnected raised at the end says why."""
        server = url or settings.resolve_nats_url()
        if not server:
            raise NotConnected(
                "no NATS server configured: start one with `ftbus up`, or set FTBUS_NATS_URL / --nats-url"
            )

        owner: list[Bus] = []
        first: dict[str, Any] = {"connecting": bool(first_connect_s), "error": None}

        async def _error_cb(exc: Exception) -> None:
            denied = owner[0].permission_error(exc) if owner else None
            if denied is not None:
                log.error("permission denied", subject=denied.subject, operation=denied.operation, user_name=name)
                return
            if first["connecting"]:
                first["error"] = exc  # said once, in the NotConnected below
                return
            log.warning("nats connection error", error=str(exc))

        # A comma-separated list names the members of a cluster.
        servers = [part.strip() for part in server.split(",") if part.strip()]
        nc = SubjectMemoryClient()
        connecting = nc.connect(
            servers,
            name=name,
            # Replies come to this connection's own inbox subjects, so NATS permissions can keep
            # one user from reading another's replies (a report fetched by a dashboard, say).
            inbox_prefix=f"_INBOX.{name}".encode(),
            connect_timeout=max(1, min(5, round(first_connect_s))) if first_connect_s else 5,
            max_reconnect_attempts=-1,
            reconnect_time_wait=min(1.0, first_connect_s / 5) if first_connect_s else 1,
            allow_reconnect=True,
            error_cb=_error_cb,
        )
        try:
            if first_connect_s:
                await asyncio.wait_for(connecting, first_connect_s)
            else:
                await connecting
        except Exception as exc:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(nc.close(), 2)
            cause = first["error"] or exc
            reason = _connect_reason(cause)
            if isinstance(exc, TimeoutError) and first_connect_s:
                reason = f"{reason}, tried for {first_connect_s:g} s" if first["error"] else \
                    f"no answer in {first_connect_s:g} s"
            raise NotConnected(f"cannot reach NATS at {server}: {reason}. Is `ftbus up` running?",
                               url=server, reason=reason) from exc
        finally:
            first["connecting"] = False
        bus = cls(nc, settings)
        owner.append(bus)
        return bus

    # ------------------------------------------------------------------ permissions

    def permission_error(self, exc: BaseException) -> PermissionDenied | None:
        """If ``exc`` is the server refusing a publish or subscription: wake every guard() and
        return it (as a PermissionDenied)."""
        denied = parse_permission_error(str(exc), getattr(self.nc, "recent_subjects", None))
        if denied is not None:
            for waiter in list(self._denial_waiters):
                if not waiter.done():
                    waiter.set_result(denied)
        return denied

    async def guard(self, operation: Awaitable[T]) -> T:
        """Run ``operation``; if the server refuses a publish or subscription meanwhile, cancel it
        and raise PermissionDenied at once (a refused request otherwise ends in a bare timeout, and
        a refused subscription waits forever). A flush is :meth:`flush`, never guarded here."""
        task = asyncio.ensure_future(operation)
        waiter: asyncio.Future[PermissionDenied] = asyncio.get_running_loop().create_future()
        self._denial_waiters.add(waiter)
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            # A refusal wins over a result: the server answers a PING only after its -ERR, so a
            # publish followed by flush() completes just after the refusal arrived.
            if not waiter.done():
                return task.result()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise waiter.result()
        finally:
            self._denial_waiters.discard(waiter)
            waiter.cancel()
            if not task.done():
                task.cancel()

    async def flush(self) -> None:
        """Wait until the server has read everything this connection sent; PermissionDenied if it
        refused any of it (the server answers the PING only after its -ERR).

        Use this, never ``guard(nc.flush())``: nats-py 2.16 kills its read loop when the PONG of a
        flush that was cancelled arrives (guard() cancels on a refusal), and the connection hangs
        (docs/dependencies.md, "nats-py"). Under the shield the PING's own wait is never cancelled:
        it ends with its PONG, whoever stopped waiting for it."""
        await self.guard(asyncio.shield(self.nc.flush()))

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        # Flush what we published, then close: drain() waits up to 30 s on idle pull
        # subscriptions, and every worker has already acked or naked its messages by now. A late
        # PONG after the timeout meets a connection that is closing anyway.
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        await self.nc.close()

    # ------------------------------------------------------------------ topology

    async def ensure_topology(self, stages: Sequence[str] | None = None,
                              fair_share: Sequence[str] | None = None) -> None:
        """Create or update every stream, bucket and store. ``stages``: the pipeline's stage names,
        whose results the events stream holds (None: ftbus's own, shared.events.Stage);
        ``fair_share``: its stages with lanes (None: ftbus's own among them)."""
        s = self.subjects
        for config in stream_configs(s, self.settings, stages, fair_share):
            await ensure_stream(self.js, config)
        await self.kv(s.kv_requests)
        await self.kv(s.kv_status)
        await self.kv(s.kv_campaigns)
        await self.kv(s.kv_owners)
        for stage in Stage if stages is None else stages:
            await self.kv(s.kv_stage_results(stage))
        await self.artifacts()
        await self.cache_artifacts()
        await self.private_artifacts()
        await self.models_artifacts()
        await self.checkpoint_artifacts()

    async def kv(self, bucket: str) -> KeyValue:
        if bucket in self._kv:
            return self._kv[bucket]
        try:
            kv = await self.js.key_value(bucket)
        except BucketNotFoundError:  # only a missing bucket is created: a refusal or a timeout is raised
            try:
                kv = await self.js.create_key_value(
                    bucket=bucket,
                    history=1,
                    storage=api.StorageType.FILE,
                    replicas=self.settings.stream_replicas,
                    # Retention: records. An owner's error budget never expires: a budget that did
                    # would let an owner's history start again (shared/owners.py).
                    ttl=None if bucket == self.subjects.kv_owners else self.settings.record_max_age_s,
                )
            except BadRequestError:
                kv = await self.js.key_value(bucket)
        self._kv[bucket] = kv
        return kv

    async def artifacts(self) -> ArtifactStore:
        return await self._open_store(self.subjects.object_store, ARTIFACTS_DESCRIPTION)

    async def submitter_artifacts(self) -> ArtifactStore:
        """The artifacts store as a submitter uploads a workspace to it: writes that read nothing,
        and metadata by direct get (shared/object_artifacts.py), all the ``agent`` NATS user may do."""
        return await self._open_store(self.subjects.object_store, ARTIFACTS_DESCRIPTION, submitter=True)

    async def cache_artifacts(self) -> ArtifactStore:
        return await self._open_store(self.subjects.object_store_cache,
                                      "ftbus caches: data and validation baselines (workers only)",
                                      ttl=self.settings.cache_max_age_s)

    async def private_artifacts(self) -> ArtifactStore:
        return await self._open_store(
            self.subjects.object_store_private,
            "ftbus hidden test split: logs and baselines (bench writes; aggregator, dashboards read)")

    async def models_artifacts(self) -> ArtifactStore:
        """Trained outputs, ``<request_id>/output/...``: train writes, bench and agents read (`ftbus
        pull`). Created with no age limit: the aggregator's retention sweep removes a request's
        outputs ``artifact_max_age_s`` after training unless it leads a leaderboard
        (services/aggregator/retention.py)."""
        return await self._open_store(
            self.subjects.object_store_models,
            "ftbus trained outputs: adapters or weights, tokenizer, trainer state (agents may read)", ttl=0)

    async def checkpoint_artifacts(self) -> ArtifactStore:
        """Training checkpoints (services/trainer/checkpoints.py): resume state of a running
        training, written and read by train only; the trainer removes a request's checkpoints when
        its training ends, the aggregator's retention sweep when the request ends."""
        return await self._open_store(
            self.subjects.object_store_checkpoints,
            "ftbus training checkpoints: resume state (train writes and reads; aggregator removes)")

    async def _open_store(self, bucket: str, description: str, ttl: float | None = None,
                          submitter: bool = False) -> ArtifactStore:
        """The store of ``bucket``, opened (created where missing) on first use."""
        if (bucket, submitter) in self._stores:
            return self._stores[bucket, submitter]
        cfg = self.settings
        store: ArtifactStore
        if cfg.artifact_store == "filesystem":
            if cfg.artifact_dir is None:
                raise ValueError("artifact_store is 'filesystem' but artifact_dir is not set (FTBUS_ARTIFACT_DIR)")
            store = FilesystemArtifacts(cfg.artifact_dir / bucket)
        else:
            store = await ObjectStoreArtifacts.open(
                self.js, bucket, replicas=cfg.stream_replicas, description=description,
                # retention: artifacts (0: none, the models store's sweep expires its objects)
                ttl=(ttl or None) if ttl is not None else cfg.artifact_max_age_s,
                submitter=submitter,
            )
        self._stores[bucket, submitter] = store
        return store

    async def ensure_consumer(
        self, stream: str, durable: str, filters: list[str], *, ack_wait: float | None = None,
        max_deliver: int | None = None, inactive_threshold: float | None = None,
    ) -> None:
        """``max_deliver``: None for the setting's; -1 (unlimited) for a stage's consumer, whose
        workers count the attempts themselves (shared/attempts.py). ``inactive_threshold``: the server
        removes the consumer after that many seconds unused (a fair-share lane's: shared/lanes.py)."""
        cfg = self.settings
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait or cfg.ack_wait_s,
            max_deliver=cfg.max_deliver if max_deliver is None else max_deliver,
            max_ack_pending=1000,
            deliver_policy=api.DeliverPolicy.ALL,
            inactive_threshold=inactive_threshold,
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
        return await self.publish_payload(subject, codec.encode(event), msg_id, retries=retries)

    async def publish_payload(
        self, subject: str, payload: bytes, msg_id: str | None = None, *, retries: int = 5,
        headers: dict[str, str] | None = None,
    ) -> api.PubAck:
        """:meth:`publish` of an event already encoded (``codec.encode``), with ``headers`` besides
        the de-duplication id."""
        headers = {**(headers or {}), **({"Nats-Msg-Id": msg_id} if msg_id else {})} or None
        # The de-duplication id makes a retry safe: a publish that did land is not stored twice.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(_RETRYABLE_PUBLISH),
            stop=stop_after_attempt(retries),
            wait=wait_exponential(multiplier=0.2, max=5),
            reraise=True,
        ):
            with attempt:
                return await self.js.publish(subject, payload, headers=headers, timeout=10)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def publish_core(self, subject: str, event: BaseModel) -> None:
        """Fire-and-forget publish (progress): lost if nobody listens, which is fine."""
        if self.nc.is_connected:
            await self.nc.publish(subject, codec.encode(event))


