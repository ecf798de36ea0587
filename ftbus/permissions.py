"""NATS permissions: deploy/nats/accounts.conf, generated from the code's topology.

Every subject, stream, KV bucket, Object Store and durable consumer name below comes from
shared/subjects.py, so a rename there changes the rules with it; what each user may do is written
here, once. The generated file must equal the committed one (tests/integration/
test_permissions_drift.py), and tests/integration/test_permissions.py checks every user's allowed
and denied operations on a live server running it.

    .venv/bin/python -m ftbus.permissions              # print accounts.conf
    .venv/bin/python -m ftbus.permissions --write      # regenerate deploy/nats/accounts.conf
    .venv/bin/python -m ftbus.permissions --check      # exit 1 if the committed file differs
    .venv/bin/python -m ftbus.permissions --prefix P   # for FTBUS_SUBJECT_PREFIX=P
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ftbus.stages import PIPELINE
from shared.events import Stage
from shared.stagespec import StageSpec
from shared.subjects import Subjects

ACCOUNTS_CONF = Path(__file__).resolve().parent.parent / "deploy" / "nats" / "accounts.conf"

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

    def __init__(self, subjects: Subjects, stages: Sequence[str] = tuple(Stage)) -> None:
        self.s = subjects
        #: The pipeline's stages (each has its results bucket).
        self.stages = tuple(stages)

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
                s.stream_advisories]

    def buckets(self) -> list[str]:
        return [self.s.kv_requests, self.s.kv_status, self.s.kv_campaigns,
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

    def deny_bench_results(self, writes: bool = True) -> Group:
        return self.deny_bucket(
            self.s.kv_stage_results(Stage.bench),
            "the bench stage's results (`<id>.bench` holds the test BenchResult)",
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
CLIENT = "ftbus-client"  # the ftbus CLI and FtbusClient (settings.client_name's default)
DASHBOARD = "dashboard"  # dashboards (FTBUS_CLIENT_NAME=dashboard)


def worker_connection(stage: str) -> str:
    """`ftbus worker STAGE`'s connection name (ftbus/cli.py)."""
    return f"ftbus-{stage}"


