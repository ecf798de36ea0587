"""The NATS server refusing a user a publish or a subscription, told apart from a timeout.

nats-py hands such a refusal only to the connection's error callback, lower-cased;
:class:`SubjectMemoryClient` remembers the spelling of the subjects it used last, so that the
:class:`PermissionDenied` can name the subject as it really is. ``Bus.guard`` turns a refusal into
that error at once.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from nats.aio.client import Client as NatsClient

# nats-py hands the server's `-ERR 'Permissions Violation for Publish to "SUBJECT"'` to the error
# callback, lower-cased: `nats: permissions violation for publish to "subject"` (or `subscription
# to "subject"`, possibly followed by ` using queue "q"`).
_PERMISSION_RE = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"', re.IGNORECASE)


class PermissionDenied(RuntimeError):
    """The NATS server refused this user a publish or a subscription (its own error, not a timeout)."""

    def __init__(self, subject: str, operation: str) -> None:
        self.subject = subject
        self.operation = operation  # "publish" or "subscribe"
        super().__init__(f"permission denied for {subject} (the NATS server refused this user's {operation})")


def parse_permission_error(message: str, known_subjects: dict[str, str] | None = None) -> PermissionDenied | None:
    """The PermissionDenied that a server error names, or None. ``known_subjects`` maps lower-cased
    subjects back to their real spelling (nats-py lower-cases the whole error)."""
    match = _PERMISSION_RE.search(message)
    if match is None:
        return None
    operation = "publish" if match.group(1).lower() == "publish" else "subscribe"
    subject = match.group(2)
    return PermissionDenied((known_subjects or {}).get(subject.lower(), subject), operation)


class SubjectMemoryClient(NatsClient):
    """A nats-py client that remembers the spelling of the subjects it used last, so that a
    permission error, which nats-py lower-cases, can name the subject as it really is."""

    MEMORY = 256

    def __init__(self) -> None:
        super().__init__()
        self.recent_subjects: OrderedDict[str, str] = OrderedDict()

    def remember(self, subject: str) -> None:
        key = subject.lower()
        self.recent_subjects[key] = subject
        self.recent_subjects.move_to_end(key)
        while len(self.recent_subjects) > self.MEMORY:
            self.recent_subjects.popitem(last=False)

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        self.remember(subject)
        await super().publish(subject, payload, reply=reply, headers=headers)

    async def subscribe(self, subject: str, *args: Any, **kwargs: Any) -> Any:
        self.remember(subject)
        return await super().subscribe(subject, *args, **kwargs)
