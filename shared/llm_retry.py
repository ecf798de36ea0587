"""Which OpenAI-compatible API failures are worth another try, and how long to wait before it.

Used by every service that calls an LLM endpoint with the ``openai`` client's own retries off
(the judge, the benchmark's answer check), so that both retry inside their own time budgets the
same way.
"""

from __future__ import annotations

import openai
from tenacity import RetryCallState
from tenacity.wait import wait_base

BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
RETRY_AFTER_MAX_S = 60.0
RETRYABLE_STATUS = frozenset({408, 409, 429})


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError | TimeoutError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return False


def retry_after(exc: BaseException | None) -> float | None:
    if not isinstance(exc, openai.APIStatusError):
        return None
    value = exc.response.headers.get("retry-after")
    try:
        return min(float(value), RETRY_AFTER_MAX_S) if value else None
    except ValueError:
        return None  # an HTTP date: rare enough to fall back to our own backoff


class Backoff(wait_base):
    """Exponential backoff that honours a server's Retry-After when it asks for longer."""

    def __call__(self, retry_state: RetryCallState) -> float:
        exp = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (retry_state.attempt_number - 1))
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        return max(exp, retry_after(exc) or 0.0)
