"""The request: what a user submits (the task, the workspace, the timeouts it lowers) and cancels.

A ``RequestContext`` travels with the request from start to verdict, so stage services stay stateless.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field, model_validator

from shared.events.base import MAX_RUNS, STAGE_NAME, CampaignName, Event, Model, WorkspaceFile, utcnow


class TaskSpec(Model):
    base_model: str = Field(min_length=1)
    benchmark: str = Field(min_length=1)
    description: str = ""
    involving_datasets: list[str] = Field(default_factory=list)
    name: str = "LLM-Fine-Tuning"
    #: Samples per benchmark item (repeated runs); None: the benchmark's own ``num_runs`` (docs/benchmarks.md).
    num_runs: int | None = Field(default=None, ge=1, le=MAX_RUNS)
    #: The campaign this candidate belongs to: it must beat the campaign's incumbent beyond noise
    #: (docs/judge.md, "Campaigns"). None: judged on its own.
    campaign: CampaignName | None = None


class Timeouts(Model):
    """Per-request stage timeouts in seconds, by the pipeline table's record names: ``data_processing``,
    ``training``, ``benchmark`` for ftbus's stages (``Timeouts(training=600)``), another row's record
    name for a stage another pipeline adds. A stage's limit is its row's (``StageSpec.timeout``, a
    setting); a request may lower it, never raise it (``StageSpec.timeout_in``). None or absent: the
    row's own."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")
    __pydantic_extra__: dict[str, float | None] = Field(init=False)  # type: ignore[assignment]

    @model_validator(mode="after")
    def _record_names(self) -> Timeouts:
        for name, seconds in (self.model_extra or {}).items():
            if not STAGE_NAME.fullmatch(name):
                raise ValueError(f"timeouts: {name!r} is not a stage's record name (e.g. training)")
            if seconds is not None and not seconds > 0:
                raise ValueError(f"timeouts: {name} must be more than 0 seconds, not {seconds}")
        return self

    def of(self, record_name: str) -> float | None:
        """The lower limit this request asks of the stage recorded as ``record_name``, if any."""
        return (self.model_extra or {}).get(record_name)


class RequestContext(Model):
    task: TaskSpec
    workspace: list[WorkspaceFile]
    timeouts: Timeouts = Field(default_factory=Timeouts)
    submitted_at: datetime = Field(default_factory=utcnow)
    #: Who submitted it, as the data stage read it from the request's subject
    #: (``<prefix>.eval.requested.<owner>``, which NATS permissions reserve to that identity); None: the
    #: unowned subject. Whatever a submitter writes here is replaced.
    owner: str | None = None

    def file(self, path: str) -> WorkspaceFile | None:
        return next((f for f in self.workspace if f.path == path), None)



class EvalRequested(Event):
    context: RequestContext


class CancelRequested(Event):
    reason: str = "cancelled by user"

