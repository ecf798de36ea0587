"""The judge end to end against a local OpenAI-compatible server, through the real openai client."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.judge import llm as judge_llm
from services.judge.decide import judge
from services.judge.llm import LlmAnswer, parse_answer
from shared.decision import POLICY_MEANING
from shared.events import ErrorSample, FailedStage
from shared.settings import Settings
from tests.fakes import judge_events as ev
from tests.fakes.judge_events import OOM_LOG
from tests.fakes.openai_server import FakeOpenAIServer, Reply, answer, error

GOOD = {
    "execution": "SUCCESS: all stages exited 0; gsm8k accuracy 0.52.",
    "return_checking": "Validation accuracy 0.52 on gsm8k, above the base model's 0.45.",
    "code": "Config is sound; consider 2 epochs instead of 3.",
    "final_decision": True,
}
FAILED = {
    "execution": "FAILED with category [OOM]: CUDA out of memory during training.",
    "return_checking": "Training crashed at step 7; expected model files in output/.",
    "code": "Lower per_device_train_batch_size to 4 and cutoff_len to 2048.",
    "final_decision": False,
}


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


class BudgetClock:
    """The judge's time budget on a clock of its own: services/judge/llm.py reads ``time.monotonic``
    for its deadline, and tenacity sleeps out each backoff; here each backoff moves this clock on at
    once (recorded in ``sleeps``) and nothing else does, so how many tries fit in a budget is
    arithmetic, never the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def budget_clock(monkeypatch: pytest.MonkeyPatch) -> BudgetClock:
    clock = BudgetClock()
    monkeypatch.setattr(judge_llm, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(judge_llm, "AsyncRetrying", functools.partial(judge_llm.AsyncRetrying, sleep=clock.sleep))
    return clock


def make_settings(tmp_path: Path, server: FakeOpenAIServer | None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path,
        "judge_model": "fake-judge" if server else None,
        "openai_base_url": server.base_url if server else None,
        "openai_api_key": "test-key",
        "judge_retry": 3,
        # Hang guards, not limits: the local server answers at once, and no test here races them.
        "judge_time_budget_s": 120.0,
        "judge_request_timeout_s": 60.0,
    }
    values.update(overrides)
    return Settings(**values)


# ---------------------------------------------------------------- answer validation


def test_answer_validation_rules() -> None:
    assert parse_answer(json.dumps({**GOOD, "final_decision": "true"})).final_decision is True
    assert parse_answer(json.dumps({**GOOD, "final_decision": "True"})).final_decision is True
    assert parse_answer(json.dumps({**GOOD, "final_decision": "false"})).final_decision is False
    assert parse_answer(json.dumps({**GOOD, "final_decision": "False"})).final_decision is False
    for bad in ("yes", "TRUE", 1, 0, None, "1"):
        with pytest.raises(ValidationError):
            LlmAnswer.model_validate({**GOOD, "final_decision": bad})
    with pytest.raises(ValidationError):
        LlmAnswer.model_validate({**GOOD, "verdict": "extra"})
    structured = LlmAnswer.model_validate({**GOOD, "code": {"batch_size": 4}, "execution": ["a", "b"]})
    assert json.loads(structured.code) == {"batch_size": 4} and json.loads(structured.execution) == ["a", "b"]
    assert parse_answer("```json\n" + json.dumps(GOOD) + "\n```").final_decision is True


# ---------------------------------------------------------------- happy paths


async def test_good_answer(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(answer(GOOD))
    event = ev.bench_result(n_loss=200)
    before = event.model_dump()
    result = await judge(event, ev.TRAIN_YAML, {"training": "Training completed.\n"}, make_settings(tmp_path, server))

    assert result.feedback.final_decision is True
    assert result.feedback.execution == GOOD["execution"] and result.feedback.code == GOOD["code"]
    assert result.judge.kind == "llm" and result.judge.model == "fake-judge"
    assert result.judge.rules_decision is True and result.judge.llm_decision is True
    assert result.judge.attempts == 1 and result.judge.reason is None
    assert result.failed_stage is None and result.expects_test is True
    assert result.request_id == "req-1" and result.context == event.context
    # The verdict carries the full, unmutated results and the training outputs.
    assert event.model_dump() == before
    assert len(result.result.training_metrics.loss_history.train) == 200
    assert result.result.benchmark == event.benchmark and result.result.baseline == event.baseline
    assert result.result.data_stats == event.data.data_stats
    assert [a.path for a in result.artifacts] == ["output/adapter_model.safetensors", "output/adapter_config.json"]
    assert result.raw_execution.index("=== DATA PROCESSING OUTPUT ===") < result.raw_execution.index(
        "=== TRAINING OUTPUT ==="
    )
    assert "Training completed." in result.raw_execution

    (request,) = server.requests
    assert request.body["model"] == "fake-judge"
    assert request.body["response_format"] == {"type": "json_object"}
    assert request.headers.get("authorization") == "Bearer test-key"
    assert "final_decision" in request.system_prompt
    assert "Benchmark: gsm8k" in request.user_prompt and "first 30 and last 30 of 200" in request.user_prompt


async def test_invalid_answers_then_good_one(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(
        answer("I think the run went fine."),
        answer({**GOOD, "final_decision": "yes"}),
        answer(GOOD),
    )
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert result.judge.kind == "llm" and result.judge.attempts == 3 and result.feedback.final_decision

    first, second, third = (r.user_prompt for r in server.requests)
    assert "Attempt 1" not in first
    assert "Attempt 1: the previous answer was rejected because: the answer is not valid JSON" in second
    assert "Attempt 2" not in second
    assert "Attempt 1: the previous answer was rejected because" in third
    assert "Attempt 2: the previous answer was rejected because: final_decision" in third
    assert third.startswith(first)


async def test_string_booleans_are_accepted(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(answer({**GOOD, "final_decision": "True"}))
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert result.feedback.final_decision is True and result.judge.llm_decision is True

    server.script(answer({**FAILED, "final_decision": "false"}))
    settings = make_settings(tmp_path, server)
    result = await judge(ev.train_failed(1, OOM_LOG), ev.TRAIN_YAML, {"training": OOM_LOG}, settings)
    assert result.feedback.final_decision is False and result.judge.llm_decision is False


async def test_cut_off_answer_is_retried(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(answer('{"execution": "SUCC', finish_reason="length"), answer(GOOD))
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert result.judge.kind == "llm" and result.judge.attempts == 2
    assert "length limit" in server.requests[1].user_prompt


async def test_server_without_json_mode(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(error(400, "Unsupported parameter: response_format"), answer(GOOD))
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert result.judge.kind == "llm"
    assert "response_format" in server.requests[0].body and "response_format" not in server.requests[1].body


# ---------------------------------------------------------------- fallbacks to the rules


async def test_answer_that_never_validates(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.default = answer({**GOOD, "final_decision": "maybe"})
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert len(server.requests) == 3
    assert result.judge.kind == "rules" and result.judge.model is None
    assert result.judge.reason is not None
    assert result.judge.reason.startswith("LLM answer never validated after 3 attempts: final_decision")
    assert result.feedback.final_decision is True  # the rules decide: every criterion passed
    assert result.feedback.execution.startswith("SUCCESS")


async def test_500_backs_off_then_falls_back(
    server: FakeOpenAIServer, tmp_path: Path, budget_clock: BudgetClock
) -> None:
    server.default = error(500, "upstream exploded")
    # On the budget's own clock, answers take no time: tries at 0, 1, 3, 7, 15 and 31 s (backoffs of
    # 1, 2, 4, 8, 16 s), then the next backoff (30 s) would end at the budget's 61 s: give up. Each
    # try still had >= 30 s of the budget for its request (a hang guard, never a race): the last
    # error is the 500, not a request cut short by the budget.
    settings = make_settings(tmp_path, server, judge_time_budget_s=61.0, judge_request_timeout_s=60.0)
    result = await judge(ev.train_failed(1, OOM_LOG), ev.TRAIN_YAML, {"training": OOM_LOG}, settings)
    assert budget_clock.sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]  # retried with backoff before giving up
    assert len(server.requests) == 6
    assert budget_clock.now <= 61.0  # bounded by the budget
    assert result.judge.kind == "rules"
    assert result.judge.reason is not None and "HTTP 500" in result.judge.reason
    assert "time budget" in result.judge.reason
    assert result.feedback.execution.startswith("FAILED with category [OOM]")
    assert result.feedback.final_decision is False


async def test_transient_errors_recover(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(error(503), error(429, headers={"retry-after": "0"}), answer(GOOD))
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert len(server.requests) == 3
    assert result.judge.kind == "llm" and result.judge.attempts == 1


async def test_timeout_backs_off_then_falls_back(
    server: FakeOpenAIServer, tmp_path: Path, budget_clock: BudgetClock
) -> None:
    server.default = Reply(content=json.dumps(GOOD), delay_s=math.inf)  # never answers: every try times out
    settings = make_settings(tmp_path, server, judge_time_budget_s=4.0, judge_request_timeout_s=0.5)
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, settings)
    # Tries at 0, 1 and 3 s of the budget's clock; the next backoff (4 s) would end past its 4 s.
    assert budget_clock.sleeps == [1.0, 2.0]
    assert len(server.requests) == 3
    assert budget_clock.now <= 4.0
    assert result.judge.kind == "rules"
    assert result.judge.reason is not None and "timed out" in result.judge.reason
    assert result.feedback.final_decision is True


async def test_auth_error_is_not_retried(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.default = error(401, "invalid api key")
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert len(server.requests) == 1
    assert result.judge.kind == "rules"
    assert result.judge.reason is not None and "HTTP 401" in result.judge.reason


async def test_no_judge_model_uses_rules(tmp_path: Path) -> None:
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, None))
    assert result.judge.kind == "rules" and result.judge.reason == "no judge model configured"
    assert result.judge.rules_decision is True and result.feedback.final_decision is True


async def test_precheck_never_calls_the_llm(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.default = answer(GOOD)
    event = ev.precheck_failed("unsafe path in workspace: ../secrets.txt")
    result = await judge(event, "", {}, make_settings(tmp_path, server))
    assert server.requests == []
    assert result.judge.kind == "rules" and not result.feedback.final_decision
    assert result.failed_stage == FailedStage.precheck
    assert "../secrets.txt" in result.feedback.execution
    assert result.expects_test is False and result.artifacts == []


# ---------------------------------------------------------------- policy


async def test_rules_fail_but_llm_says_true(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(answer(GOOD))
    event = ev.bench_result(model_files=[])
    result = await judge(event, ev.TRAIN_YAML, {}, make_settings(tmp_path, server, judge_policy="llm"))
    assert result.judge.kind == "llm"
    assert result.judge.llm_decision is True and result.judge.rules_decision is False
    assert result.feedback.final_decision is False
    assert "no model files in the training output" in result.feedback.return_checking
    assert result.judge.reason is not None and "deterministic checks failed" in result.judge.reason


@pytest.mark.parametrize(
    ("policy", "llm_says", "expected"),
    [
        ("both", True, True),
        ("both", False, False),
        ("llm", True, True),
        ("llm", False, False),
        ("rules", True, True),
        ("rules", False, True),
    ],
)
async def test_policy_when_rules_pass(
    server: FakeOpenAIServer, tmp_path: Path, policy: str, llm_says: bool, expected: bool
) -> None:
    server.script(answer({**GOOD, "final_decision": llm_says}))
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server, judge_policy=policy))
    assert result.judge.rules_decision is True and result.judge.llm_decision is llm_says
    assert result.feedback.final_decision is expected
    if expected != llm_says:
        assert "judge_policy=rules" in result.feedback.return_checking


@pytest.mark.parametrize(("policy", "expected"), [("both", False), ("llm", True), ("rules", True)])
async def test_policy_when_the_candidate_is_below_the_base_model(
    server: FakeOpenAIServer, tmp_path: Path, policy: str, expected: bool
) -> None:
    # Every rule passes and the LLM says true; only "both" also requires the candidate to match the base model.
    server.script(answer(GOOD))
    event = ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.30}}))
    result = await judge(event, ev.TRAIN_YAML, {}, make_settings(tmp_path, server, judge_policy=policy))
    assert result.judge.kind == "llm" and result.judge.rules_decision is True and result.judge.llm_decision is True
    assert result.feedback.final_decision is expected
    if expected:
        # Accepted under a looser policy than `better`: the only note says what "accepted" means there.
        assert result.judge.reason is None and result.judge.policy == policy
        assert result.feedback.return_checking.endswith(
            f"[ftbus] Note: final_decision is true under judge_policy={policy}, which means: "
            f"{POLICY_MEANING[policy]}.")
        assert result.feedback.return_checking.count("[ftbus] Note") == 1
    else:
        assert result.judge.reason == (
            "judge_policy=both requires the candidate not to score below the base model: "
            "validation gsm8k/accuracy = 0.3 is below the base model's 0.45 (higher is better)"
        )
        assert result.feedback.return_checking.startswith(GOOD["return_checking"])
        assert "[ftbus] Note: final_decision is false because judge_policy=both" in result.feedback.return_checking


@pytest.mark.parametrize(("improved", "expected"), [(25, True), (1, False)])
async def test_significant_refuses_what_the_llm_cannot_tell_from_noise(
    server: FakeOpenAIServer, tmp_path: Path, improved: int, expected: bool
) -> None:
    """judge_policy=significant: the LLM says true both times; only a difference beyond noise passes, and
    the feedback carries the paired comparison in words whoever wrote it."""
    from shared.events import BaselineComparison, BenchmarkScores
    from shared.paired import compare_scores

    def scores(right: int) -> BenchmarkScores:
        return BenchmarkScores(accuracy_summary={"gsm8k": {"accuracy": right / 60}}, primary_metric="accuracy",
                               primary_value=right / 60,
                               item_scores={"gsm8k": {f"i{k}": [float(k < right)] for k in range(60)}})

    candidate, base = scores(20 + improved), scores(20)
    paired, words = compare_scores(candidate, base)
    event = ev.bench_result(benchmark=candidate).model_copy(update={"baseline": BaselineComparison(
        baseline=base, primary_metric="accuracy", candidate_value=candidate.primary_value,
        baseline_value=base.primary_value, difference=improved / 60, paired=paired, summary=words)})
    server.script(answer(GOOD))
    result = await judge(event, ev.TRAIN_YAML, {}, make_settings(tmp_path, server, judge_policy="significant"))
    assert result.judge.kind == "llm" and result.judge.llm_decision is True
    assert result.feedback.final_decision is expected
    assert f"[ftbus] Paired with the base model on the same validation items, the candidate is {words}." \
        in result.feedback.return_checking
    # The LLM was asked with the interval and the p-value, not a bare difference.
    prompt = server.requests[-1].user_prompt
    assert "95% interval of the difference [" in prompt and "p-value" in prompt
    if not expected:
        assert result.judge.reason is not None and "beyond noise: not distinguishable" in result.judge.reason


@pytest.mark.parametrize("policy", ["both", "llm", "rules"])
async def test_policy_never_overrides_a_failed_rule(server: FakeOpenAIServer, tmp_path: Path, policy: str) -> None:
    server.script(answer(GOOD))
    event = ev.train_failed(1, OOM_LOG)
    settings = make_settings(tmp_path, server, judge_policy=policy)
    result = await judge(event, ev.TRAIN_YAML, {"training": OOM_LOG}, settings)
    assert result.feedback.final_decision is False
    assert result.failed_stage == FailedStage.training and result.expects_test is False
    assert "=== TRAINING OUTPUT ===" in result.raw_execution and "OutOfMemoryError" in result.raw_execution


# ---------------------------------------------------------------- isolation


async def test_sent_prompt_has_no_test_split_data(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.script(answer(GOOD))
    test_samples = [ErrorSample(question="TEST-SPLIT-Q-4242", gold="TEST-SPLIT-GOLD", model_output="TEST-OUT")]
    test_event = ev.bench_result(
        split="test", benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.7391}}, samples=test_samples)
    )
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    sent = json.dumps(server.requests[0].body)
    for leaked in ("TEST-SPLIT-Q-4242", "TEST-SPLIT-GOLD", "TEST-OUT", "0.7391"):
        assert leaked not in sent and leaked not in result.model_dump_json()
    assert "VAL-Q-7781" in sent
    with pytest.raises(ValueError, match="validation"):
        await judge(test_event, ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert len(server.requests) == 1


async def test_missing_api_key_is_a_clear_reason(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, None, judge_model="gpt-5.1", openai_api_key=None, openai_base_url=None)
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, settings)
    assert result.judge.kind == "rules"
    assert result.judge.reason is not None and "no OpenAI API key configured" in result.judge.reason


