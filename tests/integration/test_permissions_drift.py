"""Drift guard: the code's topology (shared/subjects.py, shared/streams.py, shared/bus.py),
deploy/nats/accounts.conf and the permission table (permission_table.py, run live by
test_permissions.py) must name the same things.

- accounts.conf is exactly what ftbus/permissions.py generates from the code's names;
- every subject, stream, KV bucket, Object Store and durable consumer of the code has a rule in
  accounts.conf, and a row in the permission table (so each user's access to it is asserted live);
- every stream, bucket, store and consumer that accounts.conf names exists in the code (a rename
  leaves no stale rule behind);
- every program's inbox prefix (shared/bus.py: `_INBOX.<connection name>`) has its rule.

No server needed: this reads files and the code.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from ftbus.embedded import nats_server_binary
from ftbus.permissions import DEFAULT_AGENTS, render
from ftbus.stages import PIPELINE
from shared.events import Stage
from shared.settings import Settings
from shared.subjects import FAIR_SHARE_STAGES, Subjects, topology_stream_names
from tests.integration.permission_table import CONNECTION_NAMES, TABLE, markdown_table
from tests.integration.secured_nats import ACCOUNTS_CONF, REPO

S = Subjects("ftbus")


def code_subjects() -> dict[str, str]:
    """Every subject the code's Subjects names (properties and per-request subjects), by attribute."""
    found: dict[str, str] = {}
    for attr in dir(Subjects):
        if attr.startswith("_"):
            continue
        member = getattr(Subjects, attr)
        if isinstance(member, property):
            value = getattr(S, attr)
            if isinstance(value, str) and value.startswith(f"{S.prefix}."):
                found[attr] = value
    for attr in ("verdict", "report", "progress"):
        found[attr] = getattr(S, attr)()
    # Each agent user's own request subject (ftbus/permissions.py: one per identity).
    found["eval_requested_by"] = S.eval_requested_by(DEFAULT_AGENTS[0])
    for stage in FAIR_SHARE_STAGES:  # each fair-share stage's lanes (shared/lanes.py)
        found[f"lane:{stage}"] = S.lane(stage)
    for spec in PIPELINE:  # each stage's results (Subjects.completed, .failed), as the table says
        for subject in spec.subjects(S):
            found[f"{subject.split('.')[-1]}({spec.stage})"] = subject
    return found


def code_durables() -> list[str]:
    agg = S.durable(Stage.aggregate)
    return [*(S.durable(stage) for stage in Stage), f"{agg}-test", f"{agg}-dlq", f"{agg}-advisories"]


def rules() -> list[str]:
    """Every quoted subject of accounts.conf's permission rules (comments dropped)."""
    text = "\n".join(line.split("#", 1)[0] for line in ACCOUNTS_CONF.read_text().splitlines())
    return re.findall(r'"([^"]+)"', text)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def table_names() -> str:
    return "\n".join(f"{op.name} {op.target}" for op in TABLE)


def test_the_subject_matcher() -> None:
    assert matches("ftbus.verdict.*", "ftbus.verdict.x")
    assert not matches("ftbus.verdict.*", "ftbus.verdict.x.y")
    assert matches("ftbus.>", "ftbus.a.b") and not matches("ftbus.>", "ftbus")
    assert not matches("ftbus.bench.test", "ftbus.bench.tests")


@pytest.mark.parametrize(("attr", "subject"), sorted(code_subjects().items()))
def test_every_subject_of_the_code_has_a_rule_and_a_row(attr: str, subject: str) -> None:
    concrete = subject.replace("*", "x")
    # A rule that names it (not only admin's catch-all ">").
    assert any(matches(rule, concrete) for rule in rules() if rule != ">"), (
        f"Subjects.{attr} = {subject!r} has no rule in {ACCOUNTS_CONF.relative_to(REPO)}"
    )
    assert subject in table_names(), f"Subjects.{attr} = {subject!r} has no row in the permission table"


