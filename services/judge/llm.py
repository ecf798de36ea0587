"""Ask an OpenAI-compatible model for the judge's JSON answer.

Two kinds of retry, kept apart:
- transport (connection errors, timeouts, 408/409/429, 5xx): exponential backoff with tenacity,
  inside ``judge_time_budget_s`` for each answer; the openai client's own retries are off, so the
  budget is ours;
- content (not JSON, wrong keys, non-boolean decision): up to ``judge_retry`` answers, each new
  request telling the model why the previous answer was rejected, as the reference does.
Whatever goes wrong ends in :class:`LlmJudgeUnavailable` with a reason, so the caller can fall
back to the rules.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from services.judge.prompts import JudgeTemplates, render_retry_note, templates_for
from shared import metrics
from shared.errors import ExplainedError
from shared.llm_retry import Backoff, is_transient
from shared.logs import get_logger
from shared.settings import Settings

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


class LlmJudgeUnavailable(ExplainedError):
    """No valid answer could be had; ``reason`` says why, for JudgeInfo.reason."""

    @property
    def reason(self) -> str:
        return self.message


class LlmAnswer(BaseModel):
    """The model's answer, validated as strictly as the reference's builder (and a bit more)."""

    model_config = ConfigDict(extra="forbid")

    execution: str
    return_checking: str
    code: str
    final_decision: bool

    @field_validator("execution", "return_checking", "code", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        # Models sometimes answer with structured prose; keep it, as JSON text (the reference does).
        if isinstance(value, dict | list):
            return json.dumps(value, indent=2, ensure_ascii=False)
        return value

    @field_validator("final_decision", mode="before")
    @classmethod
    def _decision(cls, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if value in ("true", "True"):
            return True
        if value in ("false", "False"):
            return False
        # pydantic alone would take 1, "yes", "on"...: an ambiguous decision is a rejected answer.
        raise ValueError(f"final_decision must be a boolean, got {value!r}")


@dataclass(frozen=True)
class LlmOutcome:
    answer: LlmAnswer
    attempts: int  # answers requested, including rejected ones


class _InvalidAnswer(Exception):
    pass


def parse_answer(content: str | None) -> LlmAnswer:
    """Validate one answer's text; raises _InvalidAnswer with a message meant for the model."""
    if content is None or not content.strip():
        raise _InvalidAnswer("the answer was empty; reply with the JSON object only")
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:  # tolerated: the content inside the fence is still checked strictly
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _InvalidAnswer(f"the answer is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise _InvalidAnswer(f"the answer must be a JSON object, got {type(data).__name__}")
    try:
        return LlmAnswer.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'answer'}: {err['msg']}" for err in exc.errors()
        )
        raise _InvalidAnswer(problems) from exc


# ---------------------------------------------------------------- transport


@dataclass
class _Deadline:
    at: float
    budget_s: float

    @classmethod
    def after(cls, budget_s: float) -> _Deadline:
        return cls(at=time.monotonic() + budget_s, budget_s=budget_s)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def stop(self, retry_state: RetryCallState) -> bool:
        # Give up when the next sleep would end past the budget: a retry then could not finish.
        return time.monotonic() + retry_state.upcoming_sleep >= self.at


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"[:500]
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return "request timed out"
    return f"{type(exc).__name__}: {exc}"[:500]


