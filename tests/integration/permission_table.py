"""The permission table: for every NATS user of deploy/nats/accounts.conf, every operation it must be
allowed, and (everything else) what it must be denied. test_permissions.py runs each cell against
a live server; test_permissions_drift.py checks that the table covers the code's whole topology.

Each operation is an async function of (bus connected as the user, context). It returns when the
server let it through AND it did what it says (read the seeded message, stored the object, got the
message on the subscription); it raises shared.denials.PermissionDenied when the server refused it.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.js import api

from shared.bus import Bus
from shared.events import Stage
from shared.kv_scan import latest, list_keys
from shared.object_artifacts import ObjectStoreArtifacts
from shared.subjects import FAIR_SHARE_STAGES, Subjects

S = Subjects("ftbus")
STAGE_USERS = {Stage.data: "data", Stage.train: "train", Stage.bench: "bench", Stage.judge: "judge",
               Stage.aggregate: "aggregate"}
# The connection name (so the inbox prefix) each user's program connects with (shared/bus.py).
CONNECTION_NAMES = {
    "admin": "ftbus-topology",
    **{user: f"ftbus-{stage.value}" for stage, user in STAGE_USERS.items()},
    "agent": "ftbus-client",
    "dashboard": "dashboard",
}
USERS = list(CONNECTION_NAMES)  # the FTBUS account's users; `sys` is in the system account
WORKERS = {"data", "train", "bench", "judge", "aggregate"}
SEED_KEY = "perm-seed"
SEED_OBJECT = "perm-seed/seed.txt"
SEED_BYTES = b"seeded by admin for the permission table"


@dataclass
class Context:
    """What the admin seeded, and the admin's own connection (to observe core messages)."""

    admin: Bus
    user: str = ""
    cleanup: list[Callable[[], Awaitable[object]]] = field(default_factory=list)


OpFn = Callable[[Bus, Context], Awaitable[None]]


@dataclass(frozen=True)
class Op:
    name: str  # what the report table shows
    run: OpFn
    allowed: frozenset[str]  # every other user of USERS must be denied
    target: str  # a name the refused subject must contain (the stream, bucket, subject...)


def _probe() -> str:
    return "probe" + secrets.token_hex(4)


def _concrete(subject: str) -> str:
    return subject.replace("*", _probe()).replace(">", f"{_probe()}.x")


async def _next_msg(sub: Any, attempts: int = 10, each_s: float = 5.0) -> Any:
    """The next message, in short waits: one stall of a loaded machine costs one wait, not the cell.
    50 s in all: a hang guard (under the 60 s a cell is given), a message that must come comes at once."""
    for attempt in range(attempts):
        try:
            return await sub.next_msg(timeout=each_s)
        except nats.errors.TimeoutError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------- publish


def js_publish(subject: str) -> OpFn:
    async def run(bus: Bus, ctx: Context) -> None:
        # 50 s: a hang guard (a refusal ends it at once, through guard()), under a cell's 60 s.
        ack = await bus.guard(bus.js.publish(_concrete(subject), b"{}", timeout=50))
        assert ack.stream, ack

    return run


def core_publish(subject: str) -> OpFn:
    """A subject no stream stores: the admin's subscription must receive it."""

    async def run(bus: Bus, ctx: Context) -> None:
        concrete = _concrete(subject)
        sub = await ctx.admin.nc.subscribe(concrete)
        await ctx.admin.nc.flush()
        try:
            await bus.guard(bus.nc.publish(concrete, b"probe"))
            await bus.flush()
            msg = await _next_msg(sub)
            assert msg.data == b"probe"
        finally:
            await sub.unsubscribe()

    return run


# ---------------------------------------------------------------------- subscribe


def core_subscribe(subject: str) -> OpFn:
    """Subscribe; the admin publishes a matching message, which must arrive."""

    async def run(bus: Bus, ctx: Context) -> None:
        sub = await bus.nc.subscribe(subject)
        try:
            await bus.flush()
            concrete = _concrete(subject)
            await ctx.admin.nc.publish(concrete, b"probe")
            await ctx.admin.nc.flush()
            msg = await bus.guard(_next_msg(sub))
            assert msg.subject == concrete
        finally:
            await sub.unsubscribe()

    return run


# ---------------------------------------------------------------------- streams


