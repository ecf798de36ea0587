"""The LLM answer check: an OpenAI-compatible model says whether an answer matches the reference.

Used by the ``math`` scorer's cascade (aime25 in the reference: the rule first, then the LLM for
the items the rule marks wrong; an item counts when either says correct) and by the ``llm`` scorer
(every item). One short chat completion per item, answered with one word, ``correct`` or
``incorrect``; anything else, a failed request or the budget running out leaves that item's verdict
None, and the notes say why.

The transport pieces (what is transient, the backoff, the time budget) follow services/judge/llm.py;
they are copied, not imported, because services do not import one another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from evaluation.scorers import strip_think
from shared.llm_retry import Backoff, is_transient
from shared.logs import get_logger

CONCURRENCY = 8
ATTEMPTS = 3  # "retried a little": a check is cheap to lose, the cascade falls back to the rule
OUTPUT_TAIL_CHARS = 2000  # the final answer is at the end; the reasoning before it is not graded
NO_LLM_NOTE = "no LLM configured: the rule alone"

SYSTEM_PROMPT = (
    "You are grading a model's answer to a math or short-answer question against the reference answer. "
    "The answer is correct when it states the same final result as the reference (equivalent forms count: "
    "1/2 and 0.5, 204 and 204.0); how it was reached does not matter. "
    "Reply with exactly one word: correct or incorrect."
)
USER_TEMPLATE = "Question:\n{question}\n\nReference answer:\n{gold}\n\nModel's final answer:\n{output}"

log = get_logger("ftbus.benchmark.answer_check")


@dataclass(frozen=True)
class AnswerCase:
    question: str
    gold: str
    output: str  # the model's generated text; its <think> blocks are removed here too


@dataclass
class AnswerCheck:
    #: One per case, in order: True correct, False incorrect, None no usable verdict.
    verdicts: list[bool | None]
    model: str | None = None
    requests: int = 0  # HTTP requests sent, retries included (what the budget counts)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    notes: list[str] = field(default_factory=list)


def parse_verdict(content: str | None) -> bool | None:
    """``correct`` -> True, ``incorrect`` -> False (any case, a trailing full stop or markdown
    allowed); anything else -> None."""
    if content is None:
        return None
    word = strip_think(content).strip().strip("*_`'\".!").strip().casefold()
    return {"correct": True, "incorrect": False}.get(word)


def rule_misses(rule: Sequence[bool]) -> list[int]:
    """The indexes the cascade sends to the LLM: those the rule marks wrong."""
    return [i for i, ok in enumerate(rule) if not ok]


def cascade(rule: list[bool], llm: AnswerCheck) -> list[bool]:
    """An item counts when the rule says correct or the LLM says correct.

    Only the items the rule marks wrong are sent to the LLM, so ``llm.verdicts`` holds one verdict
    per False in ``rule``, in order (``cases = [cases[i] for i in rule_misses(rule)]``). A None
    verdict leaves the rule's answer.
    """
    misses = rule_misses(rule)
    if len(misses) != len(llm.verdicts):
        raise ValueError(f"{len(llm.verdicts)} LLM verdicts for {len(misses)} items the rule marks wrong")
    result = list(rule)
    for i, verdict in zip(misses, llm.verdicts, strict=True):
        result[i] = verdict is True
    return result


def answer_model(settings: Any) -> str | None:
    """The answer check's model: ``bench_llm_model``, else the judge's."""
    return getattr(settings, "bench_llm_model", None) or getattr(settings, "judge_model", None)


# ---------------------------------------------------------------- transport (after services/judge/llm.py)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        return exc.message[:300]  # the client's "Error code: <status> - <the server's message>"
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return "request timed out"
    return f"{type(exc).__name__}: {exc}"[:300]


class _OverBudget(Exception):
    pass


@dataclass
class _Run:
    """What the concurrent checks share: the client, the budget, the usage, the failures."""

    client: openai.AsyncOpenAI
    model: str
    budget: int
    request_timeout_s: float
    time_budget_s: float
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    over_budget: int = 0
    failures: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)

    async def request(self, messages: list[dict[str, str]], deadline: float) -> str | None:
        # Counted before the request goes out: no await between the check and the count, so the
        # concurrent checks never overspend.
        if self.requests >= self.budget:
            raise _OverBudget
        self.requests += 1
        timeout = max(0.1, min(self.request_timeout_s, deadline - time.monotonic()))
        # wait_for bounds the whole call: the client's timeout is per read, not per request.
        response = await asyncio.wait_for(
            self.client.chat.completions.create(model=self.model, messages=messages, timeout=timeout),  # type: ignore[arg-type]
            timeout=timeout + 1.0,
        )
        if not isinstance(response, ChatCompletion):
            raise ValueError(f"not a chat completion: {str(response)[:100]!r}")
        if response.usage is not None:
            self.prompt_tokens += response.usage.prompt_tokens or 0
            self.completion_tokens += response.usage.completion_tokens or 0
        if not response.choices or response.choices[0].finish_reason == "length":
            return None
        return response.choices[0].message.content

    async def check(self, case: AnswerCase) -> bool | None:
        output = strip_think(case.output)[-OUTPUT_TAIL_CHARS:]
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_TEMPLATE.format(question=case.question, gold=case.gold, output=output)},
        ]
        deadline = time.monotonic() + self.time_budget_s

        def out_of_time(retry_state: RetryCallState) -> bool:
            return time.monotonic() + retry_state.upcoming_sleep >= deadline

        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=Backoff(),
            stop=stop_after_attempt(ATTEMPTS) | out_of_time,
            reraise=True,
        )
        content: str | None = None
        try:
            async for attempt in retrying:
                with attempt:
                    content = await self.request(messages, deadline)
        except _OverBudget:
            self.over_budget += 1
            return None
        except (openai.OpenAIError, TimeoutError, ValueError) as exc:
            self.failures.append(_describe(exc))
            return None
        verdict = parse_verdict(content)
        if verdict is None:
            self.unusable.append((content or "")[:60])
        return verdict

    def notes(self, total: int) -> list[str]:
        notes: list[str] = []
        if self.over_budget:
            notes.append(f"LLM answer check stopped at its budget of {self.budget} requests")
        if self.failures:
            notes.append(f"LLM answer check failed for {len(self.failures)} of {total} items: {self.failures[0]}")
        if self.unusable:
            notes.append(
                f"LLM answer check: {len(self.unusable)} of {total} replies were neither correct nor incorrect "
                f"(e.g. {self.unusable[0]!r})"
            )
        return notes


def _client(settings: Any) -> openai.AsyncOpenAI | None:
    api_key = getattr(settings, "openai_api_key", None)
    base_url = getattr(settings, "openai_base_url", None)
    if not api_key and base_url:
        # Self-hosted OpenAI-compatible servers (vLLM, llama.cpp) often need no key; the client does.
        api_key = "EMPTY"
    if not api_key:
        return None
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url,
        max_retries=0,  # our own backoff, inside our own budget
        timeout=getattr(settings, "judge_request_timeout_s", 120.0),
    )


async def check_answers(settings: Any, cases: list[AnswerCase]) -> AnswerCheck:
    """One verdict per case from the configured LLM (up to CONCURRENCY requests at once).

    Never raises for the LLM's sake: no model, no key, failures and the budget all end in None
    verdicts and a note.
    """
    model = answer_model(settings)
    if not model:
        return AnswerCheck(verdicts=[None] * len(cases), notes=[NO_LLM_NOTE])
    if not cases:
        return AnswerCheck(verdicts=[], model=model)
    client = _client(settings)
    if client is None:
        return AnswerCheck(
            verdicts=[None] * len(cases), model=model,
            notes=["LLM answer check skipped: no OpenAI API key configured (FTBUS_OPENAI_API_KEY or OPENAI_API_KEY)"],
        )
    run = _Run(
        client=client,
        model=model,
        budget=int(getattr(settings, "bench_llm_budget_requests", 200)),
        request_timeout_s=float(getattr(settings, "judge_request_timeout_s", 120.0)),
        time_budget_s=float(getattr(settings, "judge_time_budget_s", 300.0)),
    )
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(case: AnswerCase) -> bool | None:
        async with gate:
            return await run.check(case)

    try:
        verdicts = list(await asyncio.gather(*(one(case) for case in cases)))
    finally:
        await client.close()
    check = AnswerCheck(
        verdicts=verdicts, model=model, requests=run.requests, prompt_tokens=run.prompt_tokens,
        completion_tokens=run.completion_tokens, notes=run.notes(len(cases)),
    )
    log.info(
        "answer_check_done", model=model, items=len(cases), requests=run.requests,
        correct=sum(v is True for v in verdicts), unanswered=sum(v is None for v in verdicts),
    )
    return check
