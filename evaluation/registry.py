"""The benchmark registry: one folder per benchmark under ``<assets>/benchmarks/``.

Unlike the reference (a name -> OpenCompass config module, no metric or version), a benchmark here
is a descriptor that says what to compare and how (pain point 14)::

    <assets>/benchmarks/<name>/benchmark.yaml
        name: tiny-arith                # equals the folder name
        version: 1                      # bump when items change: split manifests and caches key on it
        description: ...
        kind: generate_until            # or multiple_choice
        primary_metric: exact_match     # generate_until: exact_match; multiple_choice: acc | acc_norm
        higher_is_better: true
        subsets: [{name: addition, file: addition.jsonl}, ...]
        generation: {max_gen_toks: 16, until: ["\\n"]}     # optional, generate_until only
        scorer: exact                   # optional: how outputs are scored (SCORER_METRICS below)
        prompt: "Question: {{question}}\\nAnswer:"   # optional: lm-eval's doc_to_text (Jinja)
        source: "openai/gsm8k, main"    # optional: where the items came from
        llm_cascade: false              # math scorers: the rule, then an LLM for the items it marks wrong
        code_style: humaneval           # code scorer: how a program is built (humaneval | mbpp)
        chat_prompt: "..."              # optional: the prompt for chat models (lm-eval's _instruct variant)
        chat_gen_prefix: "..."          # optional: the start of the answer for chat models (lm-eval's gen_prefix)
        answer_range: [0, 999]          # optional, math scorers: the answer must be an integer in this range
        num_runs: 1                     # samples per item (a request's num_runs wins); their mean is reported
    <assets>/benchmarks/<name>/<subset file>.jsonl
        {"id": "add-000", "question": "What is 1 + 2?", "answer": "3"}
        multiple_choice items add "choices": [...] and "answer" is the text of the right choice.
        code items add "test" (the benchmark's tests, seen by the code executor only) and, for
        humaneval-style items, "entry_point" (the function the tests call).

Scorers: ``exact`` and ``loglik`` are computed by lm-eval itself (exact match of the generated
text; the choices' log-likelihood). The others are computed by ftbus from lm-eval's generated
text (evaluation/scorers.py), code by running it in the code executor
(evaluation/executor.py): lm-eval would ``exec`` it in its own process.

Items keep their file order, which the splits rely on (see splits.py).
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.events import MAX_RUNS

DESCRIPTOR = "benchmark.yaml"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
BenchmarkKind = Literal["generate_until", "multiple_choice"]
ScorerName = Literal["exact", "loglik", "gsm8k", "math", "choice", "code", "numeric", "f1", "rouge_l", "llm"]
CodeStyle = Literal["humaneval", "mbpp"]
#: How a chat model's program is built where the benchmark has a chat variant (lm-eval's
#: humaneval_instruct: the prompt, then the reply up to its closing fence).
CHAT_CODE_STYLES: dict[str, str] = {"humaneval": "humaneval_instruct"}

# The metrics each scorer reports, its primary metric first; the primary metric must be one of them.
SCORER_METRICS: dict[str, tuple[str, ...]] = {
    "exact": ("exact_match",),                          # lm-eval: exact match, case-insensitive
    "loglik": ("acc", "acc_norm"),                      # lm-eval: the most likely choice
    "gsm8k": ("strict_match", "flexible_match"),        # the answer after ####; the last number
    "math": ("math_verify", "math_cascade"),            # \boxed{} by math-verify; then the LLM's rescue
    "choice": ("acc", "acc_norm", "letter_acc"),        # log-likelihood, and the letter generated
    "code": ("pass@1",),                                # the benchmark's tests, in the executor
    "numeric": ("numeric_match",),                      # the last number, within a relative 1e-6
    "f1": ("f1",),                                      # SQuAD token F1 against the gold text
    "rouge_l": ("rouge_l",),                            # ROUGE-L F-measure against the gold text
    "llm": ("llm_judge",),                              # an LLM says correct or incorrect, every item
}
#: Which benchmark kind each scorer needs.
SCORER_KINDS: dict[str, BenchmarkKind] = {
    "loglik": "multiple_choice", "choice": "multiple_choice",
    **{name: "generate_until" for name in ("exact", "gsm8k", "math", "code", "numeric", "f1", "rouge_l", "llm")},
}
#: Computed by lm-eval itself; every other scorer reads lm-eval's generated text.
LM_EVAL_SCORERS = frozenset({"exact", "loglik"})
DEFAULT_SCORER: dict[str, str] = {"generate_until": "exact", "multiple_choice": "loglik"}
#: Kept for the backends that compute only lm-eval's own metrics (OpenCompass).
KIND_METRICS: dict[str, tuple[str, ...]] = {kind: SCORER_METRICS[s] for kind, s in DEFAULT_SCORER.items()}


class BenchmarkError(ValueError):
    """A benchmark is unknown or malformed; the message says which and why."""


class BenchmarkNotFoundError(BenchmarkError, LookupError):
    pass


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SubsetSpec(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    file: str = Field(min_length=1)

    @model_validator(mode="after")
    def _file_stays_inside(self) -> SubsetSpec:
        # The file is read relative to the benchmark folder: no escaping it.
        p = Path(self.file)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError(f"subset file {self.file!r} must be a relative path inside the benchmark folder")
        return self


class GenerationConfig(_Model):
    #: The benchmark's own token budget: an output that reaches it is counted in the scores' notes,
    #: never cut silently.
    max_gen_toks: int = Field(default=32, gt=0, le=65536)
    until: list[str] = Field(default_factory=lambda: ["\n"])


class BenchmarkItem(_Model):
    id: str = Field(min_length=1)
    question: str
    answer: str
    choices: list[str] | None = None
    #: Code items: the benchmark's tests (the executor alone runs them) and the function they call.
    test: str | None = None
    entry_point: str | None = None


class BenchmarkSpec(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    version: int = Field(default=1, ge=1)
    description: str = ""
    kind: BenchmarkKind
    primary_metric: str
    higher_is_better: bool = True
    subsets: list[SubsetSpec] = Field(min_length=1)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    scorer: ScorerName | None = Field(default=None, description="Default: exact (generate_until), loglik.")
    prompt: str = Field(default="{{question}}", min_length=1, description="lm-eval's doc_to_text (Jinja).")
    source: str = ""
    llm_cascade: bool = False
    code_style: CodeStyle | None = None
    #: The chat variant (lm-eval's ``_instruct`` task): the prompt a chat model is shown, and the
    #: start of its answer (lm-eval's ``gen_prefix``, Jinja over the item's fields). None: the plain prompt.
    chat_prompt: str | None = None
    chat_gen_prefix: str | None = None
    #: Math scorers: an answer counts only as an integer in [low, high] (AIME's 0-999).
    answer_range: tuple[int, int] | None = None
    #: Samples per item (repeated runs); a request's ``num_runs`` wins. Meaningful with sampling.
    num_runs: int = Field(default=1, ge=1, le=MAX_RUNS)
    #: At most this many items per subset in each of validation and test (and no more than the
    #: setting bench_max_items): a small benchmark keeps items between them for its confirmation pool.
    split_size: int | None = Field(default=None, gt=0)
    root: Path = Field(default=Path("."), exclude=True, description="The benchmark's folder (set by the loader).")

    @model_validator(mode="after")
    def _check(self) -> BenchmarkSpec:
        if self.scorer is None:
            object.__setattr__(self, "scorer", DEFAULT_SCORER[self.kind])
        if SCORER_KINDS[self.scorer_name] != self.kind:
            raise ValueError(f"scorer {self.scorer} needs kind {SCORER_KINDS[self.scorer_name]}, not {self.kind}")
        if self.primary_metric not in self.metrics:
            raise ValueError(
                f"primary_metric {self.primary_metric!r} is not computed by scorer {self.scorer}; "
                f"choose one of {', '.join(self.metrics)}"
            )
        if self.llm_cascade and self.scorer_name != "math":
            raise ValueError("llm_cascade applies to the math scorer only")
        if self.primary_metric == "math_cascade" and not self.llm_cascade:
            raise ValueError("primary_metric math_cascade needs llm_cascade: true")
        low_high = self.answer_range
        if low_high is not None and (self.scorer_name != "math" or low_high[0] > low_high[1]):
            raise ValueError("answer_range is [low, high] with low <= high, for the math scorer only")
        if self.scorer_name == "code" and self.code_style is None:
            raise ValueError("the code scorer needs code_style: humaneval or mbpp")
        names = [s.name for s in self.subsets]
        if len(set(names)) != len(names):
            raise ValueError(f"subset names repeat: {names}")
        return self

    def max_items(self, setting: int) -> int:
        """Items per subset and split: the setting ``bench_max_items``, or the benchmark's own
        ``split_size`` where that is smaller."""
        return setting if self.split_size is None else min(setting, self.split_size)

    @property
    def scorer_name(self) -> str:
        return self.scorer or DEFAULT_SCORER[self.kind]

    @property
    def metrics(self) -> tuple[str, ...]:
        metrics = SCORER_METRICS[self.scorer_name]
        if self.scorer_name == "math" and not self.llm_cascade:
            return metrics[:1]
        return metrics

    @property
    def scored_by_lm_eval(self) -> bool:
        return self.scorer_name in LM_EVAL_SCORERS

    def subset(self, name: str) -> SubsetSpec:
        for s in self.subsets:
            if s.name == name:
                return s
        raise BenchmarkError(f"benchmark {self.name} has no subset {name!r}")

    def items(self, subset: str) -> list[BenchmarkItem]:
        """The subset's items in file order (cached: the files are immutable for a version)."""
        return list(self._items[subset])

    @cached_property
    def _items(self) -> dict[str, tuple[BenchmarkItem, ...]]:
        return {s.name: tuple(_read_items(self, s)) for s in self.subsets}


