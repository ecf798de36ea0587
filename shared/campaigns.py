"""Campaigns: the candidates an agent submits under one name, and the incumbent among them.

One record per campaign in the KV bucket ``<prefix>_campaigns`` (key: the campaign's name): the
incumbent (the accepted request that is currently best) with its validation scores (per-item
outcomes: what the next candidate is paired with), the online procedure's state
(shared/online_testing.py), the counts, and the last RECENT_ENTRIES judged candidates and accepted
ones. Every judged candidate's entry is also a key of its own, ``<name>.<request id>``, so the
record stays the same size however many candidates a campaign judges (an agent's search is
thousands; a record of every one passed the server's 1 MB limit near 1,000). Only validation data:
agents may read it (`ftbus campaign NAME`).

The judge reads the record, tests the candidate against the incumbent at the procedure's next
level (:func:`check_candidate`), decides, and writes the record back with a compare-and-set on the
revision it read (:func:`record_after`, :meth:`CampaignStore.put`). A lost compare-and-set means
another candidate of the campaign was judged in between: the judge reads the record again and
tests against the new incumbent, at the new next level (docs/judge.md, "Campaigns").
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime

from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.events import (
    BaselineComparison,
    BenchmarkScores,
    CampaignCheck,
    DecisionView,
    TaskSpec,
    WorkspaceFile,
    utcnow,
)
from shared.kv_cas import RevisionConflict, write_at
from shared.kv_scan import latest
from shared.logs import get_logger
from shared.online_testing import PROCEDURE, OnlineState, two_sided_level
from shared.paired import BOOTSTRAP_SEED, compare_scores, describe_with_power
from shared.statistics import PairedComparison
from shared.subjects import Subjects

log = get_logger("ftbus.campaigns")

#: The judged candidates, and the accepted ones, a record keeps (the newest); each entry is also its own key.
RECENT_ENTRIES = 100


def entry_key(name: str, request_id: str) -> str:
    """The key of one judged candidate's entry: two tokens, so a read of the records alone
    (``<name>``, one token) passes over the entries."""
    return f"{name}.{request_id}"


def campaigns_bucket(subjects: Subjects) -> str:
    """The campaigns' KV bucket: the judge reads and writes it, agents read a campaign, dashboards all."""
    return subjects.kv_campaigns


def campaign_name_from(text: str, prefix: str = "") -> str:
    """A valid campaign name (``shared.events.CAMPAIGN_NAME``) for ``text``, e.g. a folder's name: every
    other character becomes ``-``; a name longer than 64 keeps its start and a hash of the whole, so
    two long texts that share their start stay two campaigns."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{prefix}{text}").strip("-_") or "campaign"
    if len(name) > 64:
        name = f"{name[:55]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return name


class CampaignNotYours(ValueError):
    """A request names a campaign another identity created (:func:`foreign_owner` says whose)."""


class CampaignConflict(RuntimeError):
    """The record changed since it was read: another candidate of the campaign was judged first."""


class CampaignEntry(BaseModel):
    """One judged candidate of a campaign."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    judged_at: datetime = Field(default_factory=utcnow)
    #: Its test's position and one-sided level; None when no test was made (no level spent).
    index: int | None = None
    level: float | None = None
    #: The incumbent it was compared with; None: the base model.
    incumbent: str | None = None
    paired: PairedComparison | None = None
    better: bool = False
    accepted: bool = False
    summary: str


class CampaignRecord(BaseModel):
    """A campaign: its benchmark and base model (fixed by its first candidate), the procedure's state,
    the incumbent with its validation scores, and the history."""

    model_config = ConfigDict(extra="forbid")

    name: str
    benchmark: str
    base_model: str
    #: The identity that created it (its first judged request's owner, shared/owners.py); None: unowned
    #: requests (and every campaign recorded before owners were). Only its owner's requests enter it.
    owner: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    procedure: str = PROCEDURE
    state: OnlineState = Field(default_factory=OnlineState)
    incumbent: str | None = None
    #: The incumbent's validation scores, without its error samples (model text the pairing does not need).
    incumbent_scores: BenchmarkScores | None = None
    #: The incumbent's trained outputs in the models store: the benchmark stage runs it on the
    #: confirmation pool's items to confirm a later candidate against it (services/benchmark/confirm.py).
    #: Empty in records from before that: then the pool confirms against the base model.
    incumbent_outputs: list[WorkspaceFile] = Field(default_factory=list)
    #: The last RECENT_ENTRIES judged candidates, oldest first (every one is its own key, ``entry_key``).
    history: list[CampaignEntry] = Field(default_factory=list)
    #: The last RECENT_ENTRIES accepted candidates in order (the last one is the incumbent).
    accepted_history: list[CampaignEntry] = Field(default_factory=list)
    #: Every candidate judged in it, and every one accepted, since it began.
    judged: int = 0
    accepted: int = 0
    #: The bucket's revision this record was read at (0: not stored yet); not stored itself.
    revision: int = Field(default=0, exclude=True)

    @model_validator(mode="after")
    def _counted(self) -> CampaignRecord:
        # A record from before the counts kept every entry: count them, and keep the window.
        if self.judged == 0 and self.history:
            self.accepted_history = [e for e in self.history if e.accepted][-RECENT_ENTRIES:]
            self.judged, self.accepted = len(self.history), sum(e.accepted for e in self.history)
            self.history = self.history[-RECENT_ENTRIES:]
        return self

    def entry(self, request_id: str) -> CampaignEntry | None:
        """This request's entry if the record still keeps it (``CampaignStore.entry`` reads any)."""
        return next((e for e in reversed(self.history) if e.request_id == request_id), None)

    @property
    def incumbents(self) -> list[CampaignEntry]:
        """The accepted candidates in order (the last RECENT_ENTRIES; the last one is the incumbent)."""
        return self.accepted_history


