"""Entry point of the aggregator service (`ftbus worker aggregate`)."""

from __future__ import annotations

import asyncio

from services.aggregator.service import Aggregator
from shared.bus import Bus


async def run(bus: Bus, stop: asyncio.Event, concurrency: int = 1) -> None:
    await Aggregator(bus, concurrency=concurrency).run(stop)
