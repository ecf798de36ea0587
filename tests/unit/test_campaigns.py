"""Campaigns in the judge: the incumbent, the comparison with it, the record's compare-and-set (in-memory bus)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.judge.decide import judge
from shared.campaigns import POOL_PROCEDURE, CampaignRecord, CampaignStore, campaigns_bucket
from shared.events import (
    ArtifactRef,
    BaselineComparison,
    BenchmarkScores,
    BenchResult,
    DecisionView,
    JudgeResult,
    WorkspaceFile,
)
from shared.online_testing import CAMPAIGN_ALPHA, gamma
from shared.paired import compare_scores
from shared.settings import Settings
from tests.fakes.judge_events import TRAIN_YAML, bench_result, scores
from tests.memory_bus import MemoryBus, memory_settings

ITEMS = 200


def outcomes(fixed: int) -> list[float]:
    """The base model is right on the even items; a candidate also on the first ``fixed`` odd ones."""
    values = [1.0 if i % 2 == 0 else 0.0 for i in range(ITEMS)]
    for i in range(fixed):
        values[2 * i + 1] = 1.0
    return values


def as_scores(values: list[float]) -> BenchmarkScores:
    ids = [f"val-{i:04d}" for i in range(ITEMS)]
    mean = sum(values) / len(values)
    return scores({"gsm8k": {"accuracy": mean}}, ids=ids).model_copy(
        update={"item_scores": {"gsm8k": {i: [v] for i, v in zip(ids, values, strict=True)}}})


def candidate(request_id: str, fixed: int, campaign: str | None = "c1", benchmark: str = "gsm8k") -> BenchResult:
    """A validation result ``fixed`` items better than the base model, paired with it as the bench stage does."""
    mine, base = as_scores(outcomes(fixed)), as_scores(outcomes(0))
    paired, words = compare_scores(mine, base)
    event = bench_result(benchmark=mine)
    task = event.context.task.model_copy(update={"campaign": campaign, "benchmark": benchmark})
    baseline = BaselineComparison(baseline=base, primary_metric=mine.primary_metric,
                                  candidate_value=mine.primary_value, baseline_value=base.primary_value,
                                  difference=(mine.primary_value or 0) - (base.primary_value or 0),
                                  paired=paired, summary=words)
    return event.model_copy(update={"request_id": request_id, "baseline": baseline,
                                    "context": event.context.model_copy(update={"task": task})})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return memory_settings(tmp_path)


@pytest.fixture
def store(settings: Settings) -> CampaignStore:
    return CampaignStore(MemoryBus(settings))


async def run(event: BenchResult, settings: Settings, store: CampaignStore) -> JudgeResult:
    return await judge(event, TRAIN_YAML, {}, settings, store)


async def test_the_first_candidate_is_compared_with_the_base_model_and_becomes_the_incumbent(
        settings: Settings, store: CampaignStore) -> None:
    result = await run(candidate("lora-1", 40), settings, store)
    check = result.result.campaign
    assert check is not None and result.feedback.final_decision
    assert (check.incumbent, check.index, check.better, check.accepted) == (None, 1, True, True)
    assert check.level == pytest.approx(CAMPAIGN_ALPHA * gamma(1))
    assert check.paired is not None and check.paired.level == pytest.approx(1 - 2 * check.level)
    assert "better than the base model (no incumbent yet) by +0.20" in result.feedback.return_checking
    record = await store.get("c1")
    assert record is not None and record.incumbent == "lora-1"
    assert (record.benchmark, record.state.tests) == ("gsm8k", 1)
    assert record.state.carried == pytest.approx(check.level)  # an acceptance passes its level on
    assert record.incumbent_scores is not None and record.incumbent_scores.error_samples == []


async def test_a_copy_of_the_incumbent_is_refused_as_not_distinguishable_and_names_it(
        settings: Settings, store: CampaignStore) -> None:
    await run(candidate("lora-1", 40), settings, store)
    result = await run(candidate("lora-2", 40), settings, store)
    check = result.result.campaign
    assert check is not None and not result.feedback.final_decision
    assert (check.incumbent, check.index, check.better, check.accepted) == ("lora-1", 2, False, False)
    assert check.level == pytest.approx(CAMPAIGN_ALPHA * (gamma(1) + gamma(2)))
    assert "not distinguishable from the incumbent lora-1" in result.feedback.return_checking
    assert "campaign c1 accepts only a candidate that beats its incumbent" in (result.judge.reason or "")
    record = await store.get("c1")
    assert record is not None and record.incumbent == "lora-1"
    assert [(e.request_id, e.accepted) for e in record.history] == [("lora-1", True), ("lora-2", False)]
    assert record.state.carried == 0.0


async def test_better_than_the_base_but_worse_than_the_incumbent_is_refused(
        settings: Settings, store: CampaignStore) -> None:
    await run(candidate("lora-1", 40), settings, store)
    event = candidate("small", 20)
    assert event.baseline is not None and event.baseline.paired is not None and event.baseline.paired.improves()
    result = await run(event, settings, store)
    check = result.result.campaign
    assert check is not None and not result.feedback.final_decision
    assert "worse than the incumbent lora-1 by -0.10" in check.summary
    assert (await store.get("c1")).incumbent == "lora-1"  # type: ignore[union-attr]


async def test_a_clear_improvement_on_the_incumbent_replaces_it(settings: Settings, store: CampaignStore) -> None:
    await run(candidate("lora-1", 20), settings, store)
    result = await run(candidate("lora-3", 60), settings, store)
    check = result.result.campaign
    assert check is not None and result.feedback.final_decision and check.incumbent == "lora-1"
    assert "better than the incumbent lora-1 by +0.20" in check.summary
    record = await store.get("c1")
    assert record is not None and [e.request_id for e in record.incumbents] == ["lora-1", "lora-3"]


async def test_a_redelivered_judgement_reuses_its_entry_and_spends_no_second_level(
        settings: Settings, store: CampaignStore) -> None:
    first = await run(candidate("lora-1", 40), settings, store)
    again = await run(candidate("lora-1", 40), settings, store)
    assert again.result.campaign == first.result.campaign
    assert again.feedback.final_decision
    record = await store.get("c1")
    assert record is not None and (len(record.history), record.state.tests) == (1, 1)


async def test_two_candidates_judged_at_once_the_second_is_compared_with_the_new_incumbent(
        settings: Settings, store: CampaignStore) -> None:
    """B reads the record, then A is judged and accepted before B writes: B's compare-and-set fails, and
    B is tested again against A (the new incumbent), at the next level."""
    bus_store = store

    class Racing(CampaignStore):
        raced = False

        async def put(self, record: CampaignRecord) -> CampaignRecord:
            if not Racing.raced:
                Racing.raced = True
                await run(candidate("A", 40), settings, bus_store)
            return await super().put(record)

    racing = Racing(bus_store.bus)
    result = await judge(candidate("B", 40), TRAIN_YAML, {}, settings, racing)
    check = result.result.campaign
    assert check is not None and (check.incumbent, check.index) == ("A", 2)
    assert not result.feedback.final_decision  # as good as A: not distinguishable from it
    record = await store.get("c1")
    assert record is not None and record.incumbent == "A"
    assert [(e.request_id, e.index, e.incumbent) for e in record.history] == [("A", 1, None), ("B", 2, "A")]


async def test_another_benchmark_is_not_compared_and_spends_nothing(settings: Settings, store: CampaignStore) -> None:
    await run(candidate("lora-1", 40), settings, store)
    result = await run(candidate("other", 60, benchmark="mmlu"), settings, store)
    check = result.result.campaign
    assert check is not None and check.index is None and not result.feedback.final_decision
    assert "campaign c1 is on gsm8k" in check.summary
    record = await store.get("c1")
    assert record is not None and record.state.tests == 1 and record.incumbent == "lora-1"


async def test_a_failed_run_and_a_request_without_campaign_leave_the_bucket_alone(
        settings: Settings, store: CampaignStore) -> None:
    failed = candidate("broken", 40).model_copy(update={"ok": False, "benchmark": None})
    result = await run(failed, settings, store)
    assert result.result.campaign is None and not result.feedback.final_decision
    plain = await run(candidate("solo", 40, campaign=None), settings, store)
    assert plain.result.campaign is None and plain.feedback.final_decision
    bus = store.bus
    assert isinstance(bus, MemoryBus)
    assert not (bus.buckets.get(campaigns_bucket(bus.subjects)) and bus.buckets[campaigns_bucket(bus.subjects)].entries)


async def test_the_campaign_refuses_under_every_policy_even_rules(tmp_path: Path) -> None:
    settings = memory_settings(tmp_path, judge_policy="rules")
    store = CampaignStore(MemoryBus(settings))
    assert (await run(candidate("lora-1", 40), settings, store)).feedback.final_decision
    assert not (await run(candidate("copy", 40), settings, store)).feedback.final_decision


# ---------------------------------------------------------------------- names, tasks, the CLI, the views


def test_campaign_names_from_any_text_are_valid_and_long_ones_stay_distinct() -> None:
    import re

    from shared.campaigns import campaign_name_from
    from shared.events import CAMPAIGN_NAME

    assert campaign_name_from("2026-01-01_12-00-00-123456", prefix="rdagent-") == "rdagent-2026-01-01_12-00-00-123456"
    assert campaign_name_from("my run/with spaces.ok") == "my-run-with-spaces-ok"
    long_a, long_b = campaign_name_from("x" * 80 + "a"), campaign_name_from("x" * 80 + "b")
    assert long_a != long_b and len(long_a) == len(long_b) == 64
    for name in (long_a, campaign_name_from("..."), campaign_name_from("é")):
        assert re.fullmatch(CAMPAIGN_NAME, name), name


def test_a_tasks_line_names_its_campaign_and_a_bad_name_is_refused_with_its_line(tmp_path: Path) -> None:
    from ftbus.batch import TaskFileError, load_tasks

    ws = tmp_path / "ws"
    ws.mkdir()
    lines = tmp_path / "tasks.jsonl"
    lines.write_text('{"workspace": "ws", "campaign": "search-1"}\n{"workspace": "ws"}\n')
    first, second = load_tasks(lines, {"base_model": "m", "benchmark": "b", "campaign": "default-c"})
    assert first.task_spec().campaign == "search-1"  # the line's own
    assert second.task_spec().campaign == "default-c"  # --campaign fills what a line leaves out
    lines.write_text('{"workspace": "ws", "campaign": "no spaces please"}\n')
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:1: campaign: String should match pattern"):
        load_tasks(lines, {"base_model": "m", "benchmark": "b"})


def test_submit_refuses_a_bad_campaign_name_before_connecting() -> None:
    from typer.testing import CliRunner

    from ftbus.cli import app

    result = CliRunner().invoke(app, ["submit", "examples/lora", "--base-model", "tiny-llama", "--benchmark",
                                      "tiny-sentiment", "--campaign", "bad name"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--campaign 'bad name': a campaign name is letters, digits" in " ".join(result.output.split())
    shown = CliRunner().invoke(app, ["campaign", "bad/name"], env={"COLUMNS": "200"})
    assert shown.exit_code == 2 and "a campaign name is letters" in shown.output


async def judged_campaign(settings: Settings, store: CampaignStore) -> CampaignRecord:
    """A campaign of four: lora-1 accepted, a copy refused, lora-3 accepted over it, a weaker one refused."""
    for rid, fixed in (("lora-1", 20), ("copy", 20), ("lora-3", 60), ("weaker", 30)):
        await run(candidate(rid, fixed), settings, store)
    record = await store.get("c1")
    assert record is not None
    return record


async def test_the_campaign_view_shows_the_incumbent_its_history_and_every_comparison(
        settings: Settings, store: CampaignStore) -> None:
    import json

    from rich.console import Console

    from ftbus.campaign_view import campaign_json, render_campaign

    record = await judged_campaign(settings, store)
    console = Console(record=True, width=300, force_terminal=False)
    render_campaign(console, record)
    text = console.export_text()
    assert "campaign c1: gsm8k with base model" in text and "4 candidates tested" in text
    assert "incumbent: lora-3, accepted" in text and "incumbents in order: lora-1 -> lora-3" in text
    as_json = campaign_json(record)
    assert json.loads(json.dumps(as_json))["incumbent"] == "lora-3"
    assert as_json["incumbents"] == ["lora-1", "lora-3"]
    assert [(e["request_id"], e["incumbent"], e["accepted"]) for e in as_json["history"]] == [
        ("lora-1", None, True), ("copy", "lora-1", False), ("lora-3", "lora-1", True), ("weaker", "lora-3", False)]
    assert as_json["next_level"] == pytest.approx(CAMPAIGN_ALPHA * gamma(5))  # the last was refused: nothing carried
    summaries = [e["summary"] for e in as_json["history"]]
    assert summaries[1].startswith("not distinguishable from the incumbent lora-1")
    assert summaries[2].startswith("better than the incumbent lora-1 by +0.20")
    assert summaries[3].startswith("worse than the incumbent lora-3 by -0.15")


async def test_the_dashboard_shows_campaigns_and_each_requests_comparison_with_its_incumbent(
        settings: Settings, store: CampaignStore) -> None:
    from ftbus.dashboard import views
    from shared.records import RequestRecord

    record = await judged_campaign(settings, store)
    rows = views.campaign_rows([record])
    assert rows[0]["name"] == "c1" and rows[0]["incumbent"] == "lora-3"
    assert (rows[0]["judged"], rows[0]["tested"], rows[0]["incumbents"]) == (4, 4, 2)
    detail = views.campaign_detail(record)
    assert [e["request_id"] for e in detail["incumbent_history"]] == ["lora-1", "lora-3"]
    assert detail["history"][1]["incumbent"] == "lora-1" and detail["history"][1]["paired"]["direction"] == (
        "indistinguishable")
    # A request's page: its judgement against the incumbent, from the record the aggregator keeps.
    judged = await run(candidate("late", 20), settings, store)
    page = views.request_detail(RequestRecord(request_id="late", status="completed", stage="judge",
                                              task=judged.context.task, judge=judged))
    assert page["campaign"]["campaign"] == "c1" and page["campaign"]["incumbent"] == "lora-3"
    assert not page["campaign"]["accepted"] and page["campaign"]["summary"].startswith("worse than the incumbent")


async def test_the_record_stays_one_size_however_many_candidates_it_judges(
        settings: Settings, store: CampaignStore) -> None:
    from shared.campaigns import RECENT_ENTRIES, entry_key

    await run(candidate("lora-0", 40), settings, store)
    first = await store.get("c1")
    assert first is not None
    sizes = []
    for i in range(1, RECENT_ENTRIES + 60):
        await run(candidate(f"tie-{i}", 40), settings, store)  # a copy of the incumbent: refused
        if i >= RECENT_ENTRIES:
            record = await store.get("c1")
            assert record is not None
            sizes.append(len(record.model_dump_json()))
    record = await store.get("c1")
    assert record is not None and (record.judged, record.accepted) == (RECENT_ENTRIES + 60, 1)
    assert len(record.history) == RECENT_ENTRIES and record.history[-1].request_id == f"tie-{RECENT_ENTRIES + 59}"
    assert max(sizes) - min(sizes) < 200, sizes  # timestamps and ids change its size by a few bytes, no more
    assert record.incumbent == "lora-0" and [e.request_id for e in record.incumbents] == ["lora-0"]
    # An entry the record no longer keeps is its own key: a redelivered judgement of it finds its decision.
    assert record.entry("tie-1") is None
    kept = await store.entry(record, "tie-1")
    assert kept is not None and kept.request_id == "tie-1" and not kept.accepted
    kv = await store.bus.kv(campaigns_bucket(store.bus.subjects))
    assert (await kv.get(entry_key("c1", "tie-1"))).value
    again = await run(candidate("tie-1", 40), settings, store)
    assert again.result.campaign is not None and again.result.campaign.index == kept.index
    assert (await store.get("c1")).judged == RECENT_ENTRIES + 60  # nothing judged twice


def test_a_record_from_before_the_counts_keeps_its_window_and_counts_its_entries() -> None:
    from shared.campaigns import RECENT_ENTRIES, CampaignEntry

    history = [CampaignEntry(request_id=f"r{i}", accepted=i in (3, 120), summary="s").model_dump(mode="json")
               for i in range(RECENT_ENTRIES + 50)]
    old = CampaignRecord.model_validate({"name": "old", "benchmark": "b", "base_model": "m", "history": history})
    assert (old.judged, old.accepted) == (RECENT_ENTRIES + 50, 2)
    assert len(old.history) == RECENT_ENTRIES and [e.request_id for e in old.incumbents] == ["r3", "r120"]


def decided(event: BenchResult, answer: str, incumbent: str | None) -> BenchResult:
    """The event with the benchmark stage's decision, made against ``incumbent`` (None: the base model)."""
    reference = f"the incumbent {incumbent}" if incumbent else "the base model"
    view = DecisionView(answer=answer, summary=f"{answer} than {reference} (the pool's words)", reference=reference,
                        incumbent=incumbent, owner="everyone", validation_items=ITEMS, validation_difference=0.2,
                        screened=True, level=0.0304)
    outputs = [WorkspaceFile(path="output/adapter_model.safetensors",
                             ref=ArtifactRef(name=f"{event.request_id}/output/adapter_model.safetensors", size=1,
                                             sha256="0" * 64))]
    return event.model_copy(update={"decision": view,
                                    "train": event.train.model_copy(update={"outputs": outputs})})


