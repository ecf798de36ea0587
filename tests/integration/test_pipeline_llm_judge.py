"""A request through the whole pipeline, with the judge pointed at a local OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.events import TaskSpec
from tests.fakes.openai_server import FakeOpenAIServer, answer
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")
LLM_ANSWER = {
    "execution": "SUCCESS: every stage exited 0 and the adapter was written (LLM-written).",
    "return_checking": "Validation exact_match is above the base model's on both subsets.",
    "code": "The LoRA config is reasonable; try 2x the steps next.",
    "final_decision": "true",
}


@pytest.fixture
def llm() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


async def test_the_llm_judge_writes_the_verdict(pipeline: Pipeline, llm: FakeOpenAIServer, tmp_path: Path) -> None:
    pipeline.settings = pipeline.settings.model_copy(
        update={"judge_model": "fake-judge", "openai_base_url": llm.base_url, "openai_api_key": "k"}
    )
    llm.script(answer(LLM_ANSWER))
    await pipeline.start()
    rid = await pipeline.client.submit(write_workspace(tmp_path / "ws"), TASK)
    verdict = await pipeline.client.wait(rid, timeout_s=120)

    assert verdict.judge is not None and verdict.judge.kind == "llm" and verdict.judge.model == "fake-judge"
    assert verdict.execution == LLM_ANSWER["execution"]
    assert verdict.final_decision is True and verdict.judge.rules_decision is True
    # raw_execution: every stage's whole log under its banner, in pipeline order, as the handler fetched them.
    raw = verdict.raw_execution
    banners = ["=== DATA PROCESSING OUTPUT ===\n", "\n=== TRAINING OUTPUT ===\n", "\n=== BENCHMARK OUTPUT ===\n"]
    assert raw.startswith(banners[0]) and all(raw.count(b) == 1 for b in banners)
    assert raw.index(banners[1]) < raw.index(banners[2])
    # The judge was asked once, with the validation results and without the hidden test split.
    assert len(llm.requests) == 1
    prompt = llm.requests[0].user_prompt
    assert "doubling" in prompt
    report = await pipeline.client.wait_report(rid, timeout_s=60)
    assert report.benchmark_test is not None
    test_only_ids = {i for ids in report.benchmark_test.item_ids.values() for i in ids}
    assert test_only_ids and not any(f'"{i}"' in prompt for i in test_only_ids)
    test_questions = {s.question for s in report.benchmark_test.error_samples}
    assert test_questions and not any(f'"{q}"' in prompt for q in test_questions)
