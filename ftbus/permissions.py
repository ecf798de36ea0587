"""NATS permissions: deploy/nats/accounts.conf, generated from the code's topology and the pipeline table.

Every subject, stream, KV bucket, Object Store and durable consumer name below comes from
shared/subjects.py, so a rename there changes the rules with it; each stage worker's user is made
from its row of the pipeline table (its subjects and its ``grants``, shared/stagespec.py), and what
the other users may do is written here, once. The generated file must equal the committed one
(tests/integration/test_permissions_drift.py), and tests/integration/test_permissions.py checks
every user's allowed and denied operations on a live server running it.

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
from pathlib import Path

from ftbus.accounts_header import HEADER
from ftbus.nats_rules import CLIENT, DASHBOARD, WAIT_TOPOLOGY, Group, Rules, Topology, User, worker_connection
from ftbus.stages import PIPELINE
from shared.settings import OWNER_PATTERN
from shared.stagespec import Grant, StageSpec
from shared.subjects import Subjects

ACCOUNTS_CONF = Path(__file__).resolve().parent.parent / "deploy" / "nats" / "accounts.conf"


#: The agent users of the generated configuration: one NATS user per submitting identity, each of
#: which may submit only as itself (its own error budget: docs/judge.md). `--agents` names others.
DEFAULT_AGENTS = ("agent",)
#: Names the generated configuration gives its other users.
RESERVED_USERS = frozenset({"admin", "aggregate", "dashboard", "sys", *(spec.stage for spec in PIPELINE)})


def users(subjects: Subjects | None = None, pipeline: Sequence[StageSpec] = PIPELINE,
          agents: Sequence[str] = DEFAULT_AGENTS) -> list[User]:
    """Every NATS user of ``pipeline`` (ftbus's own by default): what each may publish and
    subscribe to. Each stage worker's user is made from its row (its subjects, its ``grants``);
    each of ``agents`` is an agent user that submits as itself."""
    t = Topology(subjects or Subjects(), [spec.stage for spec in pipeline],
                 [spec.stage for spec in pipeline if spec.fair_share])
    s = t.s
    p = s.prefix
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

    # The aggregator: the row that publishes no stage result (its rules are its own: it reads everything).
    agg = next(spec.stage for spec in pipeline if spec.result is None)
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
                (f"the retention keeps every campaign's incumbent: read the records of {s.kv_campaigns}\n"
                 "(an ordered consumer on its stream, in one pass)",
                 [*t.kv_read(s.kv_campaigns), f"$JS.API.CONSUMER.CREATE.{t.kv(s.kv_campaigns)}",
                  f"$JS.API.CONSUMER.CREATE.{t.kv(s.kv_campaigns)}.>",
                  f"$JS.API.CONSUMER.INFO.{t.kv(s.kv_campaigns)}.*", f"$JS.FC.{t.kv(s.kv_campaigns)}.>"]),
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
    #: The stage that publishes the hidden test split's results: its results bucket holds them too.
    test_stage = next((spec.stage for spec in pipeline
                       if spec.result is not None and s.bench_test in spec.publishes(s)), None)
    test_results = [] if test_stage is None else [t.deny_test_results(test_stage)]

    def store(name: str, grant: Grant) -> list[str]:
        return [*t.store_read(name), *(t.store_write(name) if grant.write else [])]

    def stage_user(spec: StageSpec) -> User:
        """A stage worker's user: its consumer, what it publishes, its own results bucket, the places
        its row grants; every other place denied (the test split's unless it produces it)."""
        g = spec.grants
        publishes = spec.publishes(s)
        produces_test = s.bench_test in publishes
        allow = [
            topology_lookup,
            t.stage_consumer(spec.stage),
            *([t.stage_lanes(spec.stage)] if spec.fair_share else []),
            ("its results, the hidden split (write only), dead letters, progress" if produces_test
             else "its results, dead letters, progress", [*publishes, s.dlq, s.progress()]),
            status_read,
            stage_results(spec.stage),
            (g.artifacts.why.format(s=s), store(artifacts, g.artifacts)),
        ]
        for grant, name in ((g.models, models), (g.checkpoints, checkpoints), (g.private, private), (g.cache, cache)):
            if grant is not None:
                allow.append((grant.why.format(s=s), store(name, grant)))
        if g.campaigns is not None:
            allow.append((g.campaigns.why.format(s=s), [*t.kv_read(s.kv_campaigns),
                                                        *([f"$KV.{s.kv_campaigns}.>"] if g.campaigns.write else [])]))
        if g.owners is not None:
            allow.append((g.owners.why.format(s=s), [*t.kv_read(s.kv_owners),
                                                     *([f"$KV.{s.kv_owners}.>"] if g.owners.write else [])]))
        deny = [*stage_denies_common, *([] if produces_test else test_results)]
        deny += [] if g.private is not None else [t.deny_private()]
        deny += [] if g.cache is not None else [t.deny_cache(g.no_cache)]
        deny.append(t.deny_forging(bench_test=not produces_test))
        note = g.note.format(s=s) or (f"`ftbus worker {spec.stage}` ({spec.words or spec.label}): a stage of this "
                                      "pipeline, its rules\nmade from its row of the pipeline table "
                                      "(shared/stagespec.py).")
        return User(spec.stage, note, Rules(allow=allow, deny=deny), worker_subscribe(spec.stage))

    stages = [stage_user(spec) for spec in pipeline if spec.handler is not None]

    def agent_user(name: str) -> User:
        return User(
            name,
            "A user or fine-tuning agent, with the `ftbus` CLI or Client (connection `ftbus-client`):\n"
            "`ftbus submit` (upload the workspace, publish the request), `ftbus submit --wait` / `ftbus\n"
            "get` / `ftbus watch` (verdicts, progress), `ftbus status` (the public view), `ftbus cancel`,\n"
            f"`ftbus pull` (the trained outputs, from {models}: the one store it reads), `ftbus campaign\n"
            "NAME` (a campaign's record, read only).\n"
            "Never reports, the test stream, the full records, the bench results or the private store;\n"
            "and neither reads nor writes the cache store.\n"
            f"It submits as `{name}` only ({s.eval_requested_by(name)}): its requests spend its own error budget\n"
            "for \"better\", which no other identity can spend or escape into (docs/judge.md).",
            Rules(
                allow=[
                    topology_lookup,
                    (f"submit as {name}, cancel", [s.eval_requested_by(name), s.cancel]),
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
                    t.deny_requests(writes=False),
                    *([] if test_stage is None else [t.deny_test_results(test_stage, writes=False)]), t.deny_private(),
                    t.deny_cache("the workers-only cache store: any read, and any write. THE reason it exists:\n"
                                 "an agent may write the artifacts store, and cache keys are content hashes\n"
                                 "anyone can compute, so a cache there could be planted"),
                    ("submitting unowned (the shared budget of requests no identity owns: operators'),\n"
                     "as any other agent's subject is too, by the allow list above",
                     [s.eval_requested]),
                    ("forging stage results, test results, verdicts, reports, records",
                     [*(f"{p}.{spec.stage}.>" for spec in pipeline if spec.result is not None), f"{p}.verdict.>",
                      f"{p}.report.>", s.dlq, "$KV.>"]),
                ],
            ),
            Rules(
                allow=[("the CLI's / Client's replies; live progress (`--wait`, `watch`)",
                        [t.inboxes(CLIENT), s.progress()])],
                deny=[t.subscribe_deny()],
            ),
        )

    dashboard_reads: list[str] = []
    dashboard_consumers: list[str] = []
    for stream in (s.stream_verdicts, s.stream_reports, s.stream_dlq, t.kv(s.kv_requests), t.kv(s.kv_status),
                   t.kv(s.kv_campaigns), t.kv(s.kv_owners), *(t.obj(o) for o in t.stores())):
        dashboard_consumers += [f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
                                f"$JS.FC.{stream}.>"]
    dashboard_reads += [f"$JS.API.STREAM.MSG.GET.{st}" for st in (s.stream_verdicts, s.stream_reports, s.stream_dlq)]
    for bucket in (s.kv_requests, s.kv_status, s.kv_campaigns, s.kv_owners):
        dashboard_reads += t.kv_read(bucket)
    for store in t.stores():
        o = t.obj(store)
        dashboard_reads += [f"$JS.API.STREAM.MSG.GET.{o}", f"$JS.API.DIRECT.GET.{o}", f"$JS.API.DIRECT.GET.{o}.>"]

    dashboard = User(
        "dashboard",
        "Read-only: verdicts, reports (with the hidden test split: dashboards are their one audience),\n"
        "full records and their public view, the campaigns, the owners' error budgets, progress, dead\n"
        "letters, the four Object Stores (stage logs; test-split and pool logs in the private store; the\n"
        "caches, for inspection: no purge).\n"
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
    return [admin, aggregate, *stages, *(agent_user(name) for name in agents), dashboard]


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


def render(subjects: Subjects | None = None, pipeline: Sequence[StageSpec] = PIPELINE,
           agents: Sequence[str] = DEFAULT_AGENTS) -> str:
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
    for n, user in enumerate(users(subjects, pipeline, agents)):
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
    parser.add_argument("--agents", default=",".join(DEFAULT_AGENTS),
                        help="comma-separated agent users, one per submitting identity: each submits as itself "
                             "only, with its own error budget (each needs NATS_<NAME>_PASSWORD)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {ACCOUNTS_CONF.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {ACCOUNTS_CONF.name} differs")
    args = parser.parse_args(argv)
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    bad = [a for a in agents if not OWNER_PATTERN.match(a) or a in RESERVED_USERS]
    if bad or not agents:
        parser.error(f"--agents: {', '.join(bad) or 'none given'}: letters, digits, '-' and '_', not a stage's "
                     f"or another user's name ({', '.join(sorted(RESERVED_USERS))})")
    text = render(Subjects(args.prefix), agents=agents)
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
