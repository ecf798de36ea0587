"""Fair share across campaigns: a GPU stage takes its next request round-robin across campaigns.

A stage whose row says ``fair_share`` (train and bench: shared/stagespec.py), with the
``fair_share`` setting on, does not work through its consumer in arrival order. Its requests wait in
one *lane* per campaign, and each free worker takes the next one from the lane whose turn it is:

- **Intake.** The stage's durable consumer (what its row reads, as every stage's) is read one
  message at a time by every worker of the stage, and each message is copied unchanged onto
  ``<prefix>.lanes.<stage>.<lane>`` in the stage's lanes stream ``<PREFIX>_LANES_<STAGE>`` (part
  of the topology, shared/streams.py), with the de-duplication id ``<stage>:<its sequence in the events stream>``, then
  acked. Its lane is the request's campaign; requests without one share the lane ``_none``. A
  worker that dies between the copy and the ack leaves the message to be copied again, and the
  server drops the copy.
- **Lanes.** One durable pull consumer per stage and lane (``<prefix>-<stage>-lane-<lane>``),
  created by the intake and removed by the server after :data:`LANE_IDLE_S` unused. Within a lane
  the order is the order in which requests reached the stage, and a redelivery (a worker lost or
  stopped) comes before anything new: it keeps its place. A request leaves the stream when its
  worker settles it (ack or term: :class:`LaneMsg` deletes it first), so that one more consumer,
  ``<prefix>-<stage>-lanes`` over every lane and never read, has as its lag exactly the requests
  waiting or in work at the stage: what an autoscaler reads (deploy/k8s-keda), as it reads every
  other stage's own consumer. (A work-queue stream would delete on ack by itself, but allows no
  consumer that overlaps the lanes'.)
- **The pick.** A worker with a free slot lists its stage's lane consumers (one request per 256
  lanes) and takes a message from the first lane in this order: the fewest turns for its weight
  (stride scheduling: each turn adds ``1 / weight``; a lane that has just become busy starts at the
  lowest count among the busy lanes, so an idle lane banks no credit), then the fewest requests in
  work for its weight, then its name. A lane with as many requests in work as its cap
  (``fair_share_caps``) waits.

Each worker counts the turns it gave. A shared count would need a compare-and-set on every pick;
counted per worker, every worker gives each busy lane its share of its own picks, so the stage as a
whole does too, and a worker that starts late counts from the lanes' present state. What it costs,
and the cost at 1,000 campaigns, is in docs/operations.md ("Fair share").

What the server does not say: a lane whose messages are all delivered may hold one whose worker died
(its redelivery is due, but the consumer counts it as in work until a fetch takes it). Such a lane is
tried with a short fetch when its turn comes, at most :data:`MAYBE_TRIES` lanes a pick.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import nats
from nats.aio.msg import Msg

from shared.consumer import FETCH_WAIT_S, UNLIMITED, OnMessage, consume, serve
from shared.events.base import CAMPAIGN_NAME
from shared.logs import get_logger
from shared.retry import retry_transient

log = get_logger("ftbus.lanes")

#: The header of a lane's copy that names the subject its request reached the stage on: what the
#: worker sees as the message's subject (:class:`LaneMsg`), in its logs, dead letters and checks.
ARRIVED_ON = "Ftbus-Arrived-On"
#: The lane of requests that name no campaign (not a campaign name: those start with a letter or digit).
NO_CAMPAIGN = "_none"
#: A lane's consumer unused this long is removed by the server (a lane in use is fetched or acked
#: at least every heartbeat): the lanes listed at each pick are those of about the last day.
LANE_IDLE_S = 24 * 3600.0
#: A lane the server lists as fully in work is tried this long (a redelivery may be due there).
MAYBE_WAIT_S = 0.2
#: At most this many such lanes are tried in one pick.
MAYBE_TRIES = 2
#: A lane with nothing that can be waiting is tried this long anyway: the listing was a moment ago.
SURE_WAIT_S = 1.0

_CAMPAIGN = re.compile(rf"^{CAMPAIGN_NAME}$")


def lane_of(payload: bytes) -> str:
    """The lane of an encoded stage event: its request's campaign (``_none`` without one), read
    without validating the event (its worker does that, and dead-letters what it cannot read)."""
    try:
        campaign = msgpack.unpackb(payload, raw=False)["context"]["task"].get("campaign")
    except Exception:
        return NO_CAMPAIGN
    return campaign if isinstance(campaign, str) and _CAMPAIGN.fullmatch(campaign) else NO_CAMPAIGN


class LaneMsg:
    """A message taken from a lane, as the worker's loop handles it: settling it (ack, term) deletes
    it from the lanes stream first, which also settles it for its lane's consumer; a nak and a
    heartbeat are the message's own. Its subject is the one its request reached the stage on; every
    other attribute is the message's."""

    def __init__(self, msg: Msg, lanes: Lanes) -> None:
        self.msg = msg
        self.lanes = lanes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.msg, name)

    @property
    def subject(self) -> str:
        """The subject its request reached the stage on (not its lane's)."""
        return (self.msg.headers or {}).get(ARRIVED_ON) or self.msg.subject

    async def ack(self) -> None:
        await self.lanes.remove(self.msg)
        await self.msg.ack()

    async def ack_sync(self, timeout: float = 1.0) -> Msg:  # noqa: ASYNC109  # nats-py's own signature
        await self.lanes.remove(self.msg)
        return await self.msg.ack_sync(timeout=timeout)

    async def term(self) -> None:
        await self.lanes.remove(self.msg)
        await self.msg.term()


