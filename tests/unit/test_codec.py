"""The wire format: round trips, and clear typed errors for everything else."""

from __future__ import annotations

import msgpack
import pytest

from shared import codec
from shared.events import (
    ArtifactRef,
    DataResult,
    DataSummary,
    DeadLetter,
    EvalRequested,
    RequestContext,
    TaskSpec,
    WorkspaceFile,
)

SHA = "0" * 64


def _request(rid: str = "r-1") -> EvalRequested:
    ref = ArtifactRef(name=f"{rid}/workspace/train.yaml", size=3, sha256=SHA)
    return EvalRequested(
        request_id=rid,
        context=RequestContext(
            task=TaskSpec(base_model="tiny", benchmark="arith"),
            workspace=[WorkspaceFile(path="train.yaml", ref=ref)],
        ),
    )


def test_round_trip_keeps_every_field() -> None:
    event = _request()
    decoded = codec.decode(codec.encode(event))
    assert decoded == event
    assert isinstance(decoded, EvalRequested)


def test_bytes_survive_in_dead_letters() -> None:
    letter = DeadLetter(original_subject="ftbus.data.completed", reason="bad", payload=b"\xff\x00garbage")
    assert codec.decode(codec.encode(letter)).payload == b"\xff\x00garbage"


def test_garbage_is_a_malformed_payload() -> None:
    with pytest.raises(codec.MalformedPayload):
        codec.decode(b"\xc1\xc1 definitely not msgpack")


def test_a_msgpack_list_is_not_an_event() -> None:
    with pytest.raises(codec.MalformedPayload, match="not a map"):
        codec.decode(msgpack.packb([1, 2, 3]))


def test_unknown_schema_version_names_the_version_and_keeps_the_request_id() -> None:
    body = msgpack.unpackb(codec.encode(_request("r-7")))
    body["schema_version"] = 99
    with pytest.raises(codec.UnknownSchemaVersion, match="99") as info:
        codec.decode(msgpack.packb(body))
    assert info.value.request_id == "r-7"


def test_unknown_event_type() -> None:
    body = msgpack.unpackb(codec.encode(_request()))
    body["event_type"] = "Nonsense"
    with pytest.raises(codec.UnknownEventType):
        codec.decode(msgpack.packb(body))


def test_unexpected_event_type_is_rejected_where_it_does_not_belong() -> None:
    with pytest.raises(codec.UnknownEventType, match="expected DataResult"):
        codec.decode(codec.encode(_request()), DataResult)


def test_invalid_fields_say_which_field() -> None:
    body = msgpack.unpackb(codec.encode(_request("r-9")))
    del body["context"]["task"]["base_model"]
    with pytest.raises(codec.InvalidEvent, match="base_model") as info:
        codec.decode(msgpack.packb(body))
    assert info.value.request_id == "r-9"


def test_request_ids_are_subject_safe() -> None:
    with pytest.raises(ValueError):
        _request("has.dot")
    with pytest.raises(ValueError):
        _request("x" * 65)


def test_extra_fields_are_rejected() -> None:
    body = msgpack.unpackb(codec.encode(DataResult(request_id="r", ok=True, context=_request().context,
                                                   data=DataSummary())))
    body["surprise"] = 1
    with pytest.raises(codec.InvalidEvent, match="surprise"):
        codec.decode(msgpack.packb(body))
