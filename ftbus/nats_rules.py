"""The NATS permission rules' vocabulary: users, their allow/deny groups, and the families of
JetStream API subjects over the code's names (shared/subjects.py). ftbus/permissions.py writes each
user's rules with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.subjects import Subjects, fair_share_stages, pipeline_stages

# A group of rules: the comment above them ("" for none) and the subjects.
Group = tuple[str, list[str]]


@dataclass
class Rules:
    allow: list[Group]
    deny: list[Group] = field(default_factory=list)


@dataclass
class User:
    name: str
    comment: str
    publish: Rules | None  # None: everything
    subscribe: Rules | None


class Topology:
    """The code's names (one prefix), and the families of JetStream API subjects over them."""

    def __init__(self, subjects: Subjects, stages: Sequence[str] | None = None,
                 fair_share: Sequence[str] | None = None) -> None:
        self.s = subjects
        #: The pipeline's stages (each has its results bucket).
        self.stages = tuple(pipeline_stages(stages))
        #: Its stages with lanes (each has its lanes stream).
        self.fair_share = tuple(fair_share_stages(stages, fair_share))

    # ------------------------------------------------------------------ names

    def kv(self, bucket: str) -> str:
        return f"KV_{bucket}"

    def obj(self, store: str) -> str:
        return f"OBJ_{store}"

    def durable(self, stage: str, suffix: str = "") -> str:
        return self.s.durable(stage) + suffix

    def streams(self) -> list[str]:
        s = self.s
        return [s.stream_events, s.stream_test, s.stream_verdicts, s.stream_reports, s.stream_dlq,
                s.stream_advisories, *(s.stream_lanes(stage) for stage in self.fair_share)]

    def buckets(self) -> list[str]:
        return [self.s.kv_requests, self.s.kv_status, self.s.kv_campaigns, self.s.kv_owners,
                *(self.s.kv_stage_results(stage) for stage in self.stages)]

    def stores(self) -> list[str]:
        return [self.s.object_store, self.s.object_store_cache, self.s.object_store_private, self.s.object_store_models,
                self.s.object_store_checkpoints]

    # ------------------------------------------------------------------ API families

    @staticmethod
    def any_read(stream: str) -> list[str]:
        """Every consumer API, message get and direct get of a stream: any way to read its data."""
        return [
            f"$JS.API.CONSUMER.*.{stream}", f"$JS.API.CONSUMER.*.{stream}.>",
            f"$JS.API.CONSUMER.*.*.{stream}", f"$JS.API.CONSUMER.*.*.{stream}.>",
            f"$JS.API.STREAM.MSG.*.{stream}", f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
        ]

    def deny_test_stream(self) -> Group:
        t = self.s.stream_test
        return (
            f"{t}: consumers (create/info/fetch/delete/list), message get, direct get, snapshot, and\n"
            "any stream create/update (sources/mirror)",
            [*self.any_read(t),
             f"$JS.API.STREAM.SNAPSHOT.{t}", f"$JS.API.STREAM.PURGE.{t}", f"$JS.API.STREAM.DELETE.{t}",
             "$JS.API.STREAM.CREATE.*", "$JS.API.STREAM.UPDATE.*",
             f"$JS.ACK.{t}.>", f"$JS.FC.{t}.>"],
        )

    def deny_reports_and_dlq(self) -> list[Group]:
        r, d = self.s.stream_reports, self.s.stream_dlq
        return [
            (f"{r}: the same", [*self.any_read(r), f"$JS.API.STREAM.SNAPSHOT.{r}"]),
            (f"{d}: dead letters may carry a test result's payload (a bench.test message the\n"
             "aggregator failed max_deliver times)", self.any_read(d)),
        ]

    def deny_bucket(self, bucket: str, comment: str, *, writes: bool = True) -> Group:
        stream = self.kv(bucket)
        rules = [*self.any_read(stream), f"$JS.API.STREAM.SNAPSHOT.{stream}", f"$JS.FC.{stream}.>"]
        return comment, rules + ([f"$KV.{bucket}.>"] if writes else [])

    def deny_store(self, store: str, comment: str) -> Group:
        stream = self.obj(store)
        return comment, [*self.any_read(stream), f"$JS.API.STREAM.SNAPSHOT.{stream}",
                         f"$JS.API.STREAM.PURGE.{stream}", f"$JS.FC.{stream}.>", f"$O.{store}.>"]

    def deny_requests(self, writes: bool = True) -> Group:
        return self.deny_bucket(self.s.kv_requests, "the full records (benchmark_test, report)", writes=writes)

    def deny_test_results(self, stage: str, writes: bool = True) -> Group:
        """The results bucket of ``stage``, the one that publishes the hidden test split's results."""
        return self.deny_bucket(
            self.s.kv_stage_results(stage),
            f"the {stage} stage's results (`<id>.{stage}` holds the test BenchResult)",
            writes=writes,
        )

    def deny_private(self) -> Group:
        return self.deny_store(self.s.object_store_private, "the private store (test-split logs, test baselines)")

    def deny_cache(self, why: str = "") -> Group:
        return self.deny_store(
            self.s.object_store_cache,
            why or "the workers-only cache store: any read, and any write (a planted data or baseline\n"
            "cache entry would be served to other requests)",
        )

    def deny_forging(self, *, bench_test: bool = True) -> Group:
        s = self.s
        rules = ([s.bench_test] if bench_test else []) + [
            f"{s.prefix}.verdict.>", f"{s.prefix}.report.>", f"$KV.{s.kv_status}.>"]
        return "forging test results, verdicts, reports or the public view", rules

    def subscribe_deny(self) -> Group:
        s = self.s
        return (
            "core subscriptions to the test and report subjects, dead letters and advisories (API\n"
            "audit advisories carry API responses)",
            [s.bench_test, f"{s.prefix}.report.>", s.dlq, "$JS.EVENT.>"],
        )

    def stage_consumer(self, stage: str) -> Group:
        d, e = self.durable(stage), self.s.stream_events
        return (
            f"its durable consumer {d} on {e}: create, info, fetch, ack",
            [f"$JS.API.CONSUMER.DURABLE.CREATE.{e}.{d}", f"$JS.API.CONSUMER.CREATE.{e}.{d}.>",
             f"$JS.API.CONSUMER.INFO.{e}.{d}", f"$JS.API.CONSUMER.MSG.NEXT.{e}.{d}", f"$JS.ACK.{e}.{d}.>"],
        )

    def stage_lanes(self, stage: str) -> Group:
        """A fair-share stage's lanes (shared/lanes.py): its own stream (the topology's), a consumer per
        campaign (any name within that stream), copies of its requests into them."""
        st = self.s.stream_lanes(stage)
        return (
            f"fair share: its lanes stream {st} (delete a settled request), the copies of its requests\n"
            "into its lanes, their consumers and the gauge (list, create, info, fetch, ack)",
            [f"$JS.API.STREAM.MSG.DELETE.{st}",
             self.s.lane(stage), f"$JS.API.CONSUMER.LIST.{st}",
             f"$JS.API.CONSUMER.DURABLE.CREATE.{st}.*", f"$JS.API.CONSUMER.CREATE.{st}.*",
             f"$JS.API.CONSUMER.CREATE.{st}.*.>", f"$JS.API.CONSUMER.INFO.{st}.*",
             f"$JS.API.CONSUMER.MSG.NEXT.{st}.*", f"$JS.ACK.{st}.*.>"],
        )

    def kv_read(self, bucket: str) -> list[str]:
        """KV get (message get, or direct get on an allow_direct bucket)."""
        stream = self.kv(bucket)
        return [f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]

    def store_read(self, store: str) -> list[str]:
        """Object get: the metadata and an object of one chunk (message get), the chunks of a larger
        one (ordered consumer + flow control)."""
        stream = self.obj(store)
        return [f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>"]

    def store_write(self, store: str) -> list[str]:
        """Object put: chunks, metadata, and the purge of a replaced object's old chunks."""
        return [f"$O.{store}.C.*", f"$O.{store}.M.*", f"$JS.API.STREAM.PURGE.{self.obj(store)}"]

    def inboxes(self, program: str) -> str:
        return f"_INBOX.{program}.>"


# Connection names, so inbox prefixes (`_INBOX.<name>`): fixed, whatever the subject prefix.
WAIT_TOPOLOGY = "ftbus-wait-topology"  # deploy/k8s init container (python -m ftbus.topology wait)
CLIENT = "ftbus-client"  # the ftbus CLI and Client (settings.client_name's default)
DASHBOARD = "dashboard"  # dashboards (FTBUS_CLIENT_NAME=dashboard)


def worker_connection(stage: str) -> str:
    """`ftbus worker STAGE`'s connection name (ftbus/cli.py)."""
    return f"ftbus-{stage}"