async def lanes_listing(js: Any, subjects: Any, stage: str) -> list[Lane]:
    """``stage``'s lanes as the server lists them now (every lane with a consumer): one request per
    256 lanes. NotFoundError where the stage has no lanes stream (no fair-share worker has started)."""
    stream, prefix = subjects.stream_lanes(stage), subjects.lane_durable(stage, "")
    lanes: list[Lane] = []
    offset = 0
    while True:
        page = await js.consumers_info(stream, offset=offset or None)
        for info in page:
            name = info.name or ""
            if name.startswith(prefix):
                lanes.append(Lane(name.removeprefix(prefix), int(info.num_pending or 0),
                                  int(info.num_ack_pending or 0)))
        if len(page) < 256:  # the server's page (nats-py: consumers_info)
            return lanes
        offset += len(page)


@dataclass
class Lane:
    """One lane as the server lists it: ``waiting`` never delivered, ``working`` delivered and not yet
    acked (in work, or a dead worker's awaiting redelivery)."""

    name: str
    waiting: int
    working: int


class Lanes:
    """A fair-share stage's lanes, as one worker of ``stage`` sees and serves them."""

    def __init__(self, bus: Any, stage: str) -> None:
        self.bus = bus
        self.stage = stage
        s = bus.subjects
        self.stream = s.stream_lanes(stage)
        self._prefix = s.lane_durable(stage, "")
        settings = bus.settings
        self.weights: dict[str, float] = dict(settings.fair_share_weights)
        self.caps: dict[str, int] = dict(settings.fair_share_caps)
        #: Turns this worker gave each busy lane, each over its weight (the stride count).
        self.turns: dict[str, float] = {}
        #: When this worker last served each busy lane (its count of picks then): ties go to the
        #: lane served longest ago.
        self.last: dict[str, int] = {}
        self.picks = 0
        #: Set by this worker's intake when a request arrives: an idle pick looks again at once.
        self.arrived = asyncio.Event()
        #: The lanes this worker's intake copied a request into since its last pick: the pick tries
        #: each, whatever the listing says (briefly where it lists the lane idle: another worker may
        #: have taken the copy). The server counts a lane's pending messages a moment
        #: after it acknowledges the copy, so a listing just after it may show the lane idle, and
        #: the request would wait FETCH_WAIT_S (2 s) for the next pick (found in bench/overhead.py's
        #: per-hop timelines: 2 requests of 20, at one of the two fair-share stages).
        self.copied: set[str] = set()

    def weight(self, lane: str) -> float:
        return self.weights.get(lane, 1.0)

    # ------------------------------------------------------------------ intake

    async def run(self, stop: asyncio.Event, durable: str, filters: Sequence[str], on_message: OnMessage, *,
                  concurrency: int, device_slots: int | None, what: str) -> None:
        """The intake on the stage's consumer ``durable`` and the work on its lanes, until ``stop``.
        Every consumer's deliveries are unlimited: the intake only copies and acks, and the worker
        counts a request's attempts itself (shared/attempts.py), which a fair-share worker must."""
        s = self.bus.subjects
        await retry_transient(lambda: self.bus.js.stream_info(self.stream), self.stream)  # the topology's
        await retry_transient(lambda: self.bus.ensure_consumer(self.stream, s.lanes_gauge(self.stage),
                                                               [s.lane(self.stage)], max_deliver=UNLIMITED),
                              s.lanes_gauge(self.stage))
        intake = asyncio.create_task(consume(
            self.bus, self.bus.subjects.stream_events, durable, filters, self.intake, stop,
            concurrency=1, what=what, max_deliver=UNLIMITED))
        try:
            await serve(self.take, on_message, stop, concurrency=concurrency, device_slots=device_slots,
                        durable=f"{self._prefix}*", what=what)
        finally:
            intake.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await intake

    async def intake(self, msg: Msg, slot: Any) -> None:
        """Copy one arriving message into its lane (and make sure the lane's consumer exists), then ack."""
        lane = lane_of(msg.data)
        # The original's place in its stream: the same when the intake takes it again (a worker died
        # between the copy and the ack), never the same for two messages (a request id may be).
        dedup = f"{self.stage}:{msg.metadata.sequence.stream}"
        await asyncio.gather(self.bus.publish_payload(self.bus.subjects.lane(self.stage, lane), msg.data, dedup,
                                                      headers={ARRIVED_ON: msg.subject}),
                             self.ensure_lane(lane))
        await msg.ack()
        self.copied.add(lane)
        self.arrived.set()

    async def ensure_lane(self, lane: str) -> None:
        """The lane's consumer exists (created if not): a consumer info, and a create the first time
        or after a change of ``ack_wait_s``. Not a create every time: the server writes a consumer's
        create-or-update to disk, 3 to 5 ms against about 1 for the info (timed in the intake while
        bench/overhead.py ran), on the way of every request to a fair-share stage."""
        durable = self.bus.subjects.lane_durable(self.stage, lane)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            info = await self.bus.js.consumer_info(self.stream, durable)
            if math.isclose(info.config.ack_wait or 0.0, self.bus.settings.ack_wait_s):
                return
        await self.bus.ensure_consumer(self.stream, durable, [self.bus.subjects.lane(self.stage, lane)],
                                       max_deliver=UNLIMITED, inactive_threshold=LANE_IDLE_S)

    # ------------------------------------------------------------------ the pick

    async def listing(self) -> list[Lane]:
        """This stage's lanes as the server lists them now (every lane with a consumer)."""
        return await lanes_listing(self.bus.js, self.bus.subjects, self.stage)

    def order(self, lanes: Sequence[Lane]) -> list[Lane]:
        """The lanes that may give a message now, first the one whose turn it is. A lane that has
        just become busy starts at the fewest turns among the busy lanes, and wins a tie against a
        lane served since."""
        busy = [lane for lane in lanes if lane.waiting or lane.working]
        self.turns = {lane.name: self.turns[lane.name] for lane in busy if lane.name in self.turns}
        self.last = {name: pick for name, pick in self.last.items() if name in self.turns}
        floor = min(self.turns.values(), default=0.0)
        for lane in busy:
            self.turns.setdefault(lane.name, floor)
        open_lanes = [lane for lane in busy if lane.name not in self.caps or lane.working < self.caps[lane.name]]
        return sorted(open_lanes, key=lambda lane: (self.turns[lane.name], lane.working / self.weight(lane.name),
                                                    self.last.get(lane.name, -1), lane.name))

    def served(self, lane: str) -> None:
        """One turn given to ``lane`` (one of :meth:`order`'s)."""
        self.turns[lane] += 1.0 / self.weight(lane)
        self.picks += 1
        self.last[lane] = self.picks

    async def take(self, batch: int) -> list[Msg]:
        """Up to ``batch`` messages, each from the lane whose turn it is; none after FETCH_WAIT_S
        when no lane has one (sooner when this worker's intake copies one in)."""
        self.arrived.clear()
        copied, self.copied = self.copied, set()
        try:
            lanes = await self.listing()
        except Exception as exc:  # the server away: the loop asks again
            log.warning("listing the lanes failed", stage=self.stage, error=str(exc))
            self.copied |= copied
            await asyncio.sleep(1)
            return []
        # A copied lane listed idle counts one waiting, unsure: another worker may have taken the copy
        # already, so its fetch waits MAYBE_WAIT_S, not SURE_WAIT_S (a copy that is there comes at once).
        lanes += [Lane(name, 0, 0) for name in sorted(copied - {lane.name for lane in lanes})]  # made a moment ago
        unsure = {lane.name for lane in lanes if lane.name in copied and not lane.waiting}
        for lane in lanes:
            if lane.name in unsure:
                lane.waiting = 1
        taken: list[Msg] = []
        tried_maybe = 0
        while len(taken) < batch:
            order = self.order(lanes)
            lane = next((lane for lane in order if lane.waiting or tried_maybe < MAYBE_TRIES), None)
            if lane is None:
                break
            maybe = not lane.waiting
            tried_maybe += maybe
            msg = await self._fetch_one(lane.name, MAYBE_WAIT_S if maybe or lane.name in unsure else SURE_WAIT_S)
            unsure.discard(lane.name)
            if msg is None:
                lanes.remove(lane)  # nothing there after all: not asked again in this pick
                continue
            self.served(lane.name)
            lane.waiting = max(0, lane.waiting - (not maybe))
            lane.working += 1
            taken.append(LaneMsg(msg, self))  # type: ignore[arg-type]  # a Msg by its methods
        if not taken:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), FETCH_WAIT_S)
        return taken

    async def _fetch_one(self, lane: str, wait: float) -> Msg | None:
        psub = await self.bus.js.pull_subscribe_bind(self.bus.subjects.lane_durable(self.stage, lane), self.stream)
        try:
            msgs = await psub.fetch(1, timeout=wait)
            return msgs[0] if msgs else None
        except (nats.errors.TimeoutError, nats.js.errors.NotFoundError):
            return None
        except Exception as exc:
            log.warning("fetching from a lane failed", stage=self.stage, lane=lane, error=str(exc))
            return None
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def remove(self, msg: Msg) -> None:
        """Delete a settled request from the lanes stream (see :class:`LaneMsg`). A delete that fails
        leaves it counted by the gauge until the stream's age limit: the settle goes on."""
        seq = msg.metadata.sequence.stream if msg.metadata else None
        if seq is None:
            return
        try:
            await self.bus.js.delete_msg(self.stream, seq)
        except nats.js.errors.NotFoundError:
            pass  # deleted already (a settle retried)
        except Exception as exc:
            log.warning("deleting a settled request from its lane failed", stage=self.stage, seq=seq, error=str(exc))

    async def summary(self) -> Lane:
        """Every lane of the stage together (the queue the metrics show)."""
        lanes = await self.listing()
        return Lane("*", sum(lane.waiting for lane in lanes), sum(lane.working for lane in lanes))