def _read_items(spec: BenchmarkSpec, subset: SubsetSpec) -> list[BenchmarkItem]:
    path = spec.root / subset.file
    if not path.is_file():
        raise BenchmarkError(f"benchmark {spec.name}: subset {subset.name} file {path} is missing")
    items: list[BenchmarkItem] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"benchmark {spec.name}: {path.name} line {lineno}"
        try:
            item = BenchmarkItem.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise BenchmarkError(f"{where}: {exc}") from exc
        if item.id in seen:
            raise BenchmarkError(f"{where}: duplicate id {item.id!r}")
        if spec.kind == "multiple_choice" and (not item.choices or item.answer not in item.choices):
            raise BenchmarkError(f"{where}: multiple_choice items need choices that contain the answer")
        if spec.scorer_name == "code" and not item.test:
            raise BenchmarkError(f"{where}: code items need the benchmark's tests (\"test\")")
        if spec.code_style == "humaneval" and not item.entry_point:
            raise BenchmarkError(f"{where}: humaneval-style items need the function the tests call (\"entry_point\")")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise BenchmarkError(f"benchmark {spec.name}: subset {subset.name} ({path}) has no items")
    return items


def available_benchmarks(assets_dir: Path) -> list[str]:
    root = Path(assets_dir) / "benchmarks"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / DESCRIPTOR).is_file())


