"""Property-based fuzzing of the wire format and of every event model (hypothesis).

The property: whatever bytes arrive, ``codec.decode`` either returns an event of an accepted type
or raises a ``CodecError`` with a reason (which the worker runtime turns into a dead letter). No
other exception may escape: any other one would crash a worker's message loop. Three sources of
input: arbitrary bytes, arbitrary msgpack values, and valid events of every type whose fields
(at any depth) are replaced, deleted or joined by arbitrary values. Whatever decodes must encode
again and decode to the same event (nothing accepted that cannot be forwarded).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from shared import codec
from shared.events import EVENT_TYPES
from tests.fuzzing import SAMPLES, mutated_events, values

EXAMPLES = 300
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Verdict kinds seen by the running test, printed after it (run with -s to see them).
TALLY: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def print_the_tally(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Each fuzz test's own tally (a test of the module alone: xdist may run the others elsewhere)."""
    TALLY.clear()
    yield
    if TALLY:
        with capsys.disabled():
            print(f"\n{request.node.name}: {TALLY['cases']} cases, 0 crashes; outcomes: "
                  + ", ".join(f"{k}={v}" for k, v in sorted(TALLY.items()) if k != "cases"))


def decode_or_clear_error(payload: bytes, expected: Any = None) -> BaseModel | None:
    """The property itself: an event, or a CodecError with a reason. Anything else fails the test."""
    try:
        event = codec.decode(payload, expected)
    except codec.CodecError as err:
        assert err.reason and isinstance(err.reason, str)
        # Only a valid id: the aggregator keys records and verdict subjects by it.
        assert err.request_id is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", err.request_id)
        TALLY[f"error:{type(err).__name__}"] += 1
        return None
    assert type(event).__name__ in EVENT_TYPES
    # Whatever is accepted can be forwarded: encode and decode again, unchanged.
    again = codec.decode(codec.encode(event))
    assert _same(again.model_dump(), event.model_dump())
    TALLY[f"decoded:{type(event).__name__}"] += 1
    return event


def _same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN (a float field may carry one)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_decode_or_give_a_clear_error(payload: bytes) -> None:
    decode_or_clear_error(payload)
    TALLY["cases"] += 1


@FUZZ
@given(values)
def test_arbitrary_msgpack_values_decode_or_give_a_clear_error(value: Any) -> None:
    decode_or_clear_error(msgpack.packb(value, use_bin_type=True))
    TALLY["cases"] += 1


@FUZZ
@given(st.dictionaries(st.sampled_from(["schema_version", "event_type", "request_id", "context", "ok"]),
                       values, max_size=5),
       st.sampled_from(sorted(EVENT_TYPES)))
def test_maps_that_look_like_events_decode_or_give_a_clear_error(body: dict[str, Any], type_name: str) -> None:
    body.setdefault("schema_version", 1)
    body.setdefault("event_type", type_name)
    decode_or_clear_error(msgpack.packb(body, use_bin_type=True))
    TALLY["cases"] += 1


@FUZZ
@given(mutated_events())
def test_every_event_model_with_arbitrary_field_values(case: tuple[str, bytes]) -> None:
    type_name, payload = case
    event = decode_or_clear_error(payload)
    # Restricted to its own type, as a stage reads it: still only an event or a clear error.
    decode_or_clear_error(payload, EVENT_TYPES[type_name])
    if event is not None:
        assert type(event).__name__ in EVENT_TYPES
    TALLY["cases"] += 1


@FUZZ
@given(mutated_events(), st.integers(min_value=0, max_value=64))
def test_truncated_and_deeply_nested_payloads(case: tuple[str, bytes], depth: int) -> None:
    _, payload = case
    decode_or_clear_error(payload[: len(payload) // 2])
    nested: Any = {"schema_version": 1, "event_type": "EvalRequested", "request_id": "r-1"}
    inner: Any = nested
    for _ in range(depth * 8):
        inner["context"] = {}
        inner = inner["context"]
    decode_or_clear_error(msgpack.packb(nested, use_bin_type=True))
    TALLY["cases"] += 1


@pytest.mark.parametrize("type_name", sorted(EVENT_TYPES))
def test_every_sample_round_trips(type_name: str) -> None:
    event = SAMPLES[type_name]
    assert codec.decode(codec.encode(event)) == event
