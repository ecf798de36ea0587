"""The pipeline's specs (ftbus/stages.py): each stage once, wired end to end, the test split only to the aggregator."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ftbus.progress_view import STAGE_LABELS
from ftbus.stages import BY_STAGE, LABELS, PIPELINE
from services.aggregator.service import Aggregator
from shared.events import Stage, Timeouts
from shared.settings import Settings
from shared.subjects import FAIR_SHARE_STAGES, Subjects

S = Subjects("ftbus")


def test_every_stage_once_in_order() -> None:
    assert [spec.stage for spec in PIPELINE] == list(Stage)
    assert list(LABELS) == [stage.value for stage in Stage]
    assert list(STAGE_LABELS) == ["data", "train", "bench", "judge"]  # the progress bars, in order


def test_the_fair_share_stages_without_a_table_are_the_tables() -> None:
    """The topology's lanes streams (shared/streams.py) follow FAIR_SHARE_STAGES where no table is at hand."""
    assert [spec.stage for spec in PIPELINE if spec.fair_share] == list(FAIR_SHARE_STAGES) == ["train", "bench"]


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


def test_a_request_may_lower_a_timeout_never_raise_it() -> None:
    """A stage's timeout is its row's (a setting); a request lowers it by the row's record name."""
    settings = Settings(train_timeout_s=100, bench_timeout_s=50)
    train, bench = BY_STAGE[Stage.train], BY_STAGE[Stage.bench]
    assert train.timeout_in(settings, Timeouts(training=10)) == 10
    assert train.timeout_in(settings, Timeouts(training=1000)) == 100
    assert train.timeout_in(settings, Timeouts()) == 100
    assert train.timeout_in(settings, Timeouts(benchmark=1)) == 100  # another stage's
    assert bench.timeout_in(settings, Timeouts(benchmark=20)) == 20
    assert bench.limit(settings) == 100  # the sweeper waits for both splits, one after the other


def test_timeouts_name_record_names_and_positive_seconds() -> None:
    assert Timeouts(screening=5).of("screening") == 5  # a stage another pipeline adds
    for bad in ({"training": 0}, {"training": -1}, {"Not A Name": 3}):
        with pytest.raises(ValidationError):
            Timeouts(**bad)