async def test_logs_by_stage_from_the_handler(server: FakeOpenAIServer, tmp_path: Path) -> None:
    # The handler passes every stage's log: raw_execution shows each under its banner, and the
    # judge reads the failed stage's log only.
    handled = 'Traceback (most recent call last):\n  File "p.py", line 3\nTimeoutError: retrying API call\n'
    logs = {"data_processing": f"{handled}wrote 1234 samples", "training": OOM_LOG}
    combined = f"=== DATA PROCESSING OUTPUT ===\n{handled}wrote 1234 samples\n=== TRAINING OUTPUT ===\n{OOM_LOG}"
    server.script(answer(FAILED))
    result = await judge(ev.train_failed(1, OOM_LOG), ev.TRAIN_YAML, logs, make_settings(tmp_path, server))
    assert result.raw_execution == combined
    prompt = server.requests[0].user_prompt
    assert "torch.OutOfMemoryError" in prompt and "retrying API call" not in prompt
    assert result.feedback.execution == FAILED["execution"]


async def test_endpoint_that_is_not_an_llm(server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.default = Reply(status=200, body="<html>proxy login</html>")
    result = await judge(ev.bench_result(), ev.TRAIN_YAML, {}, make_settings(tmp_path, server))
    assert len(server.requests) == 1
    assert result.judge.kind == "rules"
    assert result.judge.reason is not None and "not answer with a chat completion" in result.judge.reason
