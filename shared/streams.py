"""The JetStream streams of a deployment, and their idempotent creation.

Safe to run from every process at start-up, concurrently: the first one creates a stream, the
others find it, and every editable setting ftbus owns follows the configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from shared.settings import Settings
from shared.subjects import Subjects, fair_share_stages


class TopologyMismatch(RuntimeError):
    """A stream exists with settings this deployment cannot change in place."""


#: Stream settings the server refuses to change on an existing stream.
_FIXED_STREAM_FIELDS = ("storage", "retention")
#: Stream settings ensure_stream owns and updates when the configuration changes.
_EDITABLE_STREAM_FIELDS = (
    "subjects", "max_age", "num_replicas", "duplicate_window", "max_msgs_per_subject", "discard",
    "discard_new_per_subject", "description",
)


def stream_configs(s: Subjects, cfg: Settings, stages: Sequence[str] | None = None,
                   fair_share: Sequence[str] | None = None) -> list[api.StreamConfig]:
    """Every stream of the deployment. ``stages``: the pipeline's stage names, whose results the
    events stream holds (None: ftbus's own, shared.events.Stage); ``fair_share``: its stages with
    lanes (None: ftbus's own among ``stages``, shared.subjects.FAIR_SHARE_STAGES)."""
    common: dict[str, Any] = {
        "storage": api.StorageType.FILE,
        "num_replicas": cfg.stream_replicas,
        "max_age": cfg.event_max_age_s,
        "duplicate_window": cfg.duplicate_window_s,
    }
    results = {**common, "max_age": cfg.result_max_age_s}  # retention: results
    return [
        api.StreamConfig(name=s.stream_events, subjects=s.event_stream_subjects(stages),
                         retention=api.RetentionPolicy.LIMITS, description="ftbus requests and stage events",
                         **common),
        api.StreamConfig(name=s.stream_test, subjects=[s.bench_test],
                         description="hidden test split results: aggregator only", **common),
        # One message per subject, and the second one rejected: the server itself enforces
        # "exactly one verdict per request" on top of the aggregator's own bookkeeping.
        *(api.StreamConfig(name=name, subjects=[subject], max_msgs_per_subject=1, discard=api.DiscardPolicy.NEW,
                           discard_new_per_subject=True, **results)
          for name, subject in ((s.stream_verdicts, s.verdict()), (s.stream_reports, s.report()))),
        api.StreamConfig(name=s.stream_dlq, subjects=[s.dlq], **results),
        api.StreamConfig(name=s.stream_advisories,
                         subjects=[s.max_deliveries_advisory(stream) for stream in (s.stream_events, s.stream_test)],
                         **common),
        *(lanes_stream_config(s, cfg, stage) for stage in fair_share_stages(stages, fair_share)),
    ]


def lanes_stream_config(s: Subjects, cfg: Settings, stage: str) -> api.StreamConfig:
    """A fair-share stage's lanes (shared/lanes.py), created with the topology (stream management is
    the topology's users' alone: deploy/nats/accounts.conf). Limits
    retention (not work-queue, which allows no consumer over every lane): the worker deletes a
    request from it as it settles it, and the age limit removes what a lost delete left."""
    return api.StreamConfig(name=s.stream_lanes(stage), subjects=[s.lane(stage)],
                            retention=api.RetentionPolicy.LIMITS, storage=api.StorageType.FILE,
                            num_replicas=cfg.stream_replicas, max_age=cfg.event_max_age_s,
                            duplicate_window=cfg.duplicate_window_s,
                            description=f"{stage}'s waiting requests, a subject per campaign")


def _shown(value: Any) -> str:
    return str(getattr(value, "value", value))


def _differs(current: Any, wanted: Any) -> bool:
    if wanted is None:
        return False  # not ours: left as the server has it
    if isinstance(wanted, float) or isinstance(current, float):
        return abs((current or 0) - (wanted or 0)) > 1  # durations come back rounded
    if isinstance(wanted, list):
        return sorted(current or []) != sorted(wanted)
    return current != wanted


async def ensure_stream(js: JetStreamContext, config: api.StreamConfig) -> None:
    """Create the stream, or bring the settings ftbus owns of an existing one up to ``config``."""
    assert config.name
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        try:
            await js.add_stream(config)
            return
        except BadRequestError:
            # Another process created it between our lookup and our add: fall through to update.
            info = await js.stream_info(config.name)
    fixed = {name: (getattr(info.config, name), getattr(config, name)) for name in _FIXED_STREAM_FIELDS}
    clashes = {name: pair for name, pair in fixed.items() if pair[1] is not None and pair[0] != pair[1]}
    if clashes:
        # The server cannot change these in place: say so instead of running on the old ones.
        differences = ", ".join(f"{k} is {_shown(a)}, configured {_shown(b)}" for k, (a, b) in clashes.items())
        raise TopologyMismatch(
            f"stream {config.name} exists with settings that differ from this deployment's and cannot be "
            f"changed in place: {differences}; migrate the stream (or use another subject_prefix)"
        )
    # Every editable setting we own (subjects, retention ages, replicas, limits) follows the
    # configuration, on a stream that exists already too.
    if any(_differs(getattr(info.config, name), getattr(config, name)) for name in _EDITABLE_STREAM_FIELDS):
        await js.update_stream(config)
