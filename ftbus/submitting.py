"""Submitting a request: upload the workspace, publish ``EvalRequested``, leave the submitted marker."""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from shared.artifacts import upload_dir
from shared.bus import Bus
from shared.events import EvalRequested, RequestContext, TaskSpec, Timeouts
from shared.subjects import msg_id

#: The artifact ``submit`` leaves beside a request's workspace, ``<request_id>/submitted.json``.
SUBMITTED_MARKER = "submitted.json"


def new_request_id() -> str:
    """Sortable by submission time, unique without coordination."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(4)


def exclude_outputs(path: PurePosixPath) -> bool:
    """Leftovers of a local run are not part of the candidate (the reference's clear_workspace)."""
    top = path.parts[0] if path.parts else ""
    return top in {"output", "benchmark_results", "merged_model", "data.json", "data_stats.json"}


async def submit_workspace(bus: Bus, workspace: Path, task: TaskSpec, timeouts: Timeouts | None, rid: str) -> str:
    settings = bus.settings
    store = await bus.submitter_artifacts()
    files = await upload_dir(store, f"{rid}/workspace", workspace, max_bytes=settings.max_workspace_bytes,
                             max_files=settings.max_workspace_files, exclude=exclude_outputs)
    event = EvalRequested(
        request_id=rid,
        context=RequestContext(task=task, workspace=files, timeouts=timeouts or Timeouts()),
    )
    # Beside the request, a marker that `status` finds before the aggregator has written the
    # request's first view (an agent reads the artifacts store's metadata, nothing else of it).
    marker = f'{{"submitted_at": "{event.emitted_at.isoformat()}"}}'.encode()
    owner = settings.submit_owner()
    # The subject says whose request it is (the data stage reads it there, and NATS permissions
    # reserve each agent's to it): the unowned subject without an owner.
    subject = bus.subjects.eval_requested_by(owner) if owner else bus.subjects.eval_requested
    await asyncio.gather(bus.publish(subject, event, msg_id(rid, "submit", "requested")),
                         store.put_bytes(f"{rid}/{SUBMITTED_MARKER}", marker))
    return rid
