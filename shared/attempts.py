"""Which attempts count against a request: the stage worker counts them, not the server
(docs/design.md, §5).

A stage's consumer delivers a message without limit (``max_deliver: -1`` on the server): a
delivery lost to the infrastructure (a worker cut off from its consumer past ``ack_wait_s`` while
its handler went on, a redelivery that met a live attempt, one that never reached a handler) must
not use up a candidate's attempts. The worker keeps one record per (request, stage) in the stage's
own results bucket, key ``<request_id>.<stage>.attempts``, written with compare-and-set:

- ``holder``: the handling running now (worker and delivery), and ``beat_at``, when it last said
  so (its heartbeat writes it, every ``heartbeat_s``, by its own clock);
- ``failed``: handlings whose handler raised (an infrastructure error);
- ``lost``: holders that went silent (no beat for ``ack_wait_s / 2``) and were taken over: a worker
  that died during the handling. A holder that was only cut off (a partition) and beats again, or
  ends, takes itself off this list: it was alive.
- ``started``: handlings that began, whatever became of them. A handling's number (its
  ``attempt`` in progress, results and the request's record) is this count, so deliveries that never
  reached a handler (a fetch that expired as the server sent the message) or met a live attempt
  take no number, and a request given up after ``max_deliver`` failures shows ``max_deliver``
  attempts, not the server's delivery count;
- ``unavailable``: handlings that met an unavailable NATS server (:data:`shared.retry.TRANSIENT`:
  a leader election, a partition). They do not count against the candidate, but they are not
  free either: after ``UNAVAILABLE_PER_ATTEMPT × max_deliver`` of them (with the backoff's 60 s
  between tries, about 50 minutes of an unavailable server at the defaults) the request is
  dead-lettered, saying the server was unavailable. Without that limit, a handler that always
  meets a timeout would be retried for ever: each retry's progress keeps the record fresh, so the
  sweeper would not end it.

Before a handler runs, :meth:`AttemptLimit.claim` creates the record holding the handling (a
request's first handling at the stage); where one exists, it reads it: a live holder elsewhere makes
this delivery wait (naked for ``ack_wait_s``: the same request never runs twice at once while its
first attempt is heard from); a silent one is counted lost and taken over; once ``failed + lost``
reaches ``max_deliver`` the worker publishes the dead letter (the aggregator turns it into the
error verdict naming the stage) and terminates the message.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from pydantic import BaseModel, ConfigDict, Field

from shared.events import DeadLetter
from shared.handling import StageContext
from shared.logs import get_logger
from shared.policies import Policy
from shared.retry import TRANSIENT, retry_transient

if TYPE_CHECKING:
    from shared.runtime import StageWorker

log = get_logger("ftbus.attempts")

#: Compare-and-set tries of one claim before the delivery is left to come back.
CLAIM_TRIES = 5
#: Handlings that met an unavailable NATS server, per ``max_deliver``, before the request is
#: dead-lettered: an outage is forgiven ten times longer than a candidate's own failure.
UNAVAILABLE_PER_ATTEMPT = 10


class Attempts(BaseModel):
    """The attempts record of one (request, stage)."""

    model_config = ConfigDict(extra="forbid")

    holder: str | None = None
    beat_at: float = 0.0
    failed: int = 0
    lost: list[str] = Field(default_factory=list)
    unavailable: int = 0
    last_error: str = ""
    #: Handlings that began (claims won), whatever became of them: the next one's number is this + 1.
    started: int = 0

    @property
    def counted(self) -> int:
        """The attempts that count against the request."""
        return self.failed + len(self.lost)


def attempts_key(request_id: str, stage: str) -> str:
    return f"{request_id}.{stage}.attempts"


class AttemptLimit(Policy):
    """Counts a request's real attempts at this stage, and gives up after ``max_deliver`` of them.
    Every stage worker has it (shared/stagespec.py); the aggregator's consumers leave the count to
    the server."""

    counts_attempts = True

    def __init__(self) -> None:
        #: This process's name in the records: host, pid and a random tail (a pid is reused).
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        #: request id -> this worker's holder name of the handling it runs, and that handling's number.
        self._held: dict[str, tuple[str, int]] = {}
        self._bucket = ""

    # ------------------------------------------------------------------ the Policy hooks

    async def start(self, worker: StageWorker) -> None:
        self._bucket = worker.bus.subjects.kv_stage_results(worker.stage)

    async def claim(self, worker: StageWorker, msg: Msg, request_id: str, deliveries: int) -> bool:
        """True: this worker holds the request's attempt, the handler runs. False: the message is
        taken care of here (naked while another attempt lives, or dead-lettered and terminated)."""
        kv = await worker.bus.kv(self._bucket)
        key = attempts_key(request_id, worker.stage)
        settings = worker.bus.settings
        me = f"{self.worker_id}#{deliveries}"
        # Most handlings are a request's first at this stage: the first try creates the record (one
        # round trip, no read); where one exists, that create fails and each later try reads it.
        record, revision = Attempts(), None
        for tries in range(CLAIM_TRIES + 1):
            if tries:
                record, revision = await _read(kv, key)
            if record.holder is not None:
                age = time.time() - record.beat_at
                if age < settings.ack_wait_s / 2:
                    log.info("another attempt is running, this delivery waits", holder=record.holder,
                             beat_age_s=round(age, 1), delivery=deliveries)
                    await msg.nak(delay=settings.ack_wait_s)
                    return False
                log.warning("the running attempt went silent: counted as lost, taken over",
                            holder=record.holder, beat_age_s=round(age, 1), delivery=deliveries)
                record.lost.append(record.holder)
                record.holder = None
            if record.counted >= settings.max_deliver or (
                    record.unavailable >= UNAVAILABLE_PER_ATTEMPT * settings.max_deliver):
                await self._give_up(worker, msg, request_id, record)
                return False
            record.holder, record.beat_at = me, time.time()
            record.started += 1
            if await _write(kv, key, record, revision):
                self._held[request_id] = (me, record.started)
                return True
        log.warning("the attempts record kept changing, the delivery comes back later", delivery=deliveries)
        await msg.nak(delay=settings.ack_wait_s)
        return False

    def attempt(self, request_id: str) -> int | None:
        """The number of the handling this worker holds: deliveries that never reached a handler
        (a fetch that expired as the server sent it) or met a live attempt take none."""
        held = self._held.get(request_id)
        return held[1] if held is not None else None

    async def beat(self, worker: StageWorker, request_id: str) -> None:
        """The holder says it lives; a holder taken over while it was cut off takes itself off
        ``lost`` (a partition is not a death). A lost compare-and-set waits for the next beat."""
        held = self._held.get(request_id)
        if held is None:
            return
        me = held[0]
        kv = await worker.bus.kv(self._bucket)
        key = attempts_key(request_id, worker.stage)
        record, revision = await _read(kv, key)
        if record.holder == me:
            record.beat_at = time.time()
        elif me in record.lost:
            log.warning("this attempt was taken over while this worker was cut off; it is alive, so it "
                        "does not count", holder=record.holder)
            record.lost.remove(me)
        else:
            return
        await _write(kv, key, record, revision)

    async def retrying(self, ctx: StageContext, exc: Exception) -> None:
        """The handler raised: one attempt counted, unless the NATS server itself was unavailable
        (a leader election, a partition: :data:`shared.retry.TRANSIENT`), which is the
        infrastructure's loss, not the candidate's: it is counted in ``unavailable``, which has a
        limit of its own (:data:`UNAVAILABLE_PER_ATTEMPT` × ``max_deliver``)."""
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TRANSIENT):
            log.warning("the NATS server was unavailable: this attempt does not count against the candidate",
                        error=error)
            await self._release(ctx, unavailable=True, error=error)
            return
        await self._release(ctx, failed=True, error=error)

    async def finished(self, ctx: StageContext, outgoing: list[Any]) -> None:
        """The results are out and the message acked."""
        await self._release(ctx)

    async def abandoned(self, ctx: StageContext) -> None:
        """Cancelled by request, or this worker stops: not counted, the next delivery runs at once."""
        await self._release(ctx)

    # ------------------------------------------------------------------ helpers

    async def _release(self, ctx: StageContext, *, failed: bool = False, unavailable: bool = False,
                       error: str = "") -> None:
        """Clear this worker's hold and count how the handling ended. An unavailable server (most
        likely just when the handler met one) is waited out for up to ``ack_wait_s / 2``: a hold
        left behind would be counted lost by the next delivery, against the candidate."""
        held = self._held.pop(ctx.request_id, None)
        if held is None:
            return
        me = held[0]
        kv = await ctx.bus.kv(self._bucket)
        key = attempts_key(ctx.request_id, ctx.stage)
        tries = 0

        async def write() -> bool:
            nonlocal tries
            tries += 1
            record, revision = await _read(kv, key)
            if tries > 1 and record.holder != me and me not in record.lost:
                return True  # a try whose answer was lost had written it
            if me in record.lost:  # taken over while cut off: it ended, so it was alive
                record.lost.remove(me)
            if record.holder == me:
                record.holder = None
            if failed:
                record.failed += 1
            if unavailable:
                record.unavailable += 1
            if error:
                record.last_error = error[:500]
            return await _write(kv, key, record, revision)

        try:
            for _ in range(CLAIM_TRIES):
                if await retry_transient(write, "release the attempts record",
                                         deadline_s=ctx.bus.settings.ack_wait_s / 2):
                    return
            log.warning("the attempts record kept changing: this hold is left to be counted lost")
        except Exception as exc:  # the holder goes silent instead: the next delivery counts it lost
            log.warning("the attempts record could not be updated", error=f"{type(exc).__name__}: {exc}")

    async def _give_up(self, worker: StageWorker, msg: Msg, request_id: str, record: Attempts) -> None:
        stage, settings = worker.stage, worker.bus.settings
        if record.counted >= settings.max_deliver:
            reason = (f"the {stage} stage failed {record.counted} times (max_deliver {settings.max_deliver}): "
                      f"{record.failed} raised, {len(record.lost)} workers lost during it; last error: "
                      f"{record.last_error or 'none recorded'}; the errors are in that stage's worker logs")
        else:
            reason = (f"the NATS server was unavailable to the {stage} stage {record.unavailable} times "
                      f"({UNAVAILABLE_PER_ATTEMPT} × max_deliver {settings.max_deliver}); not the candidate's "
                      f"failure: check the cluster (`nats server report jetstream`) and submit it again; "
                      f"last error: {record.last_error or 'none recorded'}")
        log.error("attempts used up, dead-lettering", reason=reason)
        seq = msg.metadata.sequence.stream if msg.metadata else 0
        letter = DeadLetter(request_id=request_id, original_subject=msg.subject, stage=stage, reason=reason,
                            payload=bytes(msg.data[:65536]), deliveries=record.counted + record.unavailable)
        # The id a MAX_DELIVERIES advisory of the same message would give it: one letter.
        await worker.bus.publish(worker.bus.subjects.dlq, letter, f"dlq:{worker.stream}:{seq}:{worker.durable}")
        await msg.term()


async def _read(kv: Any, key: str) -> tuple[Attempts, int | None]:
    """The record and its revision; a new record and None when there is none."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return Attempts(), None
    if not entry.value:
        return Attempts(), entry.revision
    return Attempts.model_validate_json(entry.value), entry.revision


async def _write(kv: Any, key: str, record: Attempts, revision: int | None) -> bool:
    """Compare-and-set; False when another writer came first."""
    value = record.model_dump_json().encode()
    try:
        if revision is None:
            await kv.create(key, value)
        else:
            await kv.update(key, value, last=revision)
    except KeyWrongLastSequenceError:
        return False
    return True
