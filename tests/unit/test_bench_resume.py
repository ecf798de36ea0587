"""Resumable benchmarks without the toolchain: the engine's journal (evaluation/engine/journal.py)
and the worker's shipments of it (evaluation/resume.py). With the real lm-eval, a worker killed
half way: tests/e2e/test_bench_resume.py and test_bench_stage_resume.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.engine.journal import Journal, read_journal, request_key
from evaluation.inference import InferenceConfig
from evaluation.resume import SplitJournal, journal_prefix
from evaluation.splits import SplitManifest
from evaluation.warm import ENGINE_DIR
from tests.fakes.stage_context import MemoryArtifacts

GREEDY = {"until": ["\n"], "do_sample": False}
SAMPLED = {"until": ["\n"], "do_sample": True, "temperature": 0.6}


@dataclass
class Request:
    """What the journal reads of lm-eval's ``Instance``."""

    args: tuple[Any, ...]
    task_name: str
    doc_id: int


def _generate(journal: Journal, requests: list[Request], model: list[str]) -> tuple[list[Any], int]:
    """A run through ``journal`` as resuming.py makes it: the model answers what the journal does not,
    from ``model`` in turn, and records each answer through the hook. Returns the answers and how
    many the model generated."""
    answers, todo = journal.take("generate_until", requests)
    for i in todo:
        answers[i] = model.pop(0)
        journal.add_partial("generate_until", requests[i].args, answers[i])
    return answers, len(todo)


