"""Subjects, streams and durable consumers (docs/design.md, §4).

Stream layout, and why:
- EVENTS holds the request and every stage event. Retention is *limits*, not work-queue, because
  each event has two readers: the next stage and the aggregator.
- TEST holds only the hidden test split's results, so that NATS permissions can deny the judge
  and agents any access to it: the isolation is structural.
- VERDICTS, REPORTS and DLQ are separate streams so that each can be granted on its own.
- ADVISORIES captures the server's MAX_DELIVERIES advisories, so a dead letter is not lost
  while no aggregator is running.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.events import Stage


@dataclass(frozen=True)
class Subjects:
    prefix: str = "ftbus"

    @property
    def eval_requested(self) -> str:
        """A request no server-enforced identity owns: every such request spends one shared error
        budget (shared/owners.py). Agents under deploy/nats/accounts.conf may not publish here."""
        return f"{self.prefix}.eval.requested"

    def eval_requested_by(self, owner: str = "*") -> str:
        """A request of ``owner``: under deploy/nats/accounts.conf each agent user may publish on its own
        owner's subject only, so the server vouches for whose error budget a request spends."""
        return f"{self.prefix}.eval.requested.{owner}"

    def owner_of(self, subject: str) -> str | None:
        """The owner a request's subject names; None on the unowned subject (or any other)."""
        head = f"{self.prefix}.eval.requested."
        owner = subject[len(head):] if subject.startswith(head) else ""
        return owner if owner and "." not in owner else None

    def is_request(self, subject: str) -> bool:
        return subject == self.eval_requested or self.owner_of(subject) is not None

    @property
    def cancel(self) -> str:
        return f"{self.prefix}.control.cancel"

    def completed(self, stage: str) -> str:
        """Where ``stage`` (a pipeline stage's name) publishes its result when it succeeded."""
        return f"{self.prefix}.{stage}.completed"

    def failed(self, stage: str) -> str:
        """Where ``stage`` publishes its result when the candidate failed there."""
        return f"{self.prefix}.{stage}.failed"

    @property
    def bench_test(self) -> str:
        """The hidden test split's results: the one subject of the TEST stream (the bench stage's
        spec lists it among what it ``emits``)."""
        return f"{self.prefix}.bench.test"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    def verdict(self, request_id: str = "*") -> str:
        return f"{self.prefix}.verdict.{request_id}"

    def report(self, request_id: str = "*") -> str:
        return f"{self.prefix}.report.{request_id}"

    def progress(self, request_id: str = "*") -> str:
        return f"{self.prefix}.progress.{request_id}"

    def lane(self, stage: str, lane: str = "*") -> str:
        """Where a fair-share stage's requests of one campaign wait (shared/lanes.py)."""
        return f"{self.prefix}.lanes.{stage}.{lane}"

    # ----------------------------------------------------------- streams

    @property
    def stream_events(self) -> str:
        return f"{self.prefix.upper()}_EVENTS"

    @property
    def stream_test(self) -> str:
        return f"{self.prefix.upper()}_TEST"

    @property
    def stream_verdicts(self) -> str:
        return f"{self.prefix.upper()}_VERDICTS"

    @property
    def stream_reports(self) -> str:
        return f"{self.prefix.upper()}_REPORTS"

    @property
    def stream_dlq(self) -> str:
        return f"{self.prefix.upper()}_DLQ"

    @property
    def stream_advisories(self) -> str:
        return f"{self.prefix.upper()}_ADVISORIES"

    def stream_lanes(self, stage: str) -> str:
        """A fair-share stage's waiting requests, one subject per campaign; a request is deleted from
        it when its stage settles it. A stream per stage, so that a stage's user may read and ack its
        own lanes only (its consumers' names are not subject tokens)."""
        return f"{self.prefix.upper()}_LANES_{stage.upper()}"

    def max_deliveries_advisory(self, stream: str | None = None, durable: str = "*") -> str:
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream or self.stream_events}.{durable}"

    def event_stream_subjects(self, stages: Sequence[str] | None = None) -> list[str]:
        """The events stream's subjects: the request, cancels, and the results of ``stages`` (the
        pipeline's stage names, from its table; None: ftbus's own, :func:`pipeline_stages`), the
        hidden test split's excepted: it has a stream of its own."""
        stages = [stage for stage in pipeline_stages(stages) if stage != Stage.aggregate]
        return [self.eval_requested, self.eval_requested_by(), self.cancel,
                *(subject for stage in stages for subject in (self.completed(stage), self.failed(stage)))]

    # ----------------------------------------------------------- consumers

    def durable(self, stage: str) -> str:
        return f"{self.prefix}-{stage}"

    def lane_durable(self, stage: str, lane: str) -> str:
        """The durable consumer of one lane of a fair-share stage."""
        return f"{self.prefix}-{stage}-lane-{lane}"

    def lanes_gauge(self, stage: str) -> str:
        """A fair-share stage's consumer of every lane together, never read: its lag is the requests
        waiting or in work at the stage, which an autoscaler reads (KEDA: deploy/k8s-keda)."""
        return f"{self.prefix}-{stage}-lanes"

    # ----------------------------------------------------------- buckets

    @property
    def kv_requests(self) -> str:
        """The aggregator's full records (they hold test-split results): aggregator and dashboards only."""
        return f"{self.prefix}_requests"

    @property
    def kv_status(self) -> str:
        """The public view of each record (no test data): workers, agents, `ftbus status`."""
        return f"{self.prefix}_status"

    @property
    def kv_campaigns(self) -> str:
        """One record per campaign (shared/campaigns.py: the incumbent, its validation scores, the
        online procedure's state, the history): only validation data. The judge reads and writes it,
        agents read a campaign (`ftbus campaign NAME`), dashboards read them all."""
        return f"{self.prefix}_campaigns"

    @property
    def kv_owners(self) -> str:
        """One error budget per owner (shared/owners.py): the bench stage reads and writes it by
        compare-and-set, dashboards read it; agents neither."""
        return f"{self.prefix}_owners"

    def kv_stage_results(self, stage: str) -> str:
        """One bucket per stage, so NATS permissions can give each stage only its own (the bench
        stage's holds test-split results)."""
        return f"{self.prefix}_results_{stage}"

    @property
    def object_store(self) -> str:
        return f"{self.prefix}_artifacts"

    @property
    def object_store_cache(self) -> str:
        """Content-addressed caches (data, validation baselines): written by workers only, so an
        agent, who may write ftbus_artifacts, cannot plant a cache entry for someone else."""
        return f"{self.prefix}_cache"

    @property
    def object_store_private(self) -> str:
        """Test-split logs and caches: the evaluation's own trust domain, never readable by agents."""
        return f"{self.prefix}_private"

    @property
    def object_store_models(self) -> str:
        """Trained outputs (``<request_id>/output/...``): written by train, read by bench and by
        agents (`ftbus pull`), who read nothing else of the stores. No age limit of the server's:
        the aggregator's retention sweep expires them, keeping each leaderboard's best."""
        return f"{self.prefix}_models"

    @property
    def object_store_checkpoints(self) -> str:
        """Training checkpoints (``<request_id>/attempt-<n>/checkpoint-<step>/...`` and the
        request's ``manifest.json``): trainer-private resume state, written and read by train,
        removed by train and by the aggregator's retention sweep; never read by agents."""
        return f"{self.prefix}_checkpoints"


