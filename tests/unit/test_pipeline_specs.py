"""The pipeline's specs (ftbus/stages.py): each stage once, wired end to end, the test split only to the aggregator."""

from __future__ import annotations

from ftbus.progress_view import STAGE_LABELS
from ftbus.stages import BY_STAGE, LABELS, PIPELINE
from services.aggregator.service import Aggregator
from shared.events import Stage
from shared.subjects import Subjects

S = Subjects("ftbus")


def test_every_stage_once_in_order() -> None:
    assert [spec.stage for spec in PIPELINE] == list(Stage)
    assert list(LABELS) == [stage.value for stage in Stage]
    assert list(STAGE_LABELS) == ["data", "train", "bench", "judge"]  # the progress bars, in order


def test_what_a_stage_emits_is_what_the_next_consumes() -> None:
    emitted = {subject for spec in PIPELINE for subject in spec.publishes(S)}
    for spec in PIPELINE:
        if spec.stage in (Stage.data, Stage.aggregate):
            continue
        assert set(spec.reads(S, PIPELINE)) <= emitted, spec.stage
    assert BY_STAGE[Stage.train].reads(S, PIPELINE) == [S.completed("data")]
    assert BY_STAGE[Stage.bench].reads(S, PIPELINE) == [S.completed("train")]


def test_the_hidden_test_split_reaches_only_the_aggregator() -> None:
    readers = [spec.stage for spec in PIPELINE if S.bench_test in spec.reads(S, PIPELINE)]
    assert readers == []  # not even the aggregator's event consumer: it reads FTBUS_TEST on its own
    assert S.bench_test not in S.event_stream_subjects()
    assert S.bench_test in BY_STAGE[Stage.bench].publishes(S)


def test_the_aggregator_leaves_a_stages_dead_letters_to_that_stage() -> None:
    class FakeBus:
        subjects = S

    aggregator = Aggregator(FakeBus(), PIPELINE)  # type: ignore[arg-type]
    assert aggregator._dead_letters_here(S.completed("data")) == "the train stage dead-letters it"
    assert aggregator._dead_letters_here(S.failed("bench")) == "the judge stage dead-letters it"
    assert aggregator._dead_letters_here(S.completed("judge")) is None  # only the aggregator reads it
    assert aggregator._dead_letters_here(S.cancel) is None