def stream_get(stream: str) -> OpFn:
    """$JS.API.STREAM.MSG.GET: the first message, with its data (the first left: a lanes stream
    deletes what its stage settled)."""

    async def run(bus: Bus, ctx: Context) -> None:
        msg = await bus.guard(bus.js.get_msg(stream, seq=1, next=True, subject=">"))
        assert msg.data is not None

    return run


def stream_consume(stream: str) -> OpFn:
    """An ordered (ephemeral) consumer from the start of the stream: the first message."""

    async def run(bus: Bus, ctx: Context) -> None:
        info = await bus.guard(bus.js.stream_info(stream))
        sub = await bus.guard(
            bus.js.subscribe(
                info.config.subjects[0] if info.config.subjects else ">",
                stream=stream,
                ordered_consumer=True,
                deliver_policy=api.DeliverPolicy.ALL,
            )
        )
        try:
            msg = await bus.guard(_next_msg(sub))
            assert msg.data is not None
        finally:
            await sub.unsubscribe()

    return run


def durable_info(stream: str, durable: str) -> OpFn:
    async def run(bus: Bus, ctx: Context) -> None:
        info = await bus.guard(bus.js.consumer_info(stream, durable))
        assert info.name == durable

    return run


def durable_create(stream: str) -> OpFn:
    """A durable consumer of one's own on ``stream`` (a way to read all of it)."""

    async def run(bus: Bus, ctx: Context) -> None:
        name = f"probe-{ctx.user}"
        info = await bus.guard(bus.js.add_consumer(stream, durable_name=name, ack_policy=api.AckPolicy.EXPLICIT))
        ctx.cleanup.append(lambda: ctx.admin.js.delete_consumer(stream, name))
        assert info.name == name

    return run


def msg_delete(stream: str) -> OpFn:
    """Delete one message of ``stream`` (a fair-share worker deletes a request it settled): one the
    admin publishes for the purpose."""

    async def run(bus: Bus, ctx: Context) -> None:
        info = await ctx.admin.js.stream_info(stream)
        ack = await ctx.admin.js.publish(info.config.subjects[0].replace("*", "probe"), b"{}")
        assert await bus.guard(bus.js.delete_msg(stream, ack.seq))

    return run


def consumers_list(stream: str) -> OpFn:
    """List ``stream``'s consumers (a fair-share worker's pick among its lanes; the dashboard)."""

    async def run(bus: Bus, ctx: Context) -> None:
        infos = await bus.guard(bus.js.consumers_info(stream))
        assert any(info.name == S.lanes_gauge(_stage_of(stream)) for info in infos), infos

    return run


def _stage_of(lanes_stream: str) -> str:
    return next(stage for stage in FAIR_SHARE_STAGES if S.stream_lanes(stage) == lanes_stream)


def stream_create_mirror(source: str) -> OpFn:
    """A new stream mirroring ``source``: a full copy anyone with the new stream could read."""

    async def run(bus: Bus, ctx: Context) -> None:
        name = f"PROBE_{ctx.user.upper()}"
        info = await bus.guard(
            bus.js.add_stream(api.StreamConfig(name=name, mirror=api.StreamSource(name=source),
                                               storage=api.StorageType.FILE))
        )
        ctx.cleanup.append(lambda: ctx.admin.js.delete_stream(name))
        assert info.config.name == name

    return run


def stream_update_same(stream: str) -> OpFn:
    """Update a stream with its own configuration (a no-op that only its owners may send)."""

    async def run(bus: Bus, ctx: Context) -> None:
        info = await ctx.admin.js.stream_info(stream)
        updated = await bus.guard(bus.js.update_stream(info.config))
        assert updated.config.name == stream

    return run


# ---------------------------------------------------------------------- KV


def kv_get(bucket: str) -> OpFn:
    async def run(bus: Bus, ctx: Context) -> None:
        kv = await bus.guard(bus.js.key_value(bucket))
        entry = await bus.guard(kv.get(SEED_KEY))
        assert entry.value == SEED_BYTES

    return run


def kv_keys(bucket: str) -> OpFn:
    """The whole-bucket reads the dashboard, the client (`ftbus ls`) and the aggregator's sweep do
    (shared/kv_scan.py): the keys, and every key's latest value in one pass."""

    async def run(bus: Bus, ctx: Context) -> None:
        await bus.guard(bus.js.key_value(bucket))
        keys = await bus.guard(list_keys(bus.js, bucket))
        assert SEED_KEY in keys
        values = {change.key: change.value for change in await bus.guard(latest(bus.js, bucket))}
        assert values[SEED_KEY] == SEED_BYTES

    return run


