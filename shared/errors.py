"""The one base of the errors whose text a user reads (a verdict, a CLI message): it says what to do."""

from __future__ import annotations


class ExplainedError(Exception):
    """An error whose ``message`` is meant for the person who must act on it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