def load_benchmark(assets_dir: Path, name: str) -> BenchmarkSpec:
    """Read and validate ``<assets>/benchmarks/<name>/benchmark.yaml`` and its subset files."""
    if not re.match(NAME_PATTERN, name):
        raise BenchmarkError(f"invalid benchmark name {name!r}")
    folder = Path(assets_dir) / "benchmarks" / name
    descriptor = folder / DESCRIPTOR
    if not descriptor.is_file():
        known = ", ".join(available_benchmarks(assets_dir)) or "none (run `ftbus assets init`)"
        raise BenchmarkNotFoundError(
            f"unknown benchmark {name!r} (no {descriptor}); available benchmarks: {known}"
        )
    try:
        raw = yaml.safe_load(descriptor.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise BenchmarkError(f"benchmark {name}: {descriptor} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise BenchmarkError(f"benchmark {name}: {descriptor} must be a mapping")
    try:
        spec = BenchmarkSpec.model_validate({**raw, "root": folder.resolve()})
    except ValidationError as exc:
        raise BenchmarkError(f"benchmark {name}: invalid {descriptor}:\n{exc}") from exc
    if spec.name != name:
        raise BenchmarkError(f"benchmark folder {name!r} holds a descriptor named {spec.name!r}")
    for subset in spec.subsets:
        spec.items(subset.name)  # validate every item now, not halfway through a run
    return spec