def users(subjects: Subjects | None = None, pipeline: Sequence[StageSpec] = PIPELINE) -> list[User]:
    """Every NATS user of ``pipeline`` (ftbus's own by default): what each may publish and
    subscribe to. A stage ftbus does not know by name gets a worker user made from its row alone."""
    t = Topology(subjects or Subjects(), [spec.stage for spec in pipeline])
    s = t.s
    p = s.prefix
    rows = {spec.stage: spec for spec in pipeline}
    results = {stage: s.kv_stage_results(stage) for stage in t.stages}
    artifacts, cache, private = s.object_store, s.object_store_cache, s.object_store_private
    models = s.object_store_models
    checkpoints = s.object_store_checkpoints
    topology_lookup: Group = ("ensure_topology(): metadata only; stream names for js.subscribe()",
                              ["$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES"])
    status_read: Group = ("the cancel check (shared/runtime.py): the public view, read only",
                          t.kv_read(s.kv_status))

    def worker_subscribe(stage: str) -> Rules:
        return Rules(
            allow=[(f"`ftbus worker {stage}`'s replies; the deploy/k8s init container (see data);\n"
                    "cancels (kill a cancelled request's work)",
                    [t.inboxes(worker_connection(stage)), t.inboxes(WAIT_TOPOLOGY), s.cancel])],
            deny=[t.subscribe_deny()],
        )

    def stage_results(stage: str) -> Group:
        bucket = results[stage]
        return f"its own idempotency bucket {bucket}: read and write", [*t.kv_read(bucket), f"$KV.{bucket}.>"]

    agg = Stage.aggregate
    agg_consumers = [
        (s.stream_events, t.durable(agg)),
        (s.stream_test, t.durable(agg, "-test")),
        (s.stream_dlq, t.durable(agg, "-dlq")),
        (s.stream_advisories, t.durable(agg, "-advisories")),
    ]
    creates: list[str] = []
    for stream in t.streams():
        creates += [f"$JS.API.STREAM.CREATE.{stream}", f"$JS.API.STREAM.UPDATE.{stream}"]
    creates += [f"$JS.API.STREAM.CREATE.{t.kv(b)}" for b in t.buckets()]
    creates += [f"$JS.API.STREAM.CREATE.{t.obj(o)}" for o in t.stores()]

    aggregate = User(
        "aggregate",
        "`ftbus worker aggregate`: reads every stage event, the test stream, dead letters and\n"
        "advisories; owns the request records and writes their public view; publishes verdicts and\n"
        "reports. It may create/update the ftbus streams so that it can bootstrap the topology by\n"
        "itself.",
        Rules(
            allow=[
                (f"ensure_topology(): look up, create or update the {len(t.streams())} streams, "
                 f"{len(t.buckets())} KV buckets and {len(t.stores())} Object Stores",
                 ["$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES", *creates]),
                ("its four durable pull consumers: create, info, fetch, ack",
                 [f"$JS.API.CONSUMER.DURABLE.CREATE.{st}.{d}" for st, d in agg_consumers]
                 + [f"$JS.API.CONSUMER.CREATE.{st}.{d}.>" for st, d in agg_consumers]
                 + [f"$JS.API.CONSUMER.INFO.{st}.{d}" for st, d in agg_consumers]
                 + [f"$JS.API.CONSUMER.MSG.NEXT.{st}.{d}" for st, d in agg_consumers]
                 + [f"$JS.ACK.{st}.{d}.>" for st, d in agg_consumers]),
                ("a MAX_DELIVERIES advisory names a stream sequence: fetch that message to put its\n"
                 "payload in the dead letter (_on_max_deliveries)",
                 [f"$JS.API.STREAM.MSG.GET.{s.stream_events}", f"$JS.API.STREAM.MSG.GET.{s.stream_test}"]),
                ("request records: get, create/update (compare-and-set), and the sweeper's look at\n"
                 "the open ones (an ordered, headers-only consumer on the KV stream; it reads its\n"
                 "consumer's num_pending)",
                 [f"$JS.API.STREAM.MSG.GET.{t.kv(s.kv_requests)}", f"$KV.{s.kv_requests}.>",
                  f"$JS.API.CONSUMER.CREATE.{t.kv(s.kv_requests)}",
                  f"$JS.API.CONSUMER.INFO.{t.kv(s.kv_requests)}.*", f"$JS.FC.{t.kv(s.kv_requests)}.>"]),
                ("the public view of each record (RequestStatusView): compare-and-set, and a read\n"
                 "when another aggregator wrote one first (the newer view stays)",
                 [f"$KV.{s.kv_status}.>", f"$JS.API.STREAM.MSG.GET.{t.kv(s.kv_status)}"]),
                ("what it publishes (no stage-results bucket: the aggregator's state is its record;\n"
                 "and no Object Store: it never reads or writes artifacts)",
                 [s.verdict(), s.report(), s.dlq]),
                (f"the trained outputs' retention (services/aggregator/retention.py): list {models}'s\n"
                 "objects, read and write each request's ranking and expiry marker, delete expired outputs",
                 [*t.store_read(models), *t.store_write(models)]),
                (f"the training checkpoints' removal when a request ends (retention.py): list {checkpoints}\n"
                 "and delete a finished request's objects",
                 [*t.store_read(checkpoints), *t.store_write(checkpoints)]),
            ],
            deny=[t.deny_cache("the workers-only caches: it creates the store (above) but never reads or "
                               "writes it")],
        ),
        Rules(allow=[(
            "`ftbus worker aggregate`'s replies; the deploy/k8s init container (see data); stage/step/\n"
            "loss into the request record; cancels (every StageWorker listens to them)",
            [t.inboxes(worker_connection(agg)), t.inboxes(WAIT_TOPOLOGY), s.progress(), s.cancel],
        )]),
    )

    stage_denies_common = [t.deny_test_stream(), *t.deny_reports_and_dlq(), t.deny_requests()]

    data = User(
        "data",
        "`ftbus worker data`. NOTE: it runs the candidate's process_data.py as a child process (in the\n"
        "sandbox of docs/sandbox.md, or with the same uid and network), and a child can read its\n"
        "parent's environment (/proc/<ppid>/environ), FTBUS_NATS_URL included: treat this user as no\n"
        "more trusted than an agent. Same for train and bench (LlamaFactory/lm-eval run the\n"
        "candidate's config and model).\n"
        "\n"
        f"`{t.inboxes(WAIT_TOPOLOGY)}` (here and for every worker user): the init container of\n"
        "deploy/k8s (python -m ftbus.topology wait) connects as the worker's user under that name.\n"
        "Its only requests are STREAM.INFO, which every user may make anyway, so sharing that inbox\n"
        "between users shows nobody anything new. Nothing else may connect under that name.",
        Rules(
            allow=[
                topology_lookup,
                t.stage_consumer(Stage.data),
                ("its results; undecodable input -> dead letter; progress (core NATS, not persisted)",
                 [*rows[Stage.data].publishes(s), s.dlq, s.progress()]),
                status_read,
                stage_results(Stage.data),
                ("artifacts: read the workspace (metadata get + ordered consumer on the chunks) and write\n"
                 "data.json, data_stats.json (a cache hit's copies too) and logs; purge: replaced or\n"
                 "failed uploads",
                 [*t.store_read(artifacts), *t.store_write(artifacts)]),
                ("the workers-only cache store: the data cache in/out (`cache/data/<key>/...`)",
                 [*t.store_read(cache), *t.store_write(cache)]),
            ],
            deny=[*stage_denies_common, t.deny_bench_results(), t.deny_private(), t.deny_forging()],
        ),
        worker_subscribe(Stage.data),
    )

    train = User(
        "train",
        "`ftbus worker train` (GPU nodes). Same shape as data.",
        Rules(
            allow=[
                topology_lookup,
                t.stage_consumer(Stage.train),
                ("its results, dead letters, progress (step, total, loss, ETA)",
                 [*rows[Stage.train].publishes(s), s.dlq, s.progress()]),
                status_read,
                stage_results(Stage.train),
                ("artifacts: workspace + data.json in, logs out",
                 [*t.store_read(artifacts), *t.store_write(artifacts)]),
                (f"the trained outputs out, to {models} (agents read them there: `ftbus pull`)",
                 [*t.store_read(models), *t.store_write(models)]),
                (f"checkpoints of a running training to {checkpoints}, and back on a redelivery\n"
                 "(resume state: agents never read it)",
                 [*t.store_read(checkpoints), *t.store_write(checkpoints)]),
            ],
            deny=[*stage_denies_common, t.deny_bench_results(), t.deny_private(),
                  t.deny_cache("the workers-only cache store: any read, and any write (train gets the data\n"
                               "stage's output in the artifacts store; a planted `cache/data/<key>/data.json`\n"
                               "would be served to every request whose process_data.py hashes to that key)"),
                  t.deny_forging()],
        ),
        worker_subscribe(Stage.train),
    )

    bench = User(
        "bench",
        f"`ftbus worker bench` (GPU nodes). It PRODUCES the test split's result: it publishes\n"
        f"{s.bench_test} (stored by {s.stream_test}, which it never reads back), keeps both\n"
        f"BenchResults in its own results bucket, and writes the test split's logs and baseline cache\n"
        f"to {private} (and reads the cache back). The validation split's baseline cache is in\n"
        f"{cache} (read and write).",
        Rules(
            allow=[
                topology_lookup,
                t.stage_consumer(Stage.bench),
                ("its results, the hidden split (write only), dead letters, progress",
                 [*rows[Stage.bench].publishes(s), s.dlq, s.progress()]),
                status_read,
                stage_results(Stage.bench),
                ("artifacts: validation logs out", [*t.store_read(artifacts), *t.store_write(artifacts)]),
                (f"the trained outputs in, from {models}", t.store_read(models)),
                ("the private store: test-split logs out, the test baseline cache in/out",
                 [*t.store_read(private), *t.store_write(private)]),
                ("the workers-only cache store: the validation baseline cache in/out\n"
                 "(`cache/baseline/<key>/scores.json`)",
                 [*t.store_read(cache), *t.store_write(cache)]),
            ],
            deny=[*stage_denies_common, t.deny_forging(bench_test=False)],
        ),
        worker_subscribe(Stage.bench),
    )

    judge = User(
        "judge",
        f"`ftbus worker judge`: its consumer reads {s.completed('bench')} and the three *.failed\n"
        f"subjects of {s.stream_events} (never {s.bench_test}, which is not in that stream); it\n"
        f"publishes {s.completed('judge')}. It must NOT read {s.bench_test}, {s.stream_test},\n"
        f"{p}.report.>, {s.stream_reports}, the full records, the bench stage's results or the private\n"
        "store, nor read or write the cache store.",
        Rules(
            allow=[
                topology_lookup,
                t.stage_consumer(Stage.judge),
                ("its verdict input for the aggregator, dead letters, progress",
                 [*rows[Stage.judge].publishes(s), s.dlq, s.progress()]),
                status_read,
                stage_results(Stage.judge),
                ("artifacts, read only: train.yaml and the stage logs it judges", t.store_read(artifacts)),
                (f"the campaigns ({s.kv_campaigns}: validation data only): read a candidate's campaign, "
                 "write it back by compare-and-set (services/judge/decide.py)",
                 [*t.kv_read(s.kv_campaigns), f"$KV.{s.kv_campaigns}.>"]),
            ],
            deny=[*stage_denies_common, t.deny_bench_results(), t.deny_private(), t.deny_cache(),
                  t.deny_forging()],
        ),
        worker_subscribe(Stage.judge),
    )

    agent = User(
        "agent",
        "A user or fine-tuning agent, with the `ftbus` CLI or FtbusClient (connection `ftbus-client`):\n"
        "`ftbus submit` (upload the workspace, publish the request), `ftbus submit --wait` / `ftbus\n"
        "get` / `ftbus watch` (verdicts, progress), `ftbus status` (the public view), `ftbus cancel`,\n"
        f"`ftbus pull` (the trained outputs, from {models}: the one store it reads), `ftbus campaign\n"
        "NAME` (a campaign's record, read only).\n"
        "Never reports, the test stream, the full records, the bench results or the private store;\n"
        "and neither reads nor writes the cache store.",
        Rules(
            allow=[
                topology_lookup,
                ("submit, cancel", [s.eval_requested, s.cancel]),
                ("verdicts: `ftbus get` (last message of the verdict subject) and `--wait` / `watch`\n"
                 "(ordered push consumer + its flow control)",
                 [f"$JS.API.STREAM.MSG.GET.{s.stream_verdicts}", f"$JS.API.CONSUMER.CREATE.{s.stream_verdicts}",
                  f"$JS.FC.{s.stream_verdicts}.>"]),
                ("`ftbus status`: the public view (no test data)", t.kv_read(s.kv_status)),
                (f"`ftbus campaign NAME`: a campaign's record ({s.kv_campaigns}: validation data only), "
                 "read only (the judge alone writes it)", t.kv_read(s.kv_campaigns)),
                ("upload the workspace: chunks, metadata (a rollup per name; others' objects\n"
                 "it could overwrite are caught by the sha256 that every event reference\n"
                 "carries), and the \"exists already?\" metadata lookup, by direct get of a\n"
                 "metadata subject (a message get names its subject in the body: its grant\n"
                 "would read every object's chunks). No purge: an agent cannot wipe the store.",
                 [f"$O.{artifacts}.C.*", f"$O.{artifacts}.M.*",
                  f"$JS.API.DIRECT.GET.{t.obj(artifacts)}.$O.{artifacts}.M.>"]),
                (f"`ftbus pull`: read the trained outputs of requests, {models} (nothing else of the\n"
                 "stores: workspaces, data, logs and the test split's stay out of reach)",
                 [*t.store_read(models), f"$JS.API.DIRECT.GET.{t.obj(models)}.>"]),
            ],
            deny=[
                t.deny_test_stream(), *t.deny_reports_and_dlq(),
                t.deny_requests(writes=False), t.deny_bench_results(writes=False), t.deny_private(),
                t.deny_cache("the workers-only cache store: any read, and any write. THE reason it exists:\n"
                             "an agent may write the artifacts store, and cache keys are content hashes\n"
                             "anyone can compute, so a cache there could be planted"),
                ("forging stage results, test results, verdicts, reports, records",
                 [*(f"{p}.{spec.stage}.>" for spec in pipeline if spec.result is not None), f"{p}.verdict.>",
                  f"{p}.report.>", s.dlq, "$KV.>"]),
            ],
        ),
        Rules(
            allow=[("the CLI's / FtbusClient's replies; live progress (`--wait`, `watch`)",
                    [t.inboxes(CLIENT), s.progress()])],
            deny=[t.subscribe_deny()],
        ),
    )

    dashboard_reads: list[str] = []
    dashboard_consumers: list[str] = []
    for stream in (s.stream_verdicts, s.stream_reports, s.stream_dlq, t.kv(s.kv_requests), t.kv(s.kv_status),
                   t.kv(s.kv_campaigns), *(t.obj(o) for o in t.stores())):
        dashboard_consumers += [f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
                                f"$JS.FC.{stream}.>"]
    dashboard_reads += [f"$JS.API.STREAM.MSG.GET.{st}" for st in (s.stream_verdicts, s.stream_reports, s.stream_dlq)]
    for bucket in (s.kv_requests, s.kv_status, s.kv_campaigns):
        dashboard_reads += t.kv_read(bucket)
    for store in t.stores():
        o = t.obj(store)
        dashboard_reads += [f"$JS.API.STREAM.MSG.GET.{o}", f"$JS.API.DIRECT.GET.{o}", f"$JS.API.DIRECT.GET.{o}.>"]

    dashboard = User(
        "dashboard",
        "Read-only: verdicts, reports (with the hidden test split: dashboards are their one audience),\n"
        "full records and their public view, the campaigns, progress, dead letters, the four Object\n"
        "Stores (stage logs; test-split logs in the private store; the caches, for inspection: no\n"
        "purge).\n"
        "Publishes nothing.\n"
        "\n"
        "Its inbox is `_INBOX.dashboard.>`, NOT `_INBOX.ftbus-client.>`: agents may subscribe to\n"
        "`_INBOX.ftbus-client.>`, so a report read under that name would be delivered to them as well.\n"
        "Dashboards therefore connect with their own inbox prefix: the ftbus CLI with\n"
        "FTBUS_CLIENT_NAME=dashboard, the nats CLI with `--inbox-prefix _INBOX.dashboard`, or Python\n"
        "with `nats.connect(url, inbox_prefix=b\"_INBOX.dashboard\")` (docs/operations.md).",
        Rules(allow=[
            ("stream and consumer metadata (consumer lag per stage)",
             ["$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
              "$JS.API.CONSUMER.INFO.*.*", "$JS.API.CONSUMER.LIST.*"]),
            ("single reads", dashboard_reads),
            ("ordered consumers (watching, listing keys, reading objects), in nats-py's form\n"
             "(.<stream>) and the named form of the nats CLI", dashboard_consumers),
        ]),
        Rules(allow=[("its replies; progress, verdicts, reports as they happen",
                      [t.inboxes(DASHBOARD), s.progress(), s.verdict(), s.report()])]),
    )

    admin = User(
        "admin",
        "Operators (nats CLI), the topology job, backups, `ftbus up --nats-url` (it runs every stage\n"
        "in one process). Everything.",
        None,
        None,
    )
    # A stage of another pipeline (ftbus knows its own by name, above): a worker user from its row,
    # as no more trusted than an agent: its consumer, what it publishes, its own results bucket, the
    # artifacts store; never the hidden split, the caches, the private store, others' results.
    others = [
        User(
            spec.stage,
            f"`ftbus worker {spec.stage}` ({spec.words or spec.label}): a stage of this pipeline, its rules\n"
            "made from its row of the pipeline table (shared/stagespec.py).",
            Rules(
                allow=[
                    topology_lookup,
                    t.stage_consumer(spec.stage),
                    ("its results, dead letters, progress", [*spec.publishes(s), s.dlq, s.progress()]),
                    status_read,
                    stage_results(spec.stage),
                    ("artifacts: read and write", [*t.store_read(artifacts), *t.store_write(artifacts)]),
                ],
                deny=[*stage_denies_common, t.deny_bench_results(), t.deny_private(), t.deny_cache(),
                      t.deny_forging()],
            ),
            worker_subscribe(spec.stage),
        )
        for spec in pipeline
        if spec.stage not in tuple(Stage) and spec.handler is not None
    ]
    return [admin, aggregate, data, train, bench, judge, *others, agent, dashboard]