def kv_put(bucket: str) -> OpFn:
    async def run(bus: Bus, ctx: Context) -> None:
        kv = await bus.guard(bus.js.key_value(bucket))
        revision = await bus.guard(kv.put(f"perm-probe-{ctx.user}", b"written"))
        assert revision > 0

    return run


# ---------------------------------------------------------------------- Object Stores


def obj_get(store: str) -> OpFn:
    async def run(bus: Bus, ctx: Context) -> None:
        obs = await bus.guard(bus.js.object_store(store))
        result = await bus.guard(obs.get(SEED_OBJECT))
        assert result.data == SEED_BYTES

    return run


def obj_chunk_get(store: str) -> OpFn:
    """An object's bytes by message get of its chunk (no consumer): the route ftbus reads a
    one-chunk object by (shared/object_artifacts.py), and the one any holder of the grant can take."""

    async def run(bus: Bus, ctx: Context) -> None:
        obs = await bus.guard(bus.js.object_store(store))
        info = await bus.guard(obs.get_info(SEED_OBJECT))
        msg = await bus.guard(bus.js.get_last_msg(f"OBJ_{store}", f"$O.{store}.C.{info.nuid}"))
        assert msg.data == SEED_BYTES

    return run


def obj_meta_direct_get(store: str) -> OpFn:
    """An object's metadata by direct get of its metadata subject: the agent's "exists already?"
    lookup (shared/object_artifacts.py, read_info), its one object read."""

    async def run(bus: Bus, ctx: Context) -> None:
        encoded = base64.urlsafe_b64encode(SEED_OBJECT.encode()).decode()
        msg = await bus.guard(bus.js.get_last_msg(f"OBJ_{store}", f"$O.{store}.M.{encoded}", direct=True))
        assert json.loads(msg.data or b"{}")["name"] == SEED_OBJECT

    return run


def obj_put(store: str) -> OpFn:
    """An upload as ftbus makes one (shared/object_artifacts.py): the agent, a submitter, reads
    nothing (put_new); the workers look up the object it replaces by message get (nats-py's put)."""

    async def run(bus: Bus, ctx: Context) -> None:
        artifacts = await bus.guard(ObjectStoreArtifacts.open(bus.js, store, submitter=ctx.user == "agent"))
        name = f"perm-probe/{ctx.user}-{secrets.token_hex(3)}.txt"
        ref = await bus.guard(artifacts.put_bytes(name, b"written"))
        assert ref.name == name

    return run


# ---------------------------------------------------------------------- the table


def _users(*names: str) -> frozenset[str]:
    unknown = set(names) - set(USERS)
    assert not unknown, unknown
    return frozenset({"admin", *names})


STAGES = ("data", "train", "bench", "judge")  # the four stage workers (not the aggregator)
VERDICT_READERS = ("aggregate", "agent", "dashboard")