@pytest.mark.parametrize("stream", topology_stream_names(S))
def test_every_stream_bucket_and_store_has_rules_and_a_row(stream: str) -> None:
    # Named by a rule (at least the aggregator's STREAM.CREATE: it bootstraps the topology, so a
    # stream it may not create breaks a fresh deployment). Who may read and write it is then the
    # permission table's row, asserted live for every user.
    named = [rule for rule in rules() if re.search(rf"(^|\.){re.escape(stream)}(\.|$)", rule)]
    assert f"$JS.API.STREAM.CREATE.{stream}" in named, f"aggregate may not create {stream} (accounts.conf)"
    short = re.sub(r"^(KV|OBJ)_", "", stream)
    assert re.search(rf"\b{re.escape(short)}\b", table_names()), f"{stream} has no row in the permission table"


@pytest.mark.parametrize("durable", code_durables())
def test_every_durable_consumer_of_the_code_has_its_rules(durable: str) -> None:
    assert any(rule.endswith(f".{durable}") or f".{durable}." in rule for rule in rules()), (
        f"durable {durable} has no rule in accounts.conf"
    )
    assert durable in table_names(), f"durable {durable} has no row in the permission table"


def test_accounts_conf_names_nothing_that_the_code_does_not_have() -> None:
    streams = set(topology_stream_names(S))
    buckets = {re.sub(r"^(KV|OBJ)_", "", name) for name in streams if name.startswith(("KV_", "OBJ_"))}
    durables = set(code_durables())
    stale: list[str] = []
    for rule in rules():
        for token in rule.split("."):
            if re.fullmatch(r"FTBUS_[A-Z_]+|(KV|OBJ)_ftbus_\w+", token) and token not in streams:
                stale.append(f"{rule}: stream {token}")
            elif re.fullmatch(r"ftbus_\w+", token) and token not in buckets:
                stale.append(f"{rule}: bucket {token}")
            elif re.fullmatch(r"ftbus-[a-z-]+", token) and token not in durables and not rule.startswith("_INBOX."):
                stale.append(f"{rule}: consumer {token}")
        if rule.startswith(f"{S.prefix}.") and not any(
            matches(rule, subject.replace("*", "x")) or matches(subject, rule.replace("*", "x").replace(">", "x"))
            for subject in code_subjects().values()
        ):
            stale.append(f"{rule}: no subject of the code")
    assert not stale, "accounts.conf rules for names the code no longer has:\n" + "\n".join(stale)


def test_every_programs_inbox_has_its_rule() -> None:
    names = {*CONNECTION_NAMES.values(), Settings().client_name, *(f"ftbus-{stage.value}" for stage in Stage)}
    names.discard("ftbus-topology")  # admin: everything
    for name in sorted(names):
        assert f"_INBOX.{name}.>" in rules(), f"no subscribe rule for _INBOX.{name}.> in accounts.conf"


def test_docs_show_the_current_permission_table() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    assert markdown_table() in docs, (
        "docs/operations.md's permission table is stale: regenerate it with "
        "`.venv/bin/python -m tests.integration.permission_table`"
    )


def test_accounts_conf_is_generated_from_the_code() -> None:
    assert ACCOUNTS_CONF.read_text() == render(S), (
        f"{ACCOUNTS_CONF.relative_to(REPO)} differs from what ftbus/permissions.py generates: edit the rules "
        "there and run `.venv/bin/python -m ftbus.permissions --write` (see `--check` for the diff)"
    )


def test_the_generator_serves_another_subject_prefix(tmp_path) -> None:
    other = Subjects("t1ab")
    text = render(other)
    names = [rule for rule in re.findall(r'"([^"]+)"', "\n".join(
        line.split("#", 1)[0] for line in text.splitlines()))]
    leftovers = [n for n in names if re.search(r"(^|[.$_])(ftbus|FTBUS)[._]", n)]
    assert not leftovers, f"rules that still name the default prefix: {leftovers}"
    assert "_INBOX.ftbus-data.>" in names  # connection names do not change with the prefix
    # and the server accepts it
    (tmp_path / "accounts.conf").write_text(text)
    (tmp_path / "server.conf").write_text(
        f'listen: 127.0.0.1:-1\njetstream {{ store_dir: "{tmp_path / "js"}" }}\ninclude ./accounts.conf\n'
    )
    env = {f"NATS_{user.upper()}_PASSWORD": "x" for user in
           ("admin", "aggregate", "data", "train", "bench", "judge", "agent", "dashboard", "sys")}
    check = subprocess.run([str(nats_server_binary()), "-c", str(tmp_path / "server.conf"), "-t"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert check.returncode == 0, check.stderr + check.stdout