# The file's preamble: what the places are, and why (it speaks of the default prefix).
HEADER = r"""# ftbus: NATS accounts, users and permissions. Included by nats-server.conf and cluster.conf.
#
# GENERATED by ftbus/permissions.py from the code's topology (shared/subjects.py): do not edit
# this file; edit the rules there, then `.venv/bin/python -m ftbus.permissions --write`.
# tests/integration/test_permissions_drift.py fails while this file differs from the output, and
# tests/integration/test_permissions.py checks every user's allowed and denied operations on a
# live server running this file (docs/operations.md, "The permission table, tested").
#
# WHY: the hidden test split must never travel on a subject that the judge or an agent reads: the
# isolation is structural, and enforced by NATS permissions (docs/architecture.md). Everything that
# carries a test-split result lives in a place of its own, and only the evaluation's side (admin,
# aggregate, dashboard; bench, which produces it) is granted those places:
#
#   stream FTBUS_TEST            `ftbus.bench.test`: the test BenchResult. Written by bench, read
#                                by the aggregator alone.
#   stream FTBUS_REPORTS         `ftbus.report.<id>`: reports (they include the test split), for
#                                dashboards.
#   KV ftbus_requests            the aggregator's full record (benchmark_test, report). Aggregator
#                                and dashboards only.
#   KV ftbus_results_bench       the bench stage's idempotency store: both BenchResults, test
#                                included. Bench only (every stage has a bucket of its own).
#   Object Store ftbus_private   `<id>/logs/benchmark-test.log`, `benchmark-baseline-test.log` and
#                                the test split's baseline cache (`cache/baseline/...`). Written
#                                and read by bench; read by dashboards.
#   stream FTBUS_DLQ             dead letters can carry a `bench.test` payload: admin, aggregate,
#                                dashboards.
#   `_INBOX.<connection name>.>` replies: each ftbus program connects with its own inbox prefix
#                                (shared/bus.py): `ftbus worker STAGE` -> `_INBOX.ftbus-STAGE`,
#                                the CLI and FtbusClient -> `_INBOX.ftbus-client`, `ftbus up` ->
#                                `_INBOX.ftbus-up`. Each user may subscribe to its program's
#                                inboxes only, so nobody reads the replies to another user's
#                                requests (the aggregator's pulls from FTBUS_TEST, say).
#
# What everyone else reads instead: KV `ftbus_status` (the public view of each record: status,
# stage, timings, progress, cancel flag, final_decision; the aggregator writes it, stage workers
# read it for their cancel check, `ftbus status` reads it) and Object Store `ftbus_artifacts`
# (workspaces, data, validation logs: the workers' files, which agents write but never read).
#
# The trained outputs (adapters or weights, tokenizer, trainer state) are in a store of their own,
# `ftbus_models`: written by train, read by bench and by agents (`ftbus pull`), swept by the
# aggregator (it keeps each leaderboard's best). Object Store names travel in metadata subjects as
# base64, and chunks under random ids: one grant cannot pick some objects of a store, so the one
# thing agents may read of the stores is a whole store holding nothing else.
#
# The caches are a trust domain of their own, for the opposite reason: not what they reveal (no
# test data) but who may WRITE them. A cache entry is served to every request whose key matches,
# and keys are content hashes that anyone can compute from a workspace; agents may write
# `ftbus_artifacts` (their workspace uploads), so a cache there could be planted: a
# `cache/data/<key>/data.json` that another request's identical process_data.py would then train
# on, or a validation baseline that skews its comparison. So:
#
#   Object Store ftbus_cache     `cache/data/<key>/{data.json,data_stats.json}` (the data stage's
#                                cache) and `cache/baseline/<key>/scores.json` (the validation
#                                split's baselines; test baselines stay in ftbus_private). Written
#                                and read by data and bench; read by dashboards; denied to agent,
#                                judge, train and aggregate. On a cache hit the data stage copies
#                                data.json to the request's own `<id>/data/` in ftbus_artifacts, so
#                                train never reads this store.
#
# Every user below has an ALLOW list of exactly what its code calls (anything not listed is
# refused), plus explicit DENY entries for the places above (a deny always wins over an allow, so
# a later, broader allow cannot reopen them by accident).
#
# NAMES: this text speaks of the default subject prefix (FTBUS_SUBJECT_PREFIX=ftbus): subjects
# `ftbus.*`, streams FTBUS_EVENTS, FTBUS_TEST, FTBUS_VERDICTS, FTBUS_REPORTS, FTBUS_DLQ,
# FTBUS_ADVISORIES; KV buckets ftbus_requests, ftbus_status,
# ftbus_campaigns, ftbus_results_{data,train,bench,judge,aggregate} (streams KV_<bucket>, subjects
# `$KV.<bucket>.>`); Object Stores ftbus_artifacts, ftbus_cache, ftbus_private and ftbus_models (streams
# OBJ_<bucket>, subjects `$O.<bucket>.C.*` and `$O.<bucket>.M.*`); durable consumers ftbus-<stage>.
# For another prefix P, generate the file for it: `python -m ftbus.permissions --prefix P` (every
# rule then names P's subjects and streams). With FTBUS_ARTIFACT_STORE=filesystem the four Object
# Stores are folders under FTBUS_ARTIFACT_DIR and their grants below are unused:
# `<artifact_dir>/ftbus_private` must then be kept from the judge's and agents' machines, and
# `<artifact_dir>/ftbus_cache` from everyone's but the data and bench workers' (and dashboards',
# read-only), by mounts and file permissions (docs/operations.md).
#
# Passwords come from the server's environment (a reference like $NATS_JUDGE_PASSWORD that the
# file does not define is looked up there; the server refuses to start if it is unset). Clients
# put theirs in the URL: FTBUS_NATS_URL=nats://judge:<password>@nats:4222. To keep clear text out
# of the server's environment, replace each reference by a bcrypt hash (`nats server passwd`).
#
# JetStream API subjects used below (nats-server 2.15, nats-py 2.16), and what ftbus calls them for:
#   $JS.API.STREAM.INFO.<stream>                    stream config + counters, no message data.
#                                                   Every ftbus process runs ensure_topology() at
#                                                   start (shared/bus.py), which looks up every
#                                                   stream, bucket and store, FTBUS_TEST included.
#   $JS.API.STREAM.NAMES                            stream names; js.subscribe() uses it to find the
#                                                   stream of a subject (ordered consumers: Object
#                                                   Store reads, `ftbus submit --wait`, `ftbus watch`).
#   $JS.API.STREAM.CREATE|UPDATE.<stream>           topology; reserved to admin and aggregate: a user
#                                                   who may create or update a stream can give it
#                                                   FTBUS_TEST as a `sources`/`mirror` and read the copy.
#   $JS.API.STREAM.MSG.GET.<stream>                 one message by sequence or last-by-subject, WITH
#                                                   its data. nats-py uses it for KV get (ftbus's
#                                                   buckets are not allow_direct) and for Object
#                                                   Store metadata; ftbus reads an object of one chunk
#                                                   with it too. The key is in the request body,
#                                                   so a grant reads the whole bucket: that is why
#                                                   each trust domain has buckets of its own.
#   $JS.API.DIRECT.GET.<stream>[.<subject>]         the same, served by any replica (allow_direct
#                                                   streams: the Object Stores; a KV bucket created by
#                                                   the nats CLI). ftbus's code does not use it; the
#                                                   readers of a bucket are granted it anyway, so that
#                                                   a bucket made allow_direct by another tool still
#                                                   works for exactly the same users.
#   $JS.API.STREAM.SNAPSHOT|RESTORE|PURGE|DELETE.<stream>, $JS.API.STREAM.MSG.DELETE.<stream>,
#   $JS.API.STREAM.PEER.REMOVE|LEADER.STEPDOWN.<stream>   admin only (a snapshot is a full copy),
#                                                   except PURGE of an Object Store by its writers
#                                                   (nats-py purges the old chunks of a replaced
#                                                   object).
#   $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>   create-or-update a durable (nats-py's form
#                                                   when only durable_name is set: ensure_consumer()).
#   $JS.API.CONSUMER.CREATE.<stream>                ephemeral consumer, filter in the body (nats-py
#                                                   ordered consumers: Object Store reads, KV keys(),
#                                                   verdict waits); .<stream>.<name>[.<filter>] is
#                                                   the named form of newer clients (nats CLI).
#   $JS.API.CONSUMER.INFO|DELETE|NAMES|LIST|PAUSE|UNPIN|RESET...   consumer admin.
#   $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>   pull request: fetch(); messages come back on the
#                                                   requester's inbox.
#   $JS.ACK.<stream>.<consumer>.>                   ack / nak / in_progress / term of a delivery.
#   $JS.FC.<stream>.>                               flow-control replies of push (ordered) consumers.
#   $KV.<bucket>.<key>                              KV put/create/update (a JetStream publish).
#   $O.<bucket>.C.<nuid> / $O.<bucket>.M.<name>     Object Store chunks / metadata (publish).
#   $JS.EVENT.ADVISORY.>                            advisories; $JS.EVENT.ADVISORY.API (API audit)
#                                                   carries API requests and responses, and
#                                                   MAX_DELIVERIES names stream sequences: only the
#                                                   aggregator reads them, through FTBUS_ADVISORIES.
#   _INBOX.<connection name>.>                      replies to every request above, and the deliver
#                                                   subjects of ordered consumers.
#
# STILL OPEN (docs/operations.md, "What the permissions do not cover"): data, train and bench run
# candidate code with the worker's uid and network, and a child can read its parent's environment
# (FTBUS_NATS_URL and its password): treat those users as no more trusted than an agent, and note
# that `bench` holds the test split's grants (it writes ftbus.bench.test, ftbus_results_bench and
# ftbus_private). And the `ftbus` CLI connects as `ftbus-client` whoever runs it, so agents and
# dashboards cannot share it: dashboards get `_INBOX.dashboard.>` (see that user).
"""


