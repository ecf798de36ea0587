"""Prometheus metrics of every ftbus process (docs/operations.md, "Metrics").

The metrics live in prometheus_client's default registry, one per process: ``ftbus worker STAGE``,
``ftbus up`` (every stage in one process, one endpoint) and the dashboard. :func:`serve` starts
prometheus_client's own HTTP server on ``metrics_port``; the dashboard serves the same text on its
own server's ``/metrics`` route. What is counted, and where:

- each stage message's handling: the stage worker's :class:`MetricsPolicy` (shared/runtime.py's
  hooks): durations and outcomes, in flight, redeliveries, the consumer's queue (read from
  JetStream's consumer info every ``metrics_poll_s``);
- GPU slots busy: the device gate of the consumer loop (shared/consumer.py);
- sandbox runs and how they ended: runners/metered.py;
- LLM tokens: the data stage's gateway, the judge, the benchmark's answer check;
- verdict latency and dead letters: the aggregator;
- resumed trainings: :func:`training_resumed`, for the trainer.

Labels are bounded: a stage's name, an outcome, a cause, a source from fixed sets, never a request
id, a model name or anything else a request chooses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from shared.events import StageOutcome
from shared.logs import get_logger

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from runners.base import RunResult
    from shared.runtime import Outgoing
    from shared.settings import Settings

log = get_logger("ftbus.metrics")

#: How a stage's handling of one message ended.
Outcome = Literal["ok", "candidate_failure", "infrastructure_failure", "cancelled", "timeout"]
OUTCOMES: tuple[str, ...] = ("ok", "candidate_failure", "infrastructure_failure", "cancelled", "timeout")
#: How a sandbox run ended (runners/metered.py: :func:`runners.metered.exit_cause`).
CAUSES: tuple[str, ...] = ("ok", "error", "timeout", "cancelled", "oom", "quota", "not_found", "cannot_execute",
                           "signal")
#: Who spent LLM tokens.
SOURCES: tuple[str, ...] = ("data_gateway", "judge", "answer_check")
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")

# Seconds: a judge's handling takes milliseconds, a training hours.
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400,
                 43200, 86400, float("inf"))

STAGE_DURATION = Histogram("ftbus_stage_duration_seconds", "One message's handling by a stage, by how it ended.",
                           ["stage", "outcome"], buckets=STAGE_BUCKETS)
STAGE_OUTCOMES = Counter("ftbus_stage_outcomes", "Messages a stage handled, by how the handling ended.",
                         ["stage", "outcome"])
IN_FLIGHT = Gauge("ftbus_stage_in_flight", "Messages this process's workers of a stage are handling now.",
                  ["stage"])
QUEUED = Gauge("ftbus_stage_queued", "A stage consumer's messages not yet done (JetStream num_pending + "
               "num_ack_pending), as this process last read it.", ["stage", "consumer"])
WAITING = Gauge("ftbus_stage_waiting", "A stage consumer's messages no worker has taken yet (num_pending).",
                ["stage", "consumer"])
LAST_ACK = Gauge("ftbus_stage_last_ack_timestamp_seconds", "When the stage consumer's ack floor last moved "
                 "(JetStream ack_floor.last_active), Unix time; 0: never.", ["stage", "consumer"])
REDELIVERIES = Counter("ftbus_stage_redeliveries", "Handlings of a message delivered before (deliveries > 1).",
                       ["stage"])
DEAD_LETTERS = Counter("ftbus_dead_letters", "Dead letters the aggregator read, by the stage they name.", ["stage"])
DEAD_LETTERS_STORED = Gauge("ftbus_dead_letters_stored", "Messages in the dead-letter stream (the dashboard "
                            "reads it every dashboard_poll_s).")
GPU_SLOTS = Gauge("ftbus_gpu_slots", "Device (GPU) slots of this process's workers of a stage.", ["stage"])
GPU_SLOTS_BUSY = Gauge("ftbus_gpu_slots_busy", "Device slots held by a message now.", ["stage"])
SANDBOX_RUNS = Counter("ftbus_sandbox_runs", "Runs of candidate code, by sandbox kind and how they ended.",
                       ["stage", "sandbox", "cause"])
LLM_TOKENS = Counter("ftbus_llm_tokens", "LLM tokens spent, as the upstream reported them.", ["source", "kind"])
LLM_CALLS = Counter("ftbus_llm_calls", "LLM calls made (the data gateway: those it forwarded).", ["source"])
VERDICT_LATENCY = Histogram("ftbus_verdict_latency_seconds", "From a request's submission to its verdict's "
                            "publication, by verdict status.", ["status"], buckets=STAGE_BUCKETS)
TRAINING_RESUMED = Counter("ftbus_training_resumed", "Trainings resumed from a checkpoint instead of step 0.")
TRAINING_STEPS_SAVED = Counter("ftbus_training_steps_saved", "Training steps not run again thanks to a resume.")


def stage_label(name: object) -> str:
    """A stage's name as a label: a short lower-case name (ftbus's stages, a pipeline's extra one), else
    ``other``; None: ``unknown``."""
    if name is None or name == "":
        return "unknown"
    text = str(name)
    return text if _NAME.fullmatch(text) else "other"


def _one_of(value: str, allowed: Iterable[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {sorted(allowed)}: a metric's labels are a fixed set")
    return value


# ---------------------------------------------------------------------------- outcomes


def outcome_of(outgoing: list[Outgoing]) -> Outcome:
    """How a handling that published ``outgoing`` ended: ``ok``, or the candidate's failure
    (``timeout`` when a run of its code was killed at the stage timeout)."""
    failed = [out.event for out in outgoing if out.kind.endswith("failed")]
    if not failed:
        return "ok"
    if any(run.timed_out for event in failed for run in _runs(event)):
        return "timeout"
    return "candidate_failure"


def _runs(event: Any) -> list[Any]:
    """The run of candidate code an event reports: its stage's own outcome (shared/events: StageResult)."""
    found = getattr(event, "outcome", None)
    return [found] if isinstance(found, StageOutcome) else []


