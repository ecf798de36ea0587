"""Hypothesis strategies for fuzzing the bus: arbitrary values, and valid events of every type
with arbitrary mutations anywhere in their tree (used by the unit and the integration fuzz tests)."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import strategies as st
from pydantic import BaseModel

from shared import codec
from shared.events import (
    EVENT_TYPES,
    BaselineComparison,
    CancelRequested,
    DeadLetter,
    EvalRequested,
    Feedback,
    JudgeInfo,
    JudgeResult,
    Progress,
    Report,
    Stage,
    Verdict,
    VerdictResult,
)
from tests.fakes import judge_events as fx


def samples() -> dict[str, BaseModel]:
    """One valid, richly filled event of every type on the bus."""
    ctx = fx.context()
    bench = fx.bench_result()
    scores = bench.benchmark
    judge = JudgeResult(
        request_id="r-1", context=ctx,
        feedback=Feedback(execution="ok", return_checking="ok", code="ok", final_decision=True),
        raw_execution="log", judge=JudgeInfo(kind="rules", rules_decision=True),
        result=VerdictResult(benchmark=scores, baseline=BaselineComparison(baseline=scores)),
        artifacts=list(ctx.workspace), expects_test=True,
    )
    verdict = Verdict(request_id="r-1", status="completed", execution="e", return_checking="r", code="c",
                      final_decision=True, result=judge.result, judge=judge.judge, artifacts=list(ctx.workspace))
    events: list[BaseModel] = [
        EvalRequested(request_id="r-1", context=ctx),
        CancelRequested(request_id="r-1", reason="stop"),
        fx.data_failed(exit_code=1, log="Traceback"),
        fx.train_failed(),
        bench,
        judge,
        verdict,
        Report(**verdict.model_dump(), benchmark_test=scores, timings={"data": 1.5}),
        Progress(request_id="r-1", stage=Stage.train, step=3, total=10, loss=0.5, eta_s=12.0, message="m"),
        DeadLetter(request_id="r-1", original_subject="ftbus.data.completed", stage=Stage.train,
                   reason="bad", payload=b"\x00\x01", deliveries=3),
    ]
    by_type = {type(e).__name__: e for e in events}
    assert set(by_type) == set(EVENT_TYPES), "a new event type needs a sample here"
    return by_type


SAMPLES = samples()

# Arbitrary msgpack-encodable values, nested.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=80), st.binary(max_size=80),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=20), st.binary(max_size=8)), inner, max_size=5),
    ),
    max_leaves=20,
)


def same_type(value: Any) -> st.SearchStrategy[Any]:
    """An arbitrary value of the same JSON type: mostly still a valid event, with odd contents."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if isinstance(value, float):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(value, str):
        return st.text(max_size=200)
    if isinstance(value, bytes):
        return st.binary(max_size=200)
    if isinstance(value, list):
        return st.lists(st.sampled_from(value), max_size=6) if value else st.just([])
    return values


def paths(body: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a dumped event (dict keys and list indices)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(body, dict):
        for key, value in body.items():
            found.append((*prefix, key))
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(body, list):
        for index, value in enumerate(body):
            found.append((*prefix, index))
            found.extend(paths(value, (*prefix, index)))
    return found


def dumped(event: BaseModel) -> dict[str, Any]:
    body = event.model_dump(mode="json")
    body[codec.TYPE_KEY] = type(event).__name__
    if isinstance(event, DeadLetter):
        body["payload"] = event.payload  # bytes on the wire, not base64 text
    return body


@st.composite
def mutated_events(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid event of any type with 1-4 mutations anywhere in its tree; returns (type, payload)."""
    type_name = draw(st.sampled_from(sorted(SAMPLES)))
    body: Any = dumped(SAMPLES[type_name])
    for _ in range(draw(st.integers(1, 4))):
        choices = paths(body)
        if not choices:
            break
        path = draw(st.sampled_from(choices))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["same-type", "same-type", "replace", "delete", "add"]))
        last = path[-1]
        if action == "same-type":
            parent[last] = draw(same_type(parent[last]))
        elif action == "replace":
            parent[last] = draw(values)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=20))] = draw(values)
        else:
            parent.append(draw(values))
    return type_name, msgpack.packb(body, use_bin_type=True)