def pipeline_stages(stages: Sequence[str] | None = None) -> list[str]:
    """The stage names of a pipeline: ``stages`` (from its table, ``spec.stage`` of each row), else
    ftbus's own. shared/ cannot import ftbus's table (ftbus/stages.py imports the services), so a
    caller without a table (``Bus.ensure_topology()``, `ftbus topology`) gets the names of
    :class:`~shared.events.Stage`, which tests/unit/test_pipeline_specs.py holds equal to the table's."""
    return list(Stage if stages is None else stages)


#: ftbus's own fair-share stages (the rows that say ``fair_share``, shared/lanes.py), for the same
#: callers without a table; tests/unit/test_pipeline_specs.py holds it equal to the table's.
FAIR_SHARE_STAGES: tuple[str, ...] = ("train", "bench")


def fair_share_stages(stages: Sequence[str] | None = None, fair_share: Sequence[str] | None = None) -> list[str]:
    """The stages with lanes (a lanes stream each) in the pipeline of ``stages``: ``fair_share`` (from
    its table), else those of ftbus's own that it has."""
    if fair_share is not None:
        return list(fair_share)
    return [stage for stage in pipeline_stages(stages) if stage in FAIR_SHARE_STAGES]


def topology_stream_names(subjects: Subjects, stages: Sequence[str] | None = None,
                          fair_share: Sequence[str] | None = None) -> list[str]:
    """Every stream `Bus.ensure_topology` creates for the pipeline of ``stages`` (:func:`pipeline_stages`),
    KV buckets and object stores included (as the server names them): what a readiness check must
    find before a restricted worker starts."""
    return [
        subjects.stream_events,
        subjects.stream_test,
        subjects.stream_verdicts,
        subjects.stream_reports,
        subjects.stream_dlq,
        subjects.stream_advisories,
        *(subjects.stream_lanes(stage) for stage in fair_share_stages(stages, fair_share)),
        f"KV_{subjects.kv_requests}",
        f"KV_{subjects.kv_status}",
        f"KV_{subjects.kv_campaigns}",
        f"KV_{subjects.kv_owners}",
        *(f"KV_{subjects.kv_stage_results(stage)}" for stage in pipeline_stages(stages)),
        f"OBJ_{subjects.object_store}",
        f"OBJ_{subjects.object_store_cache}",
        f"OBJ_{subjects.object_store_private}",
        f"OBJ_{subjects.object_store_models}",
        f"OBJ_{subjects.object_store_checkpoints}",
    ]


def msg_id(request_id: str, stage: str, kind: str) -> str:
    """The ``Nats-Msg-Id`` of docs/design.md §5: ``<request_id>:<stage>:<kind>``."""
    return f"{request_id}:{stage}:{kind}"