def stage_done(stage: str, outcome: str, seconds: float) -> None:
    """One handling of ``stage`` ended with ``outcome`` after ``seconds``."""
    labels = (stage_label(stage), _one_of(outcome, OUTCOMES, "outcome"))
    STAGE_OUTCOMES.labels(*labels).inc()
    STAGE_DURATION.labels(*labels).observe(max(0.0, seconds))


def since(started: datetime) -> float:
    return (datetime.now(UTC) - started).total_seconds()


def queue_seen(stage: str, consumer: str, info: Any) -> None:
    """A stage consumer's state as JetStream's consumer info (``info``) says it."""
    labels = (stage_label(stage), consumer)
    pending, ack_pending = int(info.num_pending or 0), int(info.num_ack_pending or 0)
    QUEUED.labels(*labels).set(pending + ack_pending)
    WAITING.labels(*labels).set(pending)
    last = info.ack_floor.last_active if info.ack_floor is not None else None
    LAST_ACK.labels(*labels).set(last.timestamp() if last is not None else 0.0)


def lanes_seen(stage: str, waiting: int, working: int) -> None:
    """A fair-share stage's lanes together (shared/lanes.py), under the consumer label ``lanes``."""
    labels = (stage_label(stage), "lanes")
    QUEUED.labels(*labels).set(waiting + working)
    WAITING.labels(*labels).set(waiting)


# ---------------------------------------------------------------------------- the other hooks


def gpu_slots(stage: str, slots: int) -> None:
    """A worker of ``stage`` with ``slots`` device slots started (negative: stopped); the process's
    workers of a stage add up."""
    GPU_SLOTS.labels(stage_label(stage)).inc(slots)


def gpu_slot_taken(stage: str) -> None:
    GPU_SLOTS_BUSY.labels(stage_label(stage)).inc()


def gpu_slot_freed(stage: str) -> None:
    GPU_SLOTS_BUSY.labels(stage_label(stage)).dec()


def sandbox_run(stage: str, result: RunResult, cause: str) -> None:
    """A run of candidate code ended with ``cause`` (:data:`CAUSES`)."""
    kind = (result.sandbox or "local").split(":", 1)[0]  # docker:<image> -> docker: one series per kind
    SANDBOX_RUNS.labels(stage_label(stage), stage_label(kind), _one_of(cause, CAUSES, "cause")).inc()


def llm_call(source: str) -> None:
    LLM_CALLS.labels(_one_of(source, SOURCES, "source")).inc()


def llm_tokens(source: str, prompt: int, completion: int) -> None:
    """Tokens one LLM call spent, as the upstream's ``usage`` said."""
    _one_of(source, SOURCES, "source")
    LLM_TOKENS.labels(source, "prompt").inc(max(0, prompt))
    LLM_TOKENS.labels(source, "completion").inc(max(0, completion))


def dead_letter(stage: str | None) -> None:
    DEAD_LETTERS.labels(stage_label(stage)).inc()


def verdict_published(status: str, submitted_at: datetime | None) -> None:
    """A verdict went out; ``submitted_at``: when its request was submitted (unknown: not observed)."""
    histogram = VERDICT_LATENCY.labels(_one_of(status, ("completed", "error", "cancelled"), "status"))
    if submitted_at is not None:
        histogram.observe(max(0.0, since(submitted_at)))


def training_resumed(steps_saved: int) -> None:
    """A training resumed from a checkpoint at step ``steps_saved`` instead of from step 0: call it once
    per resumed training, as it starts (the trainer, issue 37's resume)."""
    TRAINING_RESUMED.inc()
    TRAINING_STEPS_SAVED.inc(max(0, steps_saved))


# ---------------------------------------------------------------------------- serving


def exposition() -> tuple[bytes, str]:
    """This process's metrics as Prometheus text, and its content type (the dashboard's route)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


@dataclass
class MetricsServer:
    """prometheus_client's HTTP server (a daemon thread) serving ``/metrics``."""

    server: WSGIServer
    url: str

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(settings: Settings) -> MetricsServer | None:
    """Serve this process's metrics on ``metrics_host:metrics_port`` (0: a free port; a busy port: a free
    one, with a warning); None when ``metrics_enabled`` is off. The URL is logged."""
    if not settings.metrics_enabled:
        return None
    host, port = settings.metrics_host, settings.metrics_port
    try:
        server, _ = start_http_server(port, addr=host)
    except OSError as exc:
        if port == 0:
            raise
        log.warning("metrics port busy: using a free one", port=port, error=str(exc))
        server, _ = start_http_server(0, addr=host)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/metrics"
    log.info("metrics serving", url=url)
    return MetricsServer(server, url)
