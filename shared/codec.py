"""msgpack wire format: one map with the event's fields plus ``event_type``.

Decoding never raises anything but ``CodecError`` (and its subclasses), which carries the
request id whenever it could be read, so that a bad message can still end in an error verdict.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, ValidationError

from shared.events import EVENT_TYPES, SCHEMA_VERSION

E = TypeVar("E", bound=BaseModel)

TYPE_KEY = "event_type"


class CodecError(Exception):
    def __init__(self, reason: str, request_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.request_id = request_id


class MalformedPayload(CodecError):
    pass


class UnknownSchemaVersion(CodecError):
    pass


class UnknownEventType(CodecError):
    pass


class InvalidEvent(CodecError):
    pass


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode(event: BaseModel) -> bytes:
    body = event.model_dump(mode="python")
    body[TYPE_KEY] = type(event).__name__
    return msgpack.packb(body, default=_default, use_bin_type=True)


_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def _request_id_of(body: Any) -> str | None:
    """The request id, only when it is a valid one: an arbitrary string (dots, wildcards, spaces)
    cannot name a KV key or a verdict subject, so a dead letter carrying it could never end."""
    if isinstance(body, dict):
        rid = body.get("request_id")
        if isinstance(rid, str) and _REQUEST_ID.fullmatch(rid):
            return rid
    return None


def decode(payload: bytes, expected: type[E] | tuple[type[BaseModel], ...] | None = None) -> Any:
    """Decode one event. ``expected`` restricts which event types are acceptable here."""
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise MalformedPayload(f"payload is not msgpack: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedPayload(f"payload is a msgpack {type(body).__name__}, not a map")
    rid = _request_id_of(body)
    version = body.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UnknownSchemaVersion(
            f"schema_version {version!r} is not supported (this build reads {SCHEMA_VERSION})", rid
        )
    type_name = body.pop(TYPE_KEY, None)
    allowed = () if expected is None else expected if isinstance(expected, tuple) else (expected,)
    # The types expected here first: a stage another pipeline adds has a result type of its own.
    known = {**EVENT_TYPES, **{c.__name__: c for c in allowed}}
    cls = known.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise UnknownEventType(f"unknown event_type {type_name!r}", rid)
    if expected is not None:
        if cls not in allowed:
            names = ", ".join(c.__name__ for c in allowed)
            raise UnknownEventType(f"got {type_name}, expected {names}", rid)
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise InvalidEvent(f"{type_name} failed validation: {problems}", rid) from None
