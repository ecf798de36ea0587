"""The owners' error budgets: one ``OwnerState`` (shared/decision.py) per submitting identity.

KV bucket ``<prefix>_owners``, key: the owner. The bench stage reads an owner's state before it
confirms a candidate on the hidden pool and writes the state ``decide`` returns by compare-and-set
on the revision it read; a lost one means another confirmation of the same owner was recorded in
between, and the decision is made again at the state as it is now (its next level). Agents neither
read nor write it: a budget an agent could reset would control nothing.
"""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError

from shared.decision import OwnerState
from shared.kv_cas import RevisionConflict, write_at
from shared.settings import OWNER_PATTERN

#: Who owns a request that names none: every such request shares one budget, so none escapes it.
SHARED_OWNER = "everyone"


class OwnerConflict(RuntimeError):
    """The owner's state changed since it was read: another of its confirmations was recorded first."""


class OwnerStore:
    """The owners bucket: read a state with its revision, write one by compare-and-set."""

    def __init__(self, bus: object) -> None:
        self.bus = bus  # a shared.bus.Bus, or the tests' in-memory one

    async def _kv(self) -> object:
        return await self.bus.kv(self.bus.subjects.kv_owners)  # type: ignore[attr-defined]

    async def get(self, owner: str) -> tuple[OwnerState, int]:
        """The owner's state and its revision (a fresh state and 0 when none is stored)."""
        if not OWNER_PATTERN.match(owner):
            raise ValueError(f"owner {owner!r}: letters, digits, '-' and '_' only, at most 64")
        kv = await self._kv()
        try:
            entry = await kv.get(owner)  # type: ignore[attr-defined]
        except KeyNotFoundError:
            return OwnerState(owner=owner), 0
        if not entry.value:
            return OwnerState(owner=owner), 0
        return OwnerState.model_validate_json(entry.value), entry.revision

    async def put(self, state: OwnerState, revision: int) -> int:
        """Write ``state`` if the stored one is still at ``revision`` (0: none stored); raise
        :class:`OwnerConflict` otherwise. Returns the new revision."""
        try:
            return await write_at(await self._kv(), state.owner, state.model_dump_json().encode(), revision)
        except RevisionConflict as exc:
            raise OwnerConflict(state.owner) from exc