def test_a_resumed_run_generates_only_what_the_lost_one_did_not_record(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    requests = [Request((f"review {i}", GREEDY), "ftbus_sent_food", i) for i in range(4)]
    first = Journal(path)
    assert _generate(first, requests[:2], ["positive", "negative"]) == (["positive", "negative"], 2)
    first.close()

    resumed = Journal(path, {"ftbus_sent_food": "food"})
    answers, generated = _generate(resumed, requests, ["negative", "positive"])
    assert answers == ["positive", "negative", "negative", "positive"] and generated == 2
    assert resumed.summary() == {"items": 2, "of": 4, "requests": 4, "generated": 2}
    resumed.close()
    # The journal now holds every answer: a third attempt generates nothing.
    assert _generate(Journal(path), requests, [])[1] == 0


def test_identical_requests_each_keep_their_own_answer(tmp_path: Path) -> None:
    """num_runs: lm-eval sends an item's prompt n times; sampled, each copy answers differently.
    The k-th copy gets the k-th recorded answer, never the first one n times."""
    path = tmp_path / "journal.jsonl"
    copies = [Request(("review 0", SAMPLED), "ftbus_sent_food", 0)] * 4
    first = Journal(path)
    _generate(first, copies[:3], ["positive", "negative", "negative"])
    first.close()

    resumed = Journal(path)
    answers, generated = _generate(resumed, copies, ["positive"])
    assert answers == ["positive", "negative", "negative", "positive"] and generated == 1
    # An item is done only when all its requests were recorded.
    assert resumed.summary() == {"items": 0, "of": 1, "requests": 4, "generated": 1}


def test_a_choice_items_tasks_count_as_one_item_and_log_likelihoods_come_back_as_tuples(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    first = Journal(path)
    first.add_partial("loglikelihood", ("Q: 1+1?", " A"), (-0.25, True))
    first.add_partial("generate_until", ("Q: 1+1? Letter:", GREEDY), "A")
    first.close()

    resumed = Journal(path, {"ftbus_arith_easy": "easy", "ftbus_arith_easy_letter": "easy"})
    loglik, todo = resumed.take("loglikelihood", [Request(("Q: 1+1?", " A"), "ftbus_arith_easy", 0),
                                                  Request(("Q: 1+1?", " B"), "ftbus_arith_easy", 0)])
    assert loglik == [(-0.25, True), None] and todo == [1]
    letters, todo = resumed.take("generate_until", [Request(("Q: 1+1? Letter:", GREEDY), "ftbus_arith_easy_letter", 0)])
    assert letters == ["A"] and todo == []
    # One item (easy, 0), asked by two tasks; one of its requests still to generate.
    assert resumed.summary() == {"items": 0, "of": 1, "requests": 3, "generated": 1}


def test_a_line_cut_short_is_not_an_answer(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    whole = f'{{"key": "{request_key("generate_until", ("a", GREEDY))}", "result": "positive"}}\n'
    path.write_text(whole + '{"key": "abc", "resu')
    assert read_journal(path) == {request_key("generate_until", ("a", GREEDY)): ["positive"]}


def test_the_key_is_the_kind_and_the_arguments() -> None:
    assert request_key("generate_until", ("a", GREEDY)) == request_key("generate_until", ("a", dict(GREEDY)))
    assert request_key("generate_until", ("a", GREEDY)) != request_key("generate_until", ("a", SAMPLED))
    assert request_key("generate_until", ("a", GREEDY)) != request_key("loglikelihood", ("a", GREEDY))


async def test_shipments_hold_whole_lines_and_restore_in_order(tmp_path: Path) -> None:
    store = MemoryArtifacts()
    local = tmp_path / "run" / "journal.jsonl"
    local.parent.mkdir()
    journal = SplitJournal(store, "resume/r1/validation-0123")
    assert await journal.restore(local) == 0 and local.read_bytes() == b""

    local.write_bytes(b'{"n": 1}\n{"n": 2}\n{"n": 3')  # the engine is writing line 3
    assert await journal.ship(local) == 2
    assert await journal.ship(local) == 0  # nothing new and whole
    with local.open("ab") as fh:
        fh.write(b'}\n{"n": 4}\n')
    assert await journal.ship(local) == 2
    assert journal.shipments == 2

    # Another worker, after this one was lost: the shipments in order, whole lines only.
    again = tmp_path / "again" / "journal.jsonl"
    later = SplitJournal(store, "resume/r1/validation-0123")
    assert await later.restore(again) == 4
    assert again.read_bytes() == b'{"n": 1}\n{"n": 2}\n{"n": 3}\n{"n": 4}\n'
    # It ships only what it adds after the restored lines.
    with again.open("ab") as fh:
        fh.write(b'{"n": 5}\n')
    assert await later.ship(again) == 1
    assert await store.stat("resume/r1/validation-0123/000002.jsonl") is not None

    await later.clear()
    assert await SplitJournal(store, "resume/r1/validation-0123").restore(tmp_path / "x.jsonl") == 0
    assert await store.stat("resume/r1/validation-0123/000000.jsonl") is None


def test_a_journal_is_taken_only_by_the_same_split_generated_the_same_way() -> None:
    manifest = SplitManifest(benchmark="b", version=1, split="validation", max_items=2, item_ids={"s": ["1", "2"]},
                             sha256="0" * 64)
    greedy = InferenceConfig(greedy=True)
    base = journal_prefix("r1", "validation", manifest, "cpu", 0, greedy)
    assert base.startswith("resume/r1/validation-")
    assert base == journal_prefix("r1", "validation", manifest, "cpu", 0, greedy)
    others = {
        journal_prefix("r2", "validation", manifest, "cpu", 0, greedy),
        journal_prefix("r1", "baseline-validation", manifest, "cpu", 0, greedy),
        journal_prefix("r1", "validation", manifest, "cuda", 0, greedy),
        journal_prefix("r1", "validation", manifest, "cpu", 1, greedy),
        journal_prefix("r1", "validation", manifest, "cpu", 0, InferenceConfig(greedy=True, num_runs=2)),
        journal_prefix("r1", "validation", manifest.model_copy(update={"item_ids": {"s": ["1"]}}), "cpu", 0, greedy),
    }
    assert base not in others and len(others) == 6


def test_the_engines_journal_modules_import_nothing_of_ftbus() -> None:
    """They run in the engine, beside its script (copied there with it)."""
    for name in ("journal.py", "resuming.py"):
        text = (ENGINE_DIR / name).read_text()
        for package in ("services", "shared", "evaluation", "runners", "ftbus."):
            assert f"from {package}" not in text and f"import {package}" not in text, name
