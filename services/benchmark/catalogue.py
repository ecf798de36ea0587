"""The benchmarks users name (the reference's ``aime24``, ``aime25``, ``math``, ``mmlu``,
``humaneval``, ``mbpp``, and ``gsm8k``), each with its hub dataset, the columns it needs, how a row
becomes an item, and how it is scored (docs/benchmarks.md says why each scorer)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
MMLU_LETTERS = "ABCD"


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    hub_id: str
    hub_config: str | None
    hub_split: str
    columns: tuple[str, ...]
    #: row, its index -> (subset, item fields)
    to_item: Callable[[Row, int], tuple[str, dict[str, Any]]]
    descriptor: dict[str, Any] = field(default_factory=dict)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_") or "x"


def _gsm8k(row: Row, i: int) -> tuple[str, dict[str, Any]]:
    return "main", {"id": f"gsm8k-{i}", "question": row["question"], "answer": row["answer"]}


def _math(row: Row, i: int) -> tuple[str, dict[str, Any]]:
    subset = _slug(row["type"]) if row.get("type") else "math"
    return subset, {"id": f"math-{i}", "question": row["problem"], "answer": row["solution"]}


def _aime(prefix: str) -> Callable[[Row, int], tuple[str, dict[str, Any]]]:
    def convert(row: Row, i: int) -> tuple[str, dict[str, Any]]:
        return prefix, {"id": f"{prefix}-{row.get('id', i)}", "question": row["problem"], "answer": str(row["answer"])}
    return convert


def _mmlu(row: Row, i: int) -> tuple[str, dict[str, Any]]:
    choices = [str(c) for c in row["choices"]]
    answer = row["answer"]
    index = MMLU_LETTERS.index(answer) if isinstance(answer, str) and answer in MMLU_LETTERS else int(answer)
    if len(choices) != 4 or not 0 <= index < 4:
        raise ValueError(f"MMLU rows have 4 choices and an answer 0-3 or A-D (got {len(choices)} choices, {answer!r})")
    body = "\n".join(f"{letter}. {text}" for letter, text in zip(MMLU_LETTERS, choices, strict=True))
    subject = _slug(row["subject"])
    return subject, {"id": f"mmlu-{subject}-{i}", "question": f"{str(row['question']).strip()}\n{body}\nAnswer:",
                     "choices": choices, "answer": choices[index]}


def _humaneval(row: Row, i: int) -> tuple[str, dict[str, Any]]:
    return "humaneval", {"id": row["task_id"], "question": row["prompt"], "answer": row["canonical_solution"],
                         "test": row["test"], "entry_point": row["entry_point"]}


def _mbpp(row: Row, i: int) -> tuple[str, dict[str, Any]]:
    tests = "\n".join(row["test_list"])
    question = (f"You are an expert Python programmer, and here is your task: {row['text']} "
                f"Your code should pass these tests:\n\n{tests}\n")
    setup = row.get("test_setup_code") or ""
    return "mbpp", {"id": f"mbpp-{row.get('task_id', i)}", "question": question, "answer": row["code"],
                    "test": (setup + "\n" + tests).strip()}


_MATH_PROMPT = "Problem:\n{{question}}\n\nPut the final answer in \\boxed{}.\n\nSolution:"

CATALOGUE: dict[str, CatalogueEntry] = {e.name: e for e in (
    CatalogueEntry("gsm8k", "openai/gsm8k", "main", "test", ("question", "answer"), _gsm8k, {
        "kind": "generate_until", "scorer": "gsm8k", "primary_metric": "strict_match",
        "prompt": "Question: {{question}}\nAnswer:",
        "generation": {"max_gen_toks": 256, "until": ["Question:", "</s>", "<|im_end|>"]}}),
    CatalogueEntry("math", "EleutherAI/hendrycks_math", None, "test", ("problem", "solution"), _math, {
        "kind": "generate_until", "scorer": "math", "primary_metric": "math_verify", "prompt": _MATH_PROMPT,
        "generation": {"max_gen_toks": 2048, "until": ["Problem:"]}}),
    CatalogueEntry("aime24", "HuggingFaceH4/aime_2024", None, "train", ("problem", "answer"), _aime("aime24"), {
        "kind": "generate_until", "scorer": "math", "primary_metric": "math_verify", "prompt": _MATH_PROMPT,
        "generation": {"max_gen_toks": 32768, "until": []}}),
    CatalogueEntry("aime25", "math-ai/aime25", None, "test", ("problem", "answer"), _aime("aime25"), {
        "kind": "generate_until", "scorer": "math", "primary_metric": "math_cascade", "llm_cascade": True,
        "prompt": _MATH_PROMPT, "generation": {"max_gen_toks": 32768, "until": []}}),
    CatalogueEntry("mmlu", "cais/mmlu", "all", "test", ("question", "subject", "choices", "answer"), _mmlu, {
        "kind": "multiple_choice", "scorer": "choice", "primary_metric": "acc",
        "generation": {"max_gen_toks": 32, "until": ["\n\n"]}}),
    CatalogueEntry("humaneval", "openai/openai_humaneval", None, "test",
                   ("task_id", "prompt", "canonical_solution", "test", "entry_point"), _humaneval, {
        "kind": "generate_until", "scorer": "code", "code_style": "humaneval", "primary_metric": "pass@1",
        "generation": {"max_gen_toks": 512, "until": ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]}}),
    CatalogueEntry("mbpp", "google-research-datasets/mbpp", "full", "test", ("text", "code", "test_list"), _mbpp, {
        "kind": "generate_until", "scorer": "code", "code_style": "mbpp", "primary_metric": "pass@1",
        "prompt": "{{question}}[BEGIN]\n", "generation": {"max_gen_toks": 512, "until": ["[DONE]", "\n\n\n"]}}),
)}
