"""A runner that counts its runs of candidate code by how they ended (the ``ftbus_sandbox_runs``
metric: shared/metrics.py). The stage worker wraps its runner in it, outside the quota and the
run limit, so a run the quota stopped counts as ``quota``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runners.base import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_OOM_KILLED, RunResult
from runners.quota import EXIT_QUOTA
from shared import metrics


def exit_cause(result: RunResult) -> str:
    """How a run ended, in one word of :data:`shared.metrics.CAUSES`."""
    if result.timed_out:
        return "timeout"
    if result.cancelled:
        return "cancelled"
    if result.oom_killed or result.exit_code == EXIT_OOM_KILLED:
        return "oom"
    code = result.exit_code
    named = {0: "ok", EXIT_QUOTA: "quota", EXIT_NOT_FOUND: "not_found", EXIT_CANNOT_EXECUTE: "cannot_execute"}
    if code in named:
        return named[code]
    return "signal" if code > 128 else "error"


class MeteredRunner:
    """Each run goes to the inner runner; its end is counted under ``stage``."""

    def __init__(self, inner: Any, stage: str) -> None:
        self.inner = inner
        self.stage = stage

    def __getattr__(self, name: str) -> Any:  # name, child_env, start_resident, ...: the inner runner's
        return getattr(self.inner, name)

    async def run(self, argv: Sequence[str], **kwargs: Any) -> Any:
        result = await self.inner.run(argv, **kwargs)
        metrics.sandbox_run(self.stage, result, exit_cause(result))
        return result