def _check_of(record: CampaignRecord, entry: CampaignEntry) -> CampaignCheck:
    return CampaignCheck(campaign=record.name, index=entry.index, level=entry.level, alpha=record.state.alpha,
                         procedure=record.procedure, incumbent=entry.incumbent, paired=entry.paired,
                         better=entry.better, summary=entry.summary, accepted=entry.accepted)


def recorded_check(record: CampaignRecord | None, entry: CampaignEntry | None) -> CampaignCheck | None:
    """A request's check as the campaign recorded it (a redelivered judgement: ``CampaignStore.entry``),
    or None."""
    return _check_of(record, entry) if record is not None and entry is not None else None


def check_candidate(record: CampaignRecord | None, name: str, task: TaskSpec, scores: BenchmarkScores | None,
                    baseline: BaselineComparison | None) -> CampaignCheck:
    """The candidate (its validation ``scores``, its comparison with the base model) against the
    campaign's incumbent, at the procedure's next level; with no incumbent yet, against the base model.
    ``better`` says whether it wins beyond noise; ``accepted`` is left False for the judge to decide."""
    state = record.state if record is not None else OnlineState()
    common = {"campaign": name, "alpha": state.alpha, "procedure": record.procedure if record else PROCEDURE}
    incumbent = record.incumbent if record is not None else None
    common["incumbent"] = incumbent
    if record is not None and (record.benchmark, record.base_model) != (task.benchmark, task.base_model):
        return CampaignCheck(**common, summary=(
            f"not compared: campaign {name} is on {record.benchmark} with base model {record.base_model}, "
            f"this candidate on {task.benchmark} with {task.base_model}"))
    if scores is None:
        return CampaignCheck(**common, summary="not compared: no validation scores")
    level = state.next_level()
    if incumbent is None or record is None or record.incumbent_scores is None:
        other, other_name = (baseline.baseline if baseline is not None else None), "the base model (no incumbent yet)"
        if other is None:
            return CampaignCheck(**common, summary=f"not compared: no baseline of the base model was measured, and "
                                                   f"campaign {name} has no incumbent yet")
    else:
        other, other_name = record.incumbent_scores, f"the incumbent {incumbent}"
    seed = baseline.paired.seed if baseline is not None and baseline.paired is not None else BOOTSTRAP_SEED
    paired, words = compare_scores(scores, other, level=two_sided_level(level), seed=seed, other_name=other_name)
    if paired is None:
        return CampaignCheck(**common, summary=f"not compared: {words}")
    return CampaignCheck(**common, index=state.next_index(), level=level, paired=paired, better=paired.improves(),
                         summary=describe_with_power(paired, other_name))


#: The procedure a campaign's candidate is tested by under judge_policy=better.
POOL_PROCEDURE = "the benchmark stage's decision: confirmed on the hidden pool at the owner's level"


def pool_decides(record: CampaignRecord | None, task: TaskSpec, decision: DecisionView | None) -> bool:
    """Whether the benchmark stage's decision is the campaign's test (under judge_policy=better): it
    was made, the campaign is on the candidate's benchmark and base model, and the record names its
    incumbent's trained outputs (a record from before they were kept is tested on validation, as under
    the other policies)."""
    if decision is None:
        return False
    if record is None:
        return True
    same_task = (record.benchmark, record.base_model) == (task.benchmark, task.base_model)
    return same_task and (record.incumbent is None or bool(record.incumbent_outputs))


def decided_check(record: CampaignRecord | None, name: str, decision: DecisionView) -> CampaignCheck:
    """The campaign's test under judge_policy=better: the decision, made against the incumbent the
    record names now (the base model while none is). No level of the campaign's own is spent: the
    owner's level covers all of its campaigns. A decision made against another incumbent (one was
    accepted while this candidate was measured) accepts nothing: the candidate is to be measured
    against the new one."""
    current = record.incumbent if record is not None else None
    common = {"campaign": name, "alpha": (record.state if record is not None else OnlineState()).alpha,
              "procedure": POOL_PROCEDURE, "incumbent": current}
    if decision.incumbent != current:
        then = f"the incumbent {decision.incumbent}" if decision.incumbent else "the base model"
        return CampaignCheck(**common, summary=(
            f"not accepted: the campaign's incumbent became {current} while this candidate was measured against "
            f"{then}; submit it again to be measured against {current}"))
    return CampaignCheck(**common, level=decision.level, better=decision.better, summary=decision.summary)


