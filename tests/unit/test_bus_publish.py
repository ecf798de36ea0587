"""Bus.publish retries a server that is briefly away (tenacity), and only that."""

from __future__ import annotations

import nats
import pytest

from shared.bus import Bus
from shared.events import CancelRequested


class FlakyJetStream:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[dict[str, str] | None] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None,
                      **options: float) -> str:
        self.calls.append(headers)
        if self.failures:
            raise self.failures.pop(0)
        return "ack"


def _bus(js: FlakyJetStream) -> Bus:
    bus = Bus.__new__(Bus)
    bus.js = js  # type: ignore[assignment]
    return bus


async def test_a_briefly_absent_server_is_retried_with_the_same_dedup_id() -> None:
    js = FlakyJetStream([nats.errors.TimeoutError(), nats.js.errors.NoStreamResponseError()])
    ack = await _bus(js).publish("s", CancelRequested(request_id="r1"), "r1:data:completed")
    assert ack == "ack" and len(js.calls) == 3
    assert all(h == {"Nats-Msg-Id": "r1:data:completed"} for h in js.calls)


async def test_it_gives_up_after_its_attempts_and_never_retries_other_errors() -> None:
    js = FlakyJetStream([nats.errors.TimeoutError()] * 5)
    with pytest.raises(nats.errors.TimeoutError):
        await _bus(js).publish("s", CancelRequested(request_id="r1"), retries=3)
    assert len(js.calls) == 3
    refused = FlakyJetStream([nats.js.errors.APIError(description="maximum messages per subject exceeded")])
    with pytest.raises(nats.js.errors.APIError):
        await _bus(refused).publish("s", CancelRequested(request_id="r1"))
    assert len(refused.calls) == 1