async def _complete(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict[str, str]],
    settings: Settings,
    json_mode: list[bool],
) -> str | None:
    """One answer, retrying transient failures within ``judge_time_budget_s``."""
    deadline = _Deadline.after(settings.judge_time_budget_s)
    request_timeout_s = settings.judge_request_timeout_s

    async def call() -> str | None:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise TimeoutError
        timeout = min(request_timeout_s, remaining)
        kwargs: dict[str, Any] = {"response_format": {"type": "json_object"}} if json_mode[0] else {}
        # wait_for bounds the whole call: the client's timeout is per read, not per request.
        response = await asyncio.wait_for(
            client.chat.completions.create(model=model, messages=messages, timeout=timeout, **kwargs),  # type: ignore[arg-type]
            timeout=timeout + 1.0,
        )
        if not isinstance(response, ChatCompletion):
            # A 200 that is not a chat completion (an HTML page from a proxy, say): not the model's fault.
            raise LlmJudgeUnavailable(f"LLM endpoint did not answer with a chat completion: {str(response)[:200]!r}")
        metrics.llm_call("judge")
        if response.usage is not None:
            metrics.llm_tokens("judge", response.usage.prompt_tokens or 0, response.usage.completion_tokens or 0)
        if not response.choices:
            return None
        choice = response.choices[0]
        if choice.finish_reason == "length":
            raise _InvalidAnswer("the answer was cut off at the length limit; answer more briefly")
        return choice.message.content

    def log_retry(retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        get_logger("ftbus.judge.llm").warning(
            "judge_llm_transport_retry",
            attempt=retry_state.attempt_number,
            error=_describe(exc) if exc else None,
            sleep_s=round(retry_state.upcoming_sleep, 2),
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=Backoff(),
        stop=deadline.stop,
        before_sleep=log_retry,
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                try:
                    return await call()
                except openai.BadRequestError as exc:
                    # Some OpenAI-compatible servers reject response_format: drop it once, then ask again.
                    if json_mode[0] and "response_format" in str(exc):
                        json_mode[0] = False
                        return await call()
                    raise
    except (_InvalidAnswer, LlmJudgeUnavailable):
        raise
    except Exception as exc:
        if is_transient(exc):
            raise LlmJudgeUnavailable(
                f"LLM endpoint unavailable within the {deadline.budget_s:g} s time budget: {_describe(exc)}"
            ) from exc
        if isinstance(exc, openai.OpenAIError):
            raise LlmJudgeUnavailable(f"LLM endpoint refused the request: {_describe(exc)}") from exc
        raise
    return None  # pragma: no cover - AsyncRetrying either returns or raises


# ---------------------------------------------------------------- conversation


def make_client(settings: Settings) -> openai.AsyncOpenAI:
    api_key = settings.openai_api_key
    if not api_key and settings.openai_base_url:
        # Self-hosted OpenAI-compatible servers (vLLM, llama.cpp) often need no key; the client does.
        api_key = "EMPTY"
    if not api_key:
        raise LlmJudgeUnavailable("no OpenAI API key configured (FTBUS_OPENAI_API_KEY or OPENAI_API_KEY)")
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=settings.openai_base_url,
        max_retries=0,  # our own backoff, inside our own budget
        timeout=settings.judge_request_timeout_s,
    )


async def ask_llm(
    system_prompt: str,
    user_prompt: str,
    settings: Settings,
    *,
    client: openai.AsyncOpenAI | None = None,
    templates: JudgeTemplates | None = None,
) -> LlmOutcome:
    """Get a validated answer from ``settings.judge_model``, or raise LlmJudgeUnavailable."""
    if not settings.judge_model:
        raise LlmJudgeUnavailable("no judge model configured")
    templates = templates or templates_for(settings)
    owned = client is None
    client = client or make_client(settings)
    json_mode = [True]
    notes: list[str] = []
    last_error = "no answer"
    try:
        for attempt in range(1, settings.judge_retry + 1):
            prompt = "\n\n".join([user_prompt, *notes])
            messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
            try:
                content = await _complete(client, settings.judge_model, messages, settings, json_mode)
                answer = parse_answer(content)
            except _InvalidAnswer as exc:
                last_error = str(exc)
                get_logger("ftbus.judge.llm").info("judge_llm_answer_rejected", attempt=attempt, error=last_error)
                notes.append(render_retry_note(attempt, last_error, templates))
                continue
            return LlmOutcome(answer=answer, attempts=attempt)
    finally:
        if owned:
            await client.close()
    raise LlmJudgeUnavailable(f"LLM answer never validated after {settings.judge_retry} attempts: {last_error}")