# ---------------------------------------------------------------------- rendering

_INDENT = " " * 12


def _comment(text: str, indent: str, width: int = 110) -> list[str]:
    lines: list[str] = []
    for line in text.split("\n"):
        wrapped = textwrap.wrap(line, width - len(indent) - 2, break_long_words=False, break_on_hyphens=False)
        lines += [f"{indent}# {part}" for part in wrapped] or [f"{indent}#"]
    return lines


def _group_lines(group: Group, indent: str, width: int = 110) -> list[str]:
    comment, subjects = group
    lines = _comment(comment, indent) if comment else []
    current = ""
    for subject in subjects:
        quoted = f'"{subject}"'
        if current and len(indent) + len(current) + 2 + len(quoted) > width:
            lines.append(indent + current)
            current = ""
        current = f"{current}, {quoted}" if current else quoted
    if current:
        lines.append(indent + current)
    return lines


def _rules_lines(kind: str, rules: Rules | None, indent: str) -> list[str]:
    if rules is None:
        return [f'{indent}{kind}: ">"']
    lines = [f"{indent}{kind}: {{"]
    for key, groups in (("allow", rules.allow), ("deny", rules.deny)):
        if not groups:
            continue
        lines.append(f"{indent}    {key}: [")
        for group in groups:
            lines += _group_lines(group, indent + "        ")
        lines.append(f"{indent}    ]")
    lines.append(f"{indent}}}")
    return lines