def foreign_owner(record: CampaignRecord | None, owner: str | None) -> str | None:
    """Why a request of ``owner`` may not enter the campaign ``record`` (another identity's), or None."""
    if record is None or record.owner == owner:
        return None
    return (f"campaign {record.name} belongs to {record.owner or 'unowned requests'}, and this request was "
            f"submitted {f'as {owner}' if owner else 'without an owner'}: only its owner's candidates enter a "
            "campaign (its error budget is its owner's); name a campaign of your own")


def record_after(record: CampaignRecord | None, request_id: str, task: TaskSpec, check: CampaignCheck,
                 scores: BenchmarkScores | None, owner: str | None = None,
                 outputs: list[WorkspaceFile] | None = None) -> CampaignRecord:
    """The campaign once ``check`` is decided (``check.accepted``): its entry appended, the procedure's
    state advanced when a test was made, and the candidate made the incumbent when accepted."""
    assert task.campaign is not None
    updated = (record.model_copy(deep=True) if record is not None
               else CampaignRecord(name=task.campaign, benchmark=task.benchmark, base_model=task.base_model,
                                   owner=owner))
    updated.revision = record.revision if record is not None else 0
    entry = CampaignEntry(request_id=request_id, index=check.index, level=check.level, incumbent=check.incumbent,
                          paired=check.paired, better=check.better, accepted=check.accepted, summary=check.summary)
    updated.history = [*updated.history, entry][-RECENT_ENTRIES:]
    updated.judged += 1
    if check.accepted:
        updated.accepted_history = [*updated.accepted_history, entry][-RECENT_ENTRIES:]
        updated.accepted += 1
    if check.index is not None:
        updated.state = updated.state.after(accepted=check.accepted)
    if check.accepted:
        assert scores is not None
        updated.incumbent = request_id
        updated.incumbent_scores = scores.model_copy(update={"error_samples": []})
        updated.incumbent_outputs = list(outputs or [])
    updated.updated_at = utcnow()
    return updated


class CampaignStore:
    """The campaigns bucket: read a record with its revision, write one by compare-and-set."""

    def __init__(self, bus: object) -> None:
        self.bus = bus  # a shared.bus.Bus, or the tests' in-memory one

    async def _kv(self) -> object:
        return await self.bus.kv(campaigns_bucket(self.bus.subjects))  # type: ignore[attr-defined]

    async def get(self, name: str) -> CampaignRecord | None:
        kv = await self._kv()
        try:
            entry = await kv.get(name)  # type: ignore[attr-defined]
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        record = CampaignRecord.model_validate_json(entry.value)
        record.revision = entry.revision
        return record

    async def records(self) -> list[CampaignRecord]:
        """Every campaign's record, read in one pass (a handful of records, changed only by the judge;
        the keys of one token, so not the judged candidates' entries, ``<name>.<request id>``); a record
        that does not decode is left out, with a warning. Needs a real bus (``bus.js``)."""
        bucket = campaigns_bucket(self.bus.subjects)  # type: ignore[attr-defined]
        js = self.bus.js  # type: ignore[attr-defined]
        try:
            await js.key_value(bucket)
        except BucketNotFoundError:
            return []  # no ftbus process has created the topology with campaigns yet
        found = []
        for change in await latest(js, bucket, keys="*"):
            try:
                found.append(CampaignRecord.model_validate_json(change.value or b""))
            except ValueError as exc:
                log.warning("unreadable campaign", campaign=change.key, error=str(exc))
        return found

    async def entry(self, record: CampaignRecord | None, request_id: str) -> CampaignEntry | None:
        """This request's entry in the campaign: from the record while it keeps it, else its own key."""
        if record is None:
            return None
        kept = record.entry(request_id)
        if kept is not None:
            return kept
        try:
            found = await (await self._kv()).get(entry_key(record.name, request_id))  # type: ignore[attr-defined]
        except KeyNotFoundError:
            return None
        return CampaignEntry.model_validate_json(found.value) if found.value else None

    async def put(self, record: CampaignRecord) -> CampaignRecord:
        """Write ``record`` if the stored one is still at ``record.revision`` (0: none stored); raise
        :class:`CampaignConflict` otherwise; then its newest entry under its own key (the record is the
        commit: a redelivery before that second write finds the entry in the record). Returns the
        record with its new revision."""
        kv = await self._kv()
        try:
            revision = await write_at(kv, record.name, record.model_dump_json().encode(), record.revision)
        except RevisionConflict as exc:
            raise CampaignConflict(record.name) from exc
        if record.history:
            newest = record.history[-1]
            await kv.put(entry_key(record.name, newest.request_id), newest.model_dump_json().encode())  # type: ignore[attr-defined]
        stored = record.model_copy()
        stored.revision = revision
        return stored
