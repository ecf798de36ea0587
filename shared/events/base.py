"""The events' common parts: names, references to stored files, how a run of candidate code ended.

Every message on the bus is an event of the ``shared.events`` package, msgpack-encoded
(shared/codec.py). Field names follow the reference evaluator where it has them (``execution``,
``return_checking``, ``code``, ``final_decision``, ``raw_execution``, ``failed_stage``,
``accuracy_summary`` ...), so that its users can map one to one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

SCHEMA_VERSION = 1
#: The most samples per benchmark item a benchmark or a request may ask for: each run's outcome of
#: every item travels in the events (NATS messages are at most 1 MB by default).
MAX_RUNS = 16

RequestId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
#: A stage's name or record name: a :class:`Stage` or :class:`FailedStage` for ftbus's own stages, a
#: short lowercase name for a stage another pipeline adds (shared/stagespec.py). Events name stages
#: in plain strings so that such a stage validates; the pattern keeps a forged event from writing
#: anything else into a record.
STAGE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
StageName = Annotated[str, StringConstraints(pattern=rf"^{STAGE_NAME.pattern}$")]
#: A campaign's name: the key of its record in the campaigns bucket (shared/campaigns.py).
CAMPAIGN_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
CAMPAIGN_NAME_RULE = "a campaign name is letters, digits, '_' and '-', at most 64, starting with a letter or digit"
CampaignName = Annotated[str, StringConstraints(pattern=rf"^{CAMPAIGN_NAME}$")]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class Stage(StrEnum):
    """ftbus's own stages' names, as their rows (``StageSpec.stage``) and ``next`` spell them. What the
    stages are, in which order, and what each reads and publishes is the pipeline table's
    (ftbus/stages.py); nothing iterates this list. It stays so that a row names the stage it leads
    to, and the aggregator its own consumers, without importing the others' services."""

    data = "data"
    train = "train"
    bench = "bench"
    judge = "judge"
    aggregate = "aggregate"


class FailedStage(StrEnum):
    """The values of ``failed_stage`` that ftbus's own code speaks of. ``precheck`` (the data stage's
    refusal before anything ran) and ``cancelled`` are not rows of the pipeline table; the others
    are ftbus's rows' record names (``StageSpec.record_name``), spelled once here for the code that
    speaks of one stage in particular (the judge's advice, the RD-Agent mapping). A stage another
    pipeline adds has a record name of its own: events carry plain :data:`StageName` strings."""

    precheck = "precheck"
    data_processing = "data_processing"
    training = "training"
    benchmark = "benchmark"
    judge = "judge"
    aggregate = "aggregate"
    cancelled = "cancelled"


class ArtifactRef(Model):
    """A file in the artifact store. Events carry these, never the file itself."""

    name: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class WorkspaceFile(Model):
    """One file of the candidate's workspace: its path inside the workspace and where it is stored.

    The path is a plain string on purpose: a path that escapes the workspace must reach the
    data stage's pre-check, which turns it into a clear verdict instead of an undecodable message.
    """

    path: str
    ref: ArtifactRef


class Event(Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: RequestId
    emitted_at: datetime = Field(default_factory=utcnow)


class StageOutcome(Model):
    """How one run of candidate code ended (the reference's EnvResult, made explicit)."""

    exit_code: int
    timed_out: bool = False
    duration_s: float = 0.0
    timeout_s: float | None = None
    log: ArtifactRef | None = None
    log_tail: str = ""
    #: The kernel killed it for exceeding the sandbox's memory limit (exit code 137).
    oom_killed: bool = False
    #: The isolation it ran under: ``local`` (none) or ``docker:<image>`` (docs/sandbox.md).
    sandbox: str | None = None