def render(subjects: Subjects | None = None, pipeline: Sequence[StageSpec] = PIPELINE) -> str:
    subjects = subjects or Subjects()
    out = [HEADER.rstrip("\n"), ""]
    if subjects.prefix != "ftbus":
        out += [f"# Generated for FTBUS_SUBJECT_PREFIX={subjects.prefix}: the rules below name its subjects,",
                "# streams, buckets and stores (the text above speaks of the default prefix).", ""]
    out += [
        "accounts {",
        "    # Everything ftbus stores lives in this one JetStream-enabled account.",
        f"    {subjects.prefix.upper()} {{",
        "        jetstream {",
        "            max_file: 500GB",
        "            max_mem: 1GB",
        "        }",
        "        users: [",
    ]
    for n, user in enumerate(users(subjects, pipeline)):
        if n:
            out.append("")
        out.append(f"{_INDENT}# {'-' * 66} {user.name}")
        out += _comment(user.comment, _INDENT)
        out += [
            f"{_INDENT}{{",
            f"{_INDENT}    user: {user.name}",
            f"{_INDENT}    password: $NATS_{user.name.upper()}_PASSWORD",
            f"{_INDENT}    permissions: {{",
            *_rules_lines("publish", user.publish, _INDENT + " " * 8),
            *_rules_lines("subscribe", user.subscribe, _INDENT + " " * 8),
            f"{_INDENT}    }}",
            f"{_INDENT}}}",
        ]
    out += [
        "        ]",
        "    }",
        "",
        "    # The system account: server monitoring over NATS ($SYS.>), e.g. `nats server list`.",
        "    SYS {",
        "        users: [",
        "            { user: sys, password: $NATS_SYS_PASSWORD }",
        "        ]",
        "    }",
        "}",
        "",
        "system_account: SYS",
        "",
        "# Every connection must authenticate: no anonymous user.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prefix", default="ftbus", help="FTBUS_SUBJECT_PREFIX the rules are for")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {ACCOUNTS_CONF.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {ACCOUNTS_CONF.name} differs")
    args = parser.parse_args(argv)
    text = render(Subjects(args.prefix))
    if args.write:
        ACCOUNTS_CONF.write_text(text)
        print(f"wrote {ACCOUNTS_CONF}", file=sys.stderr)
        return 0
    if args.check:
        current = ACCOUNTS_CONF.read_text() if ACCOUNTS_CONF.is_file() else ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                   str(ACCOUNTS_CONF), "generated"))
        print(f"{ACCOUNTS_CONF} is stale: run `python -m ftbus.permissions --write`", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