def build_table() -> list[Op]:
    ops: list[Op] = []

    def add(name: str, run: OpFn, allowed: frozenset[str], target: str) -> None:
        ops.append(Op(name, run, allowed, target))

    # --- publishing events (every stored subject answers with a PubAck)
    for subject, who in (
        # An agent submits as itself only (its own error budget): not as another identity, not unowned.
        (S.eval_requested_by("agent"), _users("agent")),
        (S.eval_requested_by(), _users()),  # any other identity's subject
        (S.eval_requested, _users()),
        (S.cancel, _users("agent")),
        (S.completed("data"), _users("data")),
        (S.failed("data"), _users("data")),
        (S.completed("train"), _users("train")),
        (S.failed("train"), _users("train")),
        (S.completed("bench"), _users("bench")),
        (S.failed("bench"), _users("bench")),
        (S.bench_test, _users("bench")),
        (S.completed("judge"), _users("judge")),
        (S.verdict(), _users("aggregate")),
        (S.report(), _users("aggregate")),
        (S.dlq, _users(*STAGES, "aggregate")),
    ):
        add(f"publish {subject}", js_publish(subject), who, subject.rstrip(".*>"))
    add(f"publish {S.progress()}", core_publish(S.progress()), _users(*STAGES), S.progress().rstrip(".*"))
    # --- core subscriptions
    for subject, who in (
        (S.bench_test, _users()),
        (S.report(), _users("dashboard")),
        (S.verdict(), _users("dashboard")),
        (S.progress(), _users("aggregate", "agent", "dashboard")),
        (S.cancel, _users(*STAGES, "aggregate")),
        (S.eval_requested, _users()),
        (S.completed("data"), _users()),
        (S.dlq, _users()),
        ("$JS.EVENT.>", _users()),
        (">", _users()),
    ):
        add(f"subscribe {subject}", core_subscribe(subject), who, subject.rstrip(".*>") or ">")
    # --- inboxes: each program's replies, its user's alone
    for name, who in (
        ("ftbus-client", _users("agent")),
        ("dashboard", _users("dashboard")),
        *((f"ftbus-{stage.value}", _users(user)) for stage, user in STAGE_USERS.items()),
        ("ftbus-wait-topology", _users(*WORKERS)),
    ):
        subject = f"_INBOX.{name}.>"
        add(f"subscribe {subject}", core_subscribe(subject), who, f"_INBOX.{name}")
    add("subscribe _INBOX.>", core_subscribe("_INBOX.>"), _users(), "_INBOX")
    # --- streams: message get, ordered consumer; mirrors; the aggregator's update
    for stream, get_who, consume_who in (
        (S.stream_events, _users("aggregate"), _users()),
        (S.stream_test, _users("aggregate"), _users()),
        (S.stream_verdicts, _users("agent", "dashboard"), _users("agent", "dashboard")),
        (S.stream_reports, _users("dashboard"), _users("dashboard")),
        (S.stream_dlq, _users("dashboard"), _users("dashboard")),
        (S.stream_advisories, _users(), _users()),
    ):
        add(f"read {stream} (message get)", stream_get(stream), get_who, stream)
        add(f"read {stream} (consumer)", stream_consume(stream), consume_who, stream)
    add(f"create a durable consumer on {S.stream_test}", durable_create(S.stream_test), _users(), S.stream_test)
    add(f"create a stream mirroring {S.stream_test}", stream_create_mirror(S.stream_test), _users(), "PROBE_")
    add(f"update stream {S.stream_test}", stream_update_same(S.stream_test), _users("aggregate"), S.stream_test)
    # --- each worker's own durable consumers (their info: counters, no data; the dashboard reads
    # every consumer's lag)
    for stage, user in STAGE_USERS.items():
        add(f"consumer info {S.stream_events}/{S.durable(stage)}",
            durable_info(S.stream_events, S.durable(stage)), _users(user, "dashboard"), S.durable(stage))
    agg = S.durable(Stage.aggregate)
    for stream, durable in ((S.stream_test, f"{agg}-test"), (S.stream_dlq, f"{agg}-dlq"),
                            (S.stream_advisories, f"{agg}-advisories")):
        add(f"consumer info {stream}/{durable}", durable_info(stream, durable), _users("aggregate", "dashboard"),
            stream)
    # --- a fair-share stage's lanes (shared/lanes.py): its own, and the dashboard's counts
    for stage in FAIR_SHARE_STAGES:
        lanes, gauge = S.stream_lanes(stage), S.lanes_gauge(stage)
        add(f"publish {S.lane(stage)}", js_publish(S.lane(stage)), _users(stage), S.lane(stage).rstrip(".*"))
        add(f"read {lanes} (message get)", stream_get(lanes), _users(), lanes)
        add(f"create a durable consumer on {lanes}", durable_create(lanes), _users(stage), lanes)
        add(f"list the consumers of {lanes}", consumers_list(lanes), _users(stage, "dashboard"), lanes)
        add(f"consumer info {lanes}/{gauge}", durable_info(lanes, gauge), _users(stage, "dashboard"), lanes)
        add(f"delete a message of {lanes}", msg_delete(lanes), _users(stage), lanes)
    # --- KV buckets
    results = {stage: S.kv_stage_results(stage) for stage in Stage}
    for bucket, get_who, keys_who, put_who in (
        (S.kv_requests, _users("aggregate", "dashboard"), _users("aggregate", "dashboard"), _users("aggregate")),
        (S.kv_status, _users(*STAGES, "aggregate", "agent", "dashboard"), _users("dashboard"), _users("aggregate")),
        # Campaigns (validation data only): the judge reads and writes them, an agent reads one
        # (`ftbus campaign NAME`), the bench stage reads a candidate's (the incumbent it is confirmed
        # against), dashboards and the aggregator's retention (which keeps each incumbent) list them.
        (S.kv_campaigns, _users("judge", "bench", "agent", "dashboard", "aggregate"), _users("dashboard", "aggregate"),
         _users("judge")),
        # The owners' error budgets: the bench stage reads and writes them after a confirmation on
        # the hidden pool; no agent reads or writes one (a budget an agent could reset controls nothing).
        (S.kv_owners, _users("bench", "dashboard"), _users("dashboard"), _users("bench")),
        *(
            (results[stage], _users(user), _users(), _users(user))
            for stage, user in STAGE_USERS.items()
            if stage != Stage.aggregate
        ),
        (results[Stage.aggregate], _users(), _users(), _users()),
    ):
        add(f"read KV {bucket} (get)", kv_get(bucket), get_who, bucket)
        add(f"read KV {bucket} (keys)", kv_keys(bucket), keys_who, bucket)
        add(f"write KV {bucket}", kv_put(bucket), put_who, bucket)
    # --- Object Stores
    # The agent uploads workspaces and looks up their metadata, but reads no object: not by a
    # consumer, and not by a message get of a chunk (its grant names the metadata subjects alone).
    for store, read_who, write_who, meta_who in (
        (S.object_store, _users("data", "train", "bench", "judge", "dashboard"), _users("data", "train", "bench",
                                                                                        "agent"),
         _users("agent", "dashboard")),
        (S.object_store_cache, _users("data", "bench", "dashboard"), _users("data", "bench"), _users("dashboard")),
        (S.object_store_private, _users("bench", "dashboard"), _users("bench"), _users("dashboard")),
        # Trained outputs: the one store the agent reads (`ftbus pull`); the aggregator sweeps it.
        (S.object_store_models, _users("train", "bench", "aggregate", "agent", "dashboard"),
         _users("train", "aggregate"), _users("agent", "dashboard")),
        # Training checkpoints: trainer-private resume state; the aggregator removes ended requests'.
        (S.object_store_checkpoints, _users("train", "aggregate", "dashboard"), _users("train", "aggregate"),
         _users("dashboard")),
    ):
        add(f"read object {store}", obj_get(store), read_who, store)
        add(f"read object {store} (message get of its chunk)", obj_chunk_get(store), read_who, store)
        add(f"object metadata {store} (direct get)", obj_meta_direct_get(store), meta_who, store)
        add(f"write object {store}", obj_put(store), write_who, store)
    return ops


