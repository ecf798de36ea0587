"""The in-memory bus of the unit tests against a real nats-server: one scenario through the
production consumer loop (shared/consumer.py) on both, the same outcomes.

The unit tests trust tests/memory_bus.py to behave as the server does for what the workers use:
fetch, ack, nak with and without a delay, term, in_progress, redelivery after ack_wait, max_deliver
and its advisory, and KeyValue compare-and-set revisions. Here each of these is exercised on both,
and what a worker would see (each message's deliveries, what ended it, the advisory, the
revisions) must be the same."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from shared.bus import Bus
from shared.consumer import Slot, consume
from shared.settings import Settings
from tests.memory_bus import MemoryBus

#: What the handler does with each message, by delivery: "ack", "nak", "nak-later", "term",
#: "progress" (in_progress then ack), "ignore" (nothing: redelivered after ack_wait).
SCRIPT: dict[str, list[str]] = {
    "plain": ["ack"],
    "nak-once": ["nak", "ack"],
    "nak-delayed": ["nak-later", "ack"],
    "terminated": ["term"],
    "in-progress": ["progress"],
    "abandoned": ["ignore", "ignore", "ignore"],
}


async def _scenario(bus: Any, durable: str) -> dict[str, Any]:
    s = bus.subjects
    subject = s.eval_requested
    seen: dict[str, list[int]] = {name: [] for name in SCRIPT}
    advisories: list[dict[str, Any]] = []

    async def on_advisory(msg: Any) -> None:
        advisories.append(json.loads(msg.data))

    advisory_sub = await bus.nc.subscribe(s.max_deliveries_advisory(s.stream_events, durable), cb=on_advisory)

    async def on_message(msg: Any, slot: Slot) -> None:
        name = msg.data.decode()
        seen[name].append(msg.metadata.num_delivered)
        action = SCRIPT[name][min(msg.metadata.num_delivered, len(SCRIPT[name])) - 1]
        if action == "ack":
            await msg.ack()
        elif action == "nak":
            await msg.nak()
        elif action == "nak-later":
            await msg.nak(delay=0.5)
        elif action == "term":
            await msg.term()
        elif action == "progress":
            await msg.in_progress()
            await msg.ack()

    for name in SCRIPT:
        await bus.publish_payload(subject, name.encode(), f"contract:{durable}:{name}")
    stop = asyncio.Event()
    task = asyncio.create_task(consume(bus, s.stream_events, durable, [subject], on_message, stop, concurrency=3))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120  # a hang guard: the scenario takes max_deliver ack waits
    try:
        # The abandoned message is delivered max_deliver times, ack_wait apart, then given up on.
        while not (advisories and all(len(v) == len(SCRIPT[k]) for k, v in seen.items())):
            assert loop.time() < deadline, f"the scenario did not finish: {seen}, advisories {advisories}"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # a hang guard
        await advisory_sub.unsubscribe()

    kv = await bus.kv(s.kv_requests)
    first = await kv.create(f"{durable}-key", b"one")
    second = await kv.update(f"{durable}-key", b"two", last=first)
    refused = []
    key = f"{durable}-key"
    for attempt in (lambda: kv.create(key, b"again"), lambda: kv.update(key, b"x", last=first)):
        try:
            await attempt()
        except KeyWrongLastSequenceError:
            refused.append(True)
    entry = await kv.get(f"{durable}-key")
    return {
        "deliveries": seen,
        "advisory": [(a["consumer"], a["deliveries"]) for a in advisories],
        "kv": (second > first, refused, entry.value, entry.revision == second),
    }


async def test_the_memory_bus_does_what_the_server_does(bus: Bus, settings: Settings, tmp_path: Path) -> None:
    on_server = await _scenario(bus, "contract")
    memory = MemoryBus(settings.model_copy(update={"home": tmp_path / "memory-home"}))
    try:
        in_memory = await _scenario(memory, "contract")
    finally:
        await memory.close()
    assert on_server == in_memory
    assert on_server["deliveries"] == {name: list(range(1, len(steps) + 1)) for name, steps in SCRIPT.items()}
    assert on_server["advisory"] == [("contract", settings.max_deliver)]
    assert on_server["kv"] == (True, [True, True], b"two", True)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """ack_wait short enough that the abandoned message's three deliveries take seconds, not minutes,
    and long enough that no other message is redelivered for want of an ack that a loaded machine
    sent late (each handler acks, naks or terms as its first act; 1 s was too close)."""
    return settings.model_copy(update={"ack_wait_s": 4.0})
