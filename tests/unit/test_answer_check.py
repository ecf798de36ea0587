"""The LLM answer check against a real local OpenAI-compatible server, through the real openai client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evaluation import answer_check
from evaluation.answer_check import (
    NO_LLM_NOTE,
    AnswerCase,
    AnswerCheck,
    cascade,
    check_answers,
    parse_verdict,
    rule_misses,
)
from shared import llm_retry
from shared.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer, Received, Reply, answer, error


class GradingServer(FakeOpenAIServer):
    """Replies by question, so the answer does not depend on which concurrent request came first."""

    def __init__(self, correct: set[str]) -> None:
        super().__init__(default=answer("incorrect"))
        self.correct = correct

    def _next(self, received: Received) -> Reply:
        reply = super()._next(received)  # records the request; the script (if any) goes first
        if reply is self.default and any(f"Question:\n{q}\n" in received.user_prompt for q in self.correct):
            return answer("Correct.")
        return reply

    def questions(self) -> list[str]:
        return sorted(r.user_prompt.split("\n")[1] for r in self.requests)


@pytest.fixture
def server() -> Iterator[GradingServer]:
    with GradingServer(correct={"q1"}) as srv:
        yield srv


def settings(tmp_path: Path, server: FakeOpenAIServer | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path, "judge_model": "judge-m", "bench_llm_model": None, "openai_api_key": "sk-test",
        "openai_base_url": server.base_url if server else None, "bench_llm_budget_requests": 200,
    }
    return Settings(**{**values, **overrides})


def cases(n: int) -> list[AnswerCase]:
    return [AnswerCase(question=f"q{i}", gold=f"gold {i}", output=f"<think>hmm</think>answer {i}") for i in range(n)]


async def test_cascade_rescues_only_what_the_llm_says_is_correct(tmp_path: Path, server: GradingServer) -> None:
    rule = [True, False, False, True, False]
    items = cases(5)
    sent = rule_misses(rule)
    assert sent == [1, 2, 4]
    check = await check_answers(settings(tmp_path, server), [items[i] for i in sent])
    assert server.questions() == ["q1", "q2", "q4"]  # exactly the rule's misses, once each
    assert check.verdicts == [True, False, False]  # the LLM rescues q1 only
    assert cascade(rule, check) == [True, True, False, True, False]
    assert check.model == "judge-m" and check.requests == 3 and check.notes == []
    assert check.prompt_tokens == 3 and check.completion_tokens == 3  # the fake's usage: 1 + 1 each
    first = server.requests[0]
    assert first.body["model"] == "judge-m"
    assert "exactly one word" in first.system_prompt
    assert "Reference answer:\ngold " in first.user_prompt
    assert "hmm" not in first.user_prompt and "answer " in first.user_prompt  # thinking stripped


async def test_bench_llm_model_wins_over_the_judge_model(tmp_path: Path, server: GradingServer) -> None:
    check = await check_answers(settings(tmp_path, server, bench_llm_model="grader-m"), cases(1))
    assert check.model == "grader-m" and server.requests[0].body["model"] == "grader-m"


async def test_no_model_is_the_rule_alone(tmp_path: Path, server: GradingServer) -> None:
    check = await check_answers(settings(tmp_path, server, judge_model=None), cases(3))
    assert check.verdicts == [None, None, None]
    assert check.notes == [NO_LLM_NOTE] == ["no LLM configured: the rule alone"]
    assert check.model is None and check.requests == 0
    assert server.requests == []
    assert cascade([True, False, False, True], AnswerCheck(verdicts=[None, None])) == [True, False, False, True]


async def test_budget_stop(tmp_path: Path) -> None:
    with FakeOpenAIServer(default=answer("correct")) as srv:
        check = await check_answers(settings(tmp_path, srv, bench_llm_budget_requests=2), cases(5))
        assert len(srv.requests) == 2
    assert check.requests == 2
    assert check.verdicts == [True, True, None, None, None]
    assert check.notes == ["LLM answer check stopped at its budget of 2 requests"]


async def test_transient_errors_are_retried_a_little(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_retry, "BACKOFF_INITIAL_S", 0.01)
    with FakeOpenAIServer(default=answer("correct")) as srv:
        srv.script(error(503), answer("INCORRECT"))
        check = await check_answers(settings(tmp_path, srv), cases(1))
        assert check.verdicts == [False] and check.requests == 2
        srv.script(error(500), error(502), error(500), error(500))  # more failures than attempts
        check = await check_answers(settings(tmp_path, srv), cases(1))
        assert len(srv.requests) == answer_check.ATTEMPTS
    assert check.verdicts == [None]
    assert check.notes == ["LLM answer check failed for 1 of 1 items: Error code: 500 - scripted failure"]


async def test_unusable_replies(tmp_path: Path) -> None:
    with FakeOpenAIServer(default=answer("Maybe, it depends")) as srv:
        check = await check_answers(settings(tmp_path, srv), cases(2))
    assert check.verdicts == [None, None]
    assert check.notes == [
        "LLM answer check: 2 of 2 replies were neither correct nor incorrect (e.g. 'Maybe, it depends')"
    ]


def test_parse_verdict() -> None:
    assert parse_verdict("correct") is True
    assert parse_verdict(" Incorrect.\n") is False
    assert parse_verdict("**CORRECT**") is True
    assert parse_verdict("<think>is it correct?</think>incorrect") is False
    assert parse_verdict("correct, mostly") is None
    assert parse_verdict("") is None and parse_verdict(None) is None


def test_cascade_needs_one_verdict_per_miss() -> None:
    with pytest.raises(ValueError, match="2 LLM verdicts for 1 items"):
        cascade([True, False], AnswerCheck(verdicts=[True, True]))