TABLE = build_table()


def markdown_table() -> str:
    """users x operations, for docs/operations.md and reports."""
    lines = ["| operation | " + " | ".join(USERS) + " |", "|---|" + "---|" * len(USERS)]
    for op in TABLE:
        cells = ["allow" if user in op.allowed else "**deny**" for user in USERS]
        lines.append(f"| `{op.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def seed(admin: Bus) -> None:
    """One message in every stream, one key in every bucket, one object in every store, so that an
    allowed read proves that it read something."""
    for stage in FAIR_SHARE_STAGES:  # the consumer over every lane, as the stage's first worker makes it
        await admin.ensure_consumer(S.stream_lanes(stage), S.lanes_gauge(stage), [S.lane(stage)], max_deliver=-1)
    for stream in (S.stream_dlq, S.stream_advisories, S.stream_test, S.stream_reports, S.stream_verdicts,
                   S.stream_events, *(S.stream_lanes(stage) for stage in FAIR_SHARE_STAGES)):
        info = await admin.js.stream_info(stream)
        if info.state.messages == 0:
            subject = info.config.subjects[0].replace("*", "seed")
            await admin.js.publish(subject, b"{}")
    for bucket in (S.kv_requests, S.kv_status, S.kv_campaigns, S.kv_owners,
                   *(S.kv_stage_results(stage) for stage in Stage)):
        await (await admin.kv(bucket)).put(SEED_KEY, SEED_BYTES)
    for store in (S.object_store, S.object_store_cache, S.object_store_private, S.object_store_models,
                  S.object_store_checkpoints):
        await (await admin.js.object_store(store)).put(SEED_OBJECT, SEED_BYTES)



if __name__ == "__main__":
    print(markdown_table())
