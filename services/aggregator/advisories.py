"""The server's MAX_DELIVERIES advisories: a consumer whose deliveries the server counts gave up on
a message after ``max_deliver`` of them. Each becomes a dead letter naming the stage, which the
aggregator's dead-letter consumer turns into an error verdict (the advisories stream keeps them
while no aggregator runs).

Since the stage workers count their attempts themselves (shared/attempts.py: their consumers
deliver without limit, and a worker dead-letters a request whose real attempts are used up), the
advisories come from the aggregator's own consumers (events, test results, dead letters), and
from a stage consumer that an older worker, which still let the server count, set up again."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from services.aggregator.transitions import stage_of_consumer
from shared import codec
from shared.bus import Bus
from shared.consumer import Slot, consume
from shared.events import DeadLetter, Stage
from shared.logs import get_logger

log = get_logger("ftbus.aggregator")


async def follow_advisories(bus: Bus, stop: asyncio.Event) -> None:
    """Read the advisories stream until ``stop``."""
    s = bus.subjects

    async def on_advisory(msg: Any, slot: Slot) -> None:
        try:
            await dead_letter_for(bus, json.loads(msg.data))
            await msg.ack()
        except Exception:
            log.exception("advisory handling failed, will retry")
            await msg.nak(delay=2)

    await consume(bus, s.stream_advisories, f"{s.durable(Stage.aggregate)}-advisories", [">"], on_advisory, stop,
                  what="aggregate")


async def dead_letter_for(bus: Bus, advisory: dict[str, Any]) -> None:
    """Publish the dead letter of the message ``advisory`` names (its payload read from its stream)."""
    stream, consumer, seq = advisory["stream"], advisory["consumer"], int(advisory["stream_seq"])
    stage = stage_of_consumer(bus.subjects.prefix, consumer)
    try:
        original = await bus.js.get_msg(stream, seq)
        payload, subject = bytes(original.data or b""), original.subject or "?"
    except Exception as exc:
        payload, subject = b"", f"<{stream} seq {seq}: {exc}>"
    request_id = None
    with contextlib.suppress(Exception):
        request_id = codec.decode(payload).request_id
    letter = DeadLetter(
        request_id=request_id,
        original_subject=subject,
        stage=stage,
        reason=f"the {stage if stage else consumer} stage failed {advisory.get('deliveries')} times "
        f"(max_deliver); last errors are in that stage's worker logs",
        payload=payload[:65536],
        deliveries=advisory.get("deliveries"),
    )
    await bus.publish(bus.subjects.dlq, letter, f"dlq:{stream}:{seq}:{consumer}")
