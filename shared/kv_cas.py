"""One key written by compare-and-set: the campaigns' and the owners' records (shared/campaigns.py,
shared/owners.py) are read with their revision and written back only if nobody wrote in between."""

from __future__ import annotations

from nats.js.errors import BadRequestError, KeyWrongLastSequenceError


class RevisionConflict(RuntimeError):
    """The key changed since it was read at the given revision."""


async def write_at(kv: object, key: str, data: bytes, revision: int) -> int:
    """Write ``data`` under ``key`` if it is still at ``revision`` (0: absent); return the new revision,
    or raise :class:`RevisionConflict`."""
    try:
        if revision == 0:
            return await kv.create(key, data)  # type: ignore[attr-defined, no-any-return]
        return await kv.update(key, data, last=revision)  # type: ignore[attr-defined, no-any-return]
    except KeyWrongLastSequenceError as exc:
        raise RevisionConflict(key) from exc
    except BadRequestError as exc:
        # nats-py reports a create of an existing key as a bad request naming the wrong last sequence.
        if "wrong last sequence" in str(exc).lower():
            raise RevisionConflict(key) from exc
        raise