async def test_under_the_default_policy_the_pools_decision_against_the_incumbent_is_the_campaigns_test(
        tmp_path: Path) -> None:
    """judge_policy=better: a campaign's candidate is accepted when the benchmark stage confirmed it
    better than the incumbent the record names (the base model while none is), and the record keeps the
    new incumbent's trained outputs for the next confirmation. The campaign spends no level of its own
    (the owner's covers all of its campaigns)."""
    settings = memory_settings(tmp_path).model_copy(update={"judge_policy": "better"})
    store = CampaignStore(MemoryBus(settings))
    first = await run(decided(candidate("lora-1", 40), "better", None), settings, store)
    check = first.result.campaign
    assert first.feedback.final_decision and check is not None and check.accepted
    assert (check.index, check.procedure, check.incumbent) == (None, POOL_PROCEDURE, None)
    record = await store.get("c1")
    assert record is not None and record.incumbent == "lora-1" and record.state.tests == 0
    assert [f.path for f in record.incumbent_outputs] == ["output/adapter_model.safetensors"]

    second = await run(decided(candidate("lora-2", 60), "better", "lora-1"), settings, store)
    assert second.feedback.final_decision
    assert "better than the incumbent lora-1" in second.feedback.return_checking
    record = await store.get("c1")
    assert record is not None and record.incumbent == "lora-2"

    # Measured against lora-1, judged after lora-2 replaced it: accepts nothing, says what to do.
    stale = await run(decided(candidate("lora-3", 80), "better", "lora-1"), settings, store)
    assert not stale.feedback.final_decision
    assert "the campaign's incumbent became lora-2 while this candidate was measured against the incumbent lora-1" \
        in stale.feedback.return_checking and "submit it again" in stale.feedback.return_checking
    not_better = await run(decided(candidate("lora-4", 80), "indistinguishable", "lora-2"), settings, store)
    assert not not_better.feedback.final_decision
    assert "accepts only a candidate better than the incumbent lora-2" in not_better.feedback.return_checking
    record = await store.get("c1")
    assert record is not None and record.incumbent == "lora-2" and record.judged == 4


async def test_a_record_without_its_incumbents_outputs_is_tested_on_validation_as_before(tmp_path: Path) -> None:
    settings = memory_settings(tmp_path).model_copy(update={"judge_policy": "better"})
    store = CampaignStore(MemoryBus(settings))
    await run(decided(candidate("lora-1", 40), "better", None), settings, store)
    record = await store.get("c1")
    assert record is not None
    record.incumbent_outputs = []  # as recorded before incumbents' outputs were kept
    await store.put(record)
    later = await run(decided(candidate("lora-2", 100), "better", None), settings, store)
    check = later.result.campaign
    assert check is not None and check.index == 1 and check.incumbent == "lora-1" and check.paired is not None
    assert later.feedback.final_decision
