"""The ``reference`` protocol: each catalogue benchmark as the pinned lm-eval (0.4.13) runs it.

``validation`` is what the pipeline scores (the agent-visible split, zero-shot, the model's own
sampling: docs/benchmarks.md). ``reference`` is the field's canonical setup, so that its numbers stand
beside published ones:

- the prompts are lm-eval's own: ftbus writes a task that ``include:``s lm-eval's task YAML (from the
  toolchain's lm-eval) with only its data pointed at the benchmark's imported items, written back in
  the hub source's schema (``dataset_path: json``, ``data_files``). lm-eval then renders the prompts,
  draws the few-shot examples (its split, sampler and seed: the CLI's defaults), and applies its
  generation settings (greedy, ``max_gen_toks``, stops). The code tasks' YAMLs import a module that
  loads HF ``evaluate``'s ``code_eval`` from the network at import time, so for them ftbus copies the
  YAML's prompt fields verbatim instead, and lm-eval never executes the model's code;
- a base model gets the plain task; a chat model (``--chat``, or ``chat_template: true`` in its
  ``ftbus_inference.yaml``) the ``_instruct`` variant where lm-eval has one, and the chat template with
  multi-turn few-shot (``--apply_chat_template --fewshot_as_multiturn``) everywhere;
- the full test split; the subsets aggregated as lm-eval aggregates them (weighted by size for
  MMLU and minerva_math, its groups' ``weight_by_size``);
- the per-item metric is lm-eval's task metric, computed by ftbus from the generated text
  (:func:`score_item`): gsm8k's strict-match and flexible-extract, minerva_math's ``math_verify``,
  AIME's ``exact_match``, MMLU's log-likelihood ``acc``, and pass@1 of the program lm-eval builds,
  run in the code executor (evaluation/executor.py), never here.

tests/e2e/test_reference_protocol.py runs lm-eval's own CLI beside this on the tiny model and the same
files, and checks every prompt and every per-item metric against lm-eval's logged samples.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from evaluation.catalogue import CATALOGUE, MMLU_LETTERS, mmlu_answer_index
from evaluation.code_programs import CodeProgram, model_functions, prompt_prelude
from evaluation.registry import BenchmarkItem, BenchmarkSpec
from shared.statistics import mean_stderr

Protocol = Literal["reference", "validation"]
PROTOCOLS: tuple[Protocol, ...] = ("reference", "validation")
TASK_PREFIX = "ftbus_ref"


class ReferenceError(ValueError):
    """The reference protocol cannot run for this benchmark as imported; the message says what to do."""


# ------------------------------------------------------------------ items back in the sources' schemas


def _gsm8k_row(item: BenchmarkItem) -> dict[str, Any]:
    return {"question": item.question, "answer": item.answer}


def _math_row(item: BenchmarkItem) -> dict[str, Any]:
    return {"problem": item.question, "solution": item.answer}


def _aime24_row(item: BenchmarkItem) -> dict[str, Any]:
    # Maxwell-Jia/AIME_2024, lm-eval's aime24 source: Answer is an integer there.
    return {"ID": item.id, "Problem": item.question, "Answer": int(item.answer)}


def _aime25_row(item: BenchmarkItem) -> dict[str, Any]:
    return {"id": item.id, "problem": item.question, "answer": item.answer}


def mmlu_row(item: BenchmarkItem, subject: str) -> dict[str, Any]:
    """cais/mmlu's row back from an item: the question is the prompt body less its choices."""
    choices = list(item.choices or [])
    tail = "".join(f"\n{letter}. {text}" for letter, text in zip(MMLU_LETTERS, choices, strict=True)) + "\nAnswer:"
    if not item.question.endswith(tail):
        raise ReferenceError(f"item {item.id} is not in MMLU's prompt form (its question does not end in its choices)")
    return {"question": item.question[: -len(tail)], "subject": subject, "choices": choices,
            "answer": choices.index(item.answer)}


def _humaneval_row(item: BenchmarkItem) -> dict[str, Any]:
    return {"task_id": item.id, "prompt": item.question, "canonical_solution": item.answer, "test": item.test,
            "entry_point": item.entry_point}


_MBPP_QUESTION = re.compile(r"\AYou are an expert Python programmer, and here is your task: (?P<text>.*) "
                            r"Your code should pass these tests:\n\n(?P<tests>.*)\n\Z", re.DOTALL)


def mbpp_row(item: BenchmarkItem) -> dict[str, Any]:
    """google-research-datasets/mbpp's row back from an item (its question holds the text and tests)."""
    found = _MBPP_QUESTION.match(item.question)
    if found is None:
        raise ReferenceError(f"item {item.id} is not in MBPP's prompt form")
    tests = found.group("tests").split("\n")
    setup = (item.test or "")[: -len("\n".join(tests))].rstrip("\n") if (item.test or "").endswith(
        "\n".join(tests)) else ""
    task_id = item.id.removeprefix("mbpp-")
    return {"task_id": int(task_id) if task_id.isdigit() else task_id, "text": found.group("text"),
            "code": item.answer, "test_list": tests, "test_setup_code": setup, "challenge_test_list": []}


# ------------------------------------------------------------------ the tasks


@dataclass(frozen=True)
class ReferenceTask:
    """One catalogue benchmark as lm-eval runs it."""

    benchmark: str
    #: subset -> lm-eval's task YAML, relative to lm_eval/tasks; the chat (``_instruct``) variant.
    yaml: Callable[[str], str]
    chat_yaml: Callable[[str], str] | None
    #: The split names lm-eval's task reads (its ``test_split``, ``fewshot_split``).
    test_split: str
    fewshot_split: str | None
    #: The decision metric and every metric reported.
    metric: str
    metrics: tuple[str, ...]
    #: lm-eval's per-item metric for each of ours: (its metric key, its filter) in the samples file.
    lm_eval_metrics: Mapping[str, tuple[str, str]]
    #: Subsets aggregated weighted by size (lm-eval's group ``weight_by_size``).
    weighted: bool
    row: Callable[[BenchmarkItem, str], dict[str, Any]]
    #: What lm-eval's task says besides its YAML, as commonly reported (MMLU: 5-shot).
    overrides: Mapping[str, Any] = field(default_factory=dict)
    code: bool = False
    #: What lm-eval matches, and what differs (docs/benchmarks.md's table).
    matches: str = ""

    def task_yaml(self, subset: str, chat: bool) -> str:
        return self.chat_yaml(subset) if chat and self.chat_yaml is not None else self.yaml(subset)

    def variant(self, chat: bool) -> str:
        return "instruct" if chat and self.chat_yaml is not None else "plain"


#: ftbus's MATH subsets -> minerva_math's task names.
MINERVA_TASKS = {"algebra": "algebra", "counting_and_probability": "counting_and_prob", "geometry": "geometry",
                 "intermediate_algebra": "intermediate_algebra", "number_theory": "num_theory",
                 "prealgebra": "prealgebra", "precalculus": "precalc"}


def _minerva_yaml(subset: str) -> str:
    if subset not in MINERVA_TASKS:
        raise ReferenceError(f"MATH subset {subset!r} is none of minerva_math's types ({', '.join(MINERVA_TASKS)}): "
                             "import the hub's files with their type column")
    return f"minerva_math/minerva_math_{MINERVA_TASKS[subset]}.yaml"


def _fixed(path: str) -> Callable[[str], str]:
    return lambda _subset: path


GSM8K_METRICS = {"strict_match": ("exact_match", "strict-match"), "flexible_match": ("exact_match", "flexible-extract")}
REFERENCE: dict[str, ReferenceTask] = {t.benchmark: t for t in (
    ReferenceTask("gsm8k", _fixed("gsm8k/gsm8k.yaml"), None, "test", "train", "strict_match",
                  ("strict_match", "flexible_match"), GSM8K_METRICS, False, lambda i, _s: _gsm8k_row(i),
                  matches="lm-eval gsm8k: 5-shot drawn from train (seed 1234), strict-match decides"),
    ReferenceTask("math", _minerva_yaml, None, "test", None, "math_verify", ("math_verify",),
                  {"math_verify": ("math_verify", "none")}, True, lambda i, _s: _math_row(i),
                  matches="lm-eval minerva_math: 4-shot (minerva's fixed examples), math_verify, weighted by size"),
    ReferenceTask("aime24", _fixed("aime/aime24.yaml"), None, "train", None, "exact_match", ("exact_match",),
                  {"exact_match": ("exact_match", "none")}, False, lambda i, _s: _aime24_row(i),
                  matches="lm-eval aime24 (Maxwell-Jia/AIME_2024): zero-shot, exact_match"),
    ReferenceTask("aime25", _fixed("aime/aime25.yaml"), None, "test", None, "exact_match", ("exact_match",),
                  {"exact_match": ("exact_match", "none")}, False, lambda i, _s: _aime25_row(i),
                  matches="lm-eval aime25 (math-ai/aime25): zero-shot, exact_match"),
    ReferenceTask("mmlu", lambda s: f"mmlu/default/mmlu_{s}.yaml", None, "test", "dev", "acc", ("acc",),
                  {"acc": ("acc", "none")}, True, lambda i, s: mmlu_row(i, s), overrides={"num_fewshot": 5},
                  matches="lm-eval mmlu: 5-shot from dev (first 5), log-likelihood acc, weighted by size"),
    ReferenceTask("humaneval", _fixed("humaneval/humaneval.yaml"), _fixed("humaneval/humaneval_instruct.yaml"),
                  "test", None, "pass@1", ("pass@1",), {"pass@1": ("pass@1", "create_test")}, False,
                  lambda i, _s: _humaneval_row(i), code=True,
                  matches="lm-eval humaneval / humaneval_instruct: zero-shot, greedy, pass@1"),
    ReferenceTask("mbpp", _fixed("mbpp/mbpp.yaml"), _fixed("mbpp/mbpp_instruct.yaml"), "test", None, "pass@1",
                  ("pass@1",), {"pass@1": ("pass_at_1", "none")}, False, lambda i, _s: mbpp_row(i), code=True,
                  matches="lm-eval mbpp / mbpp_instruct: 3-shot (its fixed examples), pass@1 of test_list"),
)}


def reference_task(benchmark: str) -> ReferenceTask:
    try:
        return REFERENCE[benchmark]
    except KeyError:
        raise ReferenceError(f"benchmark {benchmark!r} has no reference protocol (lm-eval has no task for it): "
                             f"the catalogue's {', '.join(REFERENCE)} have one; use --protocol validation") from None


def lm_eval_task_name(benchmark: str, subset: str, variant: str) -> str:
    tail = "" if variant == "plain" else f"_{variant}"
    return re.sub(r"\W+", "_", f"{TASK_PREFIX}_{benchmark}{tail}_{subset}").lower()


# ------------------------------------------------------------------ lm-eval's task folder


@cache
def lm_eval_tasks_dir(python: Path) -> Path:
    """lm_eval/tasks of the toolchain whose interpreter is ``python`` (found without importing lm-eval)."""
    probe = "import importlib.util as u; print(u.find_spec('lm_eval').submodule_search_locations[0])"
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReferenceError(f"the toolchain's lm-eval cannot be found with {python} ({exc}): run `make toolchain`"
                             ) from exc
    tasks = Path(done.stdout.strip()) / "tasks"
    if not tasks.is_dir():
        raise ReferenceError(f"{tasks} is not lm-eval's task folder: run `make toolchain`")
    return tasks


class _TaskLoader(yaml.SafeLoader):
    """Reads lm-eval's task YAMLs: ``!function module.name`` is kept as its text."""


_TaskLoader.add_constructor("!function", lambda loader, node: {"!function": loader.construct_scalar(node)})

#: The fields of a code task's YAML that make its prompts and generations (copied verbatim).
CODE_PROMPT_FIELDS = ("output_type", "test_split", "doc_to_text", "doc_to_target", "gen_prefix", "target_delimiter",
                      "generation_kwargs", "num_fewshot", "repeats", "description")


def _fewshot_samples(utils: Path) -> list[dict[str, Any]]:
    """The literal list a task's ``utils.list_fewshot_samples()`` returns (read, never imported)."""
    tree = ast.parse(utils.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "list_fewshot_samples":
            for stmt in node.body:
                if isinstance(stmt, ast.Return) and stmt.value is not None:
                    return list(ast.literal_eval(stmt.value))
    raise ReferenceError(f"{utils} has no literal list_fewshot_samples()")


def code_task_config(tasks_dir: Path, rel: str) -> dict[str, Any]:
    """A code task's prompt fields, verbatim from lm-eval's YAML (its included YAML's first)."""
    path = tasks_dir / rel
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskLoader)  # a SafeLoader
    base: dict[str, Any] = {}
    if "include" in raw:
        base = code_task_config(tasks_dir, str(Path(rel).parent / raw["include"]))
    config = {**base, **{k: raw[k] for k in CODE_PROMPT_FIELDS if k in raw}}
    fewshot = raw.get("fewshot_config")
    if fewshot is not None:
        samples = fewshot.get("samples")
        if isinstance(samples, dict) and "!function" in samples:
            samples = _fewshot_samples(path.parent / "utils.py")
        config["fewshot_config"] = {**fewshot, "samples": samples}
    return config


# ------------------------------------------------------------------ one run's files


@dataclass
class ReferenceRunFiles:
    tasks: dict[str, str]  # subset -> lm-eval task name
    include_path: Path
    chat: bool
    variant: str
    #: subset -> the items in the order lm-eval reads them (doc_id i is items[i]).
    items: dict[str, list[BenchmarkItem]]


def _fewshot_items(spec: BenchmarkSpec, subset: str) -> list[BenchmarkItem]:
    from evaluation.importer import FEWSHOT_DIR

    path = spec.root / FEWSHOT_DIR / f"{subset}.jsonl"
    if not path.is_file():
        entry = CATALOGUE[spec.name]
        raise ReferenceError(
            f"{spec.name} has no few-shot pool for {subset} ({path}): the reference protocol draws lm-eval's "
            f"few-shot examples from {entry.hub_id}'s {entry.fewshot_split} split; import it "
            f"(`ftbus benchmarks import {spec.name} --from FOLDER` with both splits, or --fewshot-from FILE)")
    return [BenchmarkItem.model_validate_json(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def _jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path.resolve()


def write_reference_run(spec: BenchmarkSpec, run_dir: Path, tasks_dir: Path, *, chat: bool = False,
                        limit: int | None = None) -> ReferenceRunFiles:
    """The data (in the sources' schemas) and lm-eval tasks of ``spec``'s reference run under ``run_dir``.
    ``limit``: only the first items of each subset (a quick look; the numbers are then not lm-eval's)."""
    ref = reference_task(spec.name)
    variant = ref.variant(chat)
    include = Path(run_dir) / "tasks"
    include.mkdir(parents=True, exist_ok=True)
    tasks: dict[str, str] = {}
    items: dict[str, list[BenchmarkItem]] = {}
    for subset in spec.subsets:
        chosen = spec.items(subset.name)[:limit]
        data = Path(run_dir) / "data" / subset.name
        files = {ref.test_split: str(_jsonl(data / f"{ref.test_split}.jsonl",
                                            [ref.row(i, subset.name) for i in chosen]))}
        if ref.fewshot_split is not None:
            pool = [ref.row(i, subset.name) for i in _fewshot_items(spec, subset.name)]
            files[ref.fewshot_split] = str(_jsonl(data / f"{ref.fewshot_split}.jsonl", pool))
        name = lm_eval_task_name(spec.name, subset.name, variant)
        rel = ref.task_yaml(subset.name, chat)
        config: dict[str, Any]
        if ref.code:
            config = {"task": name, **code_task_config(tasks_dir, rel),
                      "metric_list": [{"metric": "bypass", "aggregation": "bypass", "higher_is_better": True}]}
        else:
            config = {"include": str(tasks_dir / rel), "task": name}
        config |= {"dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": files},
                   **ref.overrides,
                   "metadata": {"ftbus_benchmark": spec.name, "ftbus_subset": subset.name,
                                "ftbus_version": spec.version, "ftbus_protocol": "reference",
                                "ftbus_variant": variant, "lm_eval_task": rel}}
        (include / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
                                              encoding="utf-8")
        tasks[subset.name] = name
        items[subset.name] = chosen
    return ReferenceRunFiles(tasks=tasks, include_path=include.resolve(), chat=chat, variant=variant, items=items)


def reference_command(*, lm_eval: Path, pretrained: Path, peft: Path | None, files: ReferenceRunFiles,
                      output_path: Path, code: bool, device: str = "cpu", max_length: int | None = None) -> list[str]:
    """``lm_eval run`` as its CLI runs these tasks: its default seeds (0, 1234, 1234, 1234), batch 1.
    ``max_length``: lm-eval's model argument (a model whose context is no longer than a task's budget,
    such as the tiny test model's 1024 against HumanEval's 1024, is refused by lm-eval without it)."""
    model_args = f"pretrained={Path(pretrained).resolve()}" + (f",peft={Path(peft).resolve()}" if peft else "")
    if max_length is not None:
        model_args += f",max_length={max_length}"
    argv = [str(lm_eval), "run", "--model", "hf", "--model_args", model_args, "--tasks", ",".join(files.tasks.values()),
            "--include_path", str(files.include_path), "--output_path", str(Path(output_path).resolve()),
            "--log_samples", "--batch_size", "1", "--device", device]
    if files.chat:
        argv += ["--apply_chat_template", "--fewshot_as_multiturn"]
    if code:
        argv.append("--predict_only")  # lm-eval must not run the model's code: the code executor does
    return argv


# ------------------------------------------------------------------ lm-eval's metrics, computed by ftbus


def aime_exact_match(response: str, gold: str) -> float:
    """lm-eval's aime ``process_results``: the text between the first and last ``$`` (else all of it),
    or the last box's content, compared with the gold after hendrycks_math's ``strip_string``."""
    dollars = [i for i, ch in enumerate(response) if ch == "$"]
    answer = response if len(dollars) <= 1 else response[dollars[0] + 1:dollars[-1]]
    boxed = _aime_boxed(response)
    if boxed is not None:
        answer = boxed
    return float(_is_equiv(answer, str(gold)))


def _aime_boxed(response: str) -> str | None:
    """lm-eval aime's last_boxed_only_string then remove_boxed (an \\fbox{} fails its assert: None)."""
    if "\\boxed " in response:
        return response.split("\\boxed ")[-1].split("$")[0]
    start = response.rfind("\\boxed")
    fbox = start < 0
    if fbox:
        start = response.rfind("\\fbox")
        if start < 0:
            return None
    depth, end = 0, None
    for i in range(start, len(response)):
        if response[i] == "{":
            depth += 1
        elif response[i] == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end is None:
        return None
    box = response[start:end + 1]
    if not box.startswith("\\boxed{"):
        return None  # remove_boxed asserts "\boxed{": lm-eval keeps the $-answer
    return box[len("\\boxed{"):-1]


def _is_equiv(str1: str, str2: str) -> bool:
    try:
        return _strip_string(str1) == _strip_string(str2)
    except Exception:  # lm-eval's is_equiv: on any failure, plain equality
        return str1 == str2


def _fix_fracs(string: str) -> str:
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if substr[0] == "{":  # an empty part raises, as lm-eval's does (is_equiv then compares raw)
            new_str += substr
            continue
        if len(substr) < 2:
            return string
        a, b = substr[0], substr[1]
        if b != "{":
            new_str += "{" + a + "}{" + b + "}" + substr[2:]
        else:
            new_str += "{" + a + "}" + b + substr[2:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise  # lm-eval lets this one escape: is_equiv then compares the raw strings
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(string: str) -> str:
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        if len(splits) != 2:
            raise AssertionError(splits)
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        new_string += ("\\sqrt{" + split[0] + "}" + split[1:]) if split[0] != "{" else "\\sqrt" + split
    return new_string


def _strip_string(string: str) -> str:
    """hendrycks_math's strip_string, as lm-eval's aime/utils.py has it."""
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "").replace("\\%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def minerva_math_verify(response: str, solution: str) -> float:
    """lm-eval minerva_math's ``math_verify``: math-verify's parse of the whole solution and of the
    whole response (its default extraction), then verify (timeouts off: see scorers.py)."""
    from math_verify import parse, verify

    gold = parse(solution, parsing_timeout=None)
    target = parse(response, parsing_timeout=None)
    return float(bool(verify(gold=gold, target=target, timeout_seconds=None)))


def mmlu_acc(loglikelihoods: Sequence[float], gold: int) -> float:
    """lm-eval's multiple-choice ``acc``: the most likely choice (the first of ties) is the gold."""
    best = max(range(len(loglikelihoods)), key=lambda i: (loglikelihoods[i], -i))
    return float(best == gold)


_CODE_BLOCK = re.compile(r"```(?:\w+)?\n?(.*?)\n?```", re.DOTALL)


def mbpp_instruct_code(text: str) -> str:
    """lm-eval mbpp_instruct's extract_code_blocks: the first fenced block ("```" prepended, as its
    gen_prefix opened one), else ""."""
    matches = _CODE_BLOCK.findall("```" + text)
    if not matches:
        matches = _CODE_BLOCK.findall(re.sub(r"```python", "```", text))
    return matches[0] if matches else ""


def reference_program(benchmark: str, variant: str, item: BenchmarkItem, response: str) -> CodeProgram:
    """The program lm-eval's code task builds from ``response`` (its filter, then ``doc_to_target``):
    ``solution + "\\n" + tests`` is, byte for byte, what its code_eval would run."""
    if benchmark == "humaneval":
        entry = item.entry_point or ""
        if variant == "instruct":  # build_predictions_instruct
            fence = response.find("```")
            completion = response if fence == -1 else response[:fence]
        else:  # build_predictions
            completion = response
        prelude = prompt_prelude(item.question, entry)
        tests = f"{item.test}\ncheck({entry})"
        return CodeProgram(solution=item.question + completion, tests=tests, prelude=prelude,
                           functions=model_functions(prelude + "\n" + tests, entry))
    if benchmark == "mbpp":
        tests = "\n".join(mbpp_row(item)["test_list"][:3])
        solution = mbpp_instruct_code(response) if variant == "instruct" else response
        return CodeProgram(solution=solution, tests=tests, functions=model_functions(tests))
    raise ReferenceError(f"{benchmark} is not a code benchmark")


def extracted(benchmark: str, response: str) -> str | None:
    """What the reference metric took as the answer, for --json."""
    from evaluation.scorers import gsm8k_flexible, gsm8k_strict

    if benchmark == "gsm8k":
        return gsm8k_strict(response) or gsm8k_flexible(response)
    if benchmark == "math":
        from math_verify import parse

        parsed = parse(response, parsing_timeout=None)
        return str(parsed[-1]) if parsed else None
    if benchmark in ("aime24", "aime25"):
        dollars = [i for i, ch in enumerate(response) if ch == "$"]
        answer = response if len(dollars) <= 1 else response[dollars[0] + 1:dollars[-1]]
        boxed = _aime_boxed(response)
        return _strip_string_safe(boxed if boxed is not None else answer)
    return None


def _strip_string_safe(text: str) -> str:
    try:
        return _strip_string(text)
    except Exception:
        return text


def score_item(benchmark: str, item: BenchmarkItem, response: str) -> dict[str, float]:
    """lm-eval's per-item metrics of a text task, computed from ``response`` (code: the executor's)."""
    from evaluation.scorers import score_gsm8k

    if benchmark == "gsm8k":
        return score_gsm8k(response, item.answer)
    if benchmark == "math":
        return {"math_verify": minerva_math_verify(response, item.answer)}
    if benchmark in ("aime24", "aime25"):
        return {"exact_match": aime_exact_match(response, item.answer)}
    raise ReferenceError(f"{benchmark}: scored from log-likelihoods or by running code, not from text")


# ------------------------------------------------------------------ lm-eval's samples files


@dataclass
class ItemResult:
    subset: str
    id: str
    prompt: str
    response: str
    extracted: str | None
    metrics: dict[str, float]
    #: lm-eval's own per-item metrics where its samples file has them (read for comparison only).
    lm_eval: dict[str, float] = field(default_factory=dict)


@dataclass
class ReferenceResult:
    benchmark: str
    protocol: Protocol
    metric: str
    variant: str
    #: subset -> metric -> value; ``overall`` as lm-eval aggregates (weighted by size or not).
    scores: dict[str, dict[str, float]]
    items: list[ItemResult]
    stderr: float
    weighted: bool
    model: str = ""
    lm_eval_tasks: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def value(self) -> float:
        return self.scores["overall"][self.metric]

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "items"}, "value": self.value,
                "items": [asdict(i) for i in self.items]}


def read_samples_file(path: Path) -> list[dict[str, Any]]:
    """lm-eval's ``samples_<task>_<time>.jsonl``: one row per item and filter, sorted by doc_id."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(rows, key=lambda r: int(r.get("doc_id", 0)))


def sample_prompt(row: Mapping[str, Any]) -> str:
    args = row.get("arguments")
    first = next(iter(args.values())) if isinstance(args, dict) and args else (args[0] if args else None)
    if isinstance(first, dict):
        first = first.get("arg_0")
    elif isinstance(first, list | tuple):
        first = first[0]
    return "" if first is None else str(first)


def sample_response(row: Mapping[str, Any]) -> str:
    resps = row.get("resps") or [[""]]
    first = resps[0]
    while isinstance(first, list):
        first = first[0] if first else ""
    return str(first)


def sample_loglikelihoods(row: Mapping[str, Any]) -> list[float]:
    return [float(r[0][0] if isinstance(r[0], list) else r[0]) for r in row.get("resps") or []]


def item_from_doc(benchmark: str, doc: Mapping[str, Any], index: int) -> tuple[str, BenchmarkItem]:
    """A logged doc (the source's row, after lm-eval's process_docs) as ftbus's item, and its subset."""
    from evaluation.importer import _aliased

    entry = CATALOGUE[benchmark]
    row = _aliased(entry, dict(doc))
    return entry.subset_of(row) if benchmark != "math" else "math", entry.make_item(row, index, index)


def lm_eval_item_metrics(ref: ReferenceTask, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for ours, (key, flt) in ref.lm_eval_metrics.items():
        for row in rows:
            if row.get("filter", "none") == flt and key in row:
                value = row[key]
                out[ours] = float(value if not isinstance(value, dict) else value.get("pass@1", 0.0))
    return out


def aggregate(ref: ReferenceTask, items: Sequence[ItemResult]) -> tuple[dict[str, dict[str, float]], float]:
    """Per subset the mean of each metric; overall as lm-eval: over every item (weighted by size) or,
    for one subset, that subset's; and the decision metric's standard error over items."""
    by_subset: dict[str, list[ItemResult]] = {}
    for result in items:
        by_subset.setdefault(result.subset, []).append(result)
    scores = {s: {m: sum(r.metrics.get(m, 0.0) for r in rows) / len(rows) for m in ref.metrics}
              for s, rows in by_subset.items()}
    if ref.weighted or len(by_subset) == 1:
        scores["overall"] = {m: sum(r.metrics.get(m, 0.0) for r in items) / len(items) for m in ref.metrics}
    else:
        scores["overall"] = {m: sum(v[m] for v in scores.values()) / len(scores) for m in ref.metrics}
    _, stderr = mean_stderr([r.metrics.get(ref.metric, 0.0) for r in items])
    return scores, stderr


# ------------------------------------------------------------------ scoring a run, or any samples files


ExecuteCode = Callable[[list[tuple[str, CodeProgram]]], Any]  # async: [(key, program)] -> {key: passed}


async def score_samples_files(benchmark: str, files: Mapping[str, Path], *, variant: str | None = None,
                              items: Mapping[str, Sequence[BenchmarkItem]] | None = None,
                              execute: ExecuteCode | None = None) -> ReferenceResult:
    """ftbus's reference metrics of lm-eval samples files (subset -> ``samples_<task>_*.jsonl``).

    ``items``: the benchmark's items in doc order (a run of ftbus's); None: each logged doc is made an
    item, as the importer makes one from the source's row (any lm-eval run of the task). ``variant``:
    ``instruct`` or ``plain``; None: told by the task's name. Code runs through ``execute``."""
    ref = reference_task(benchmark)
    results: list[ItemResult] = []
    programs: list[tuple[str, CodeProgram]] = []
    for subset_hint, path in files.items():
        rows = read_samples_file(path)
        by_doc: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            by_doc.setdefault(int(row.get("doc_id", 0)), []).append(row)
        kind = variant or ("instruct" if "instruct" in Path(path).name else "plain")
        for doc_id, doc_rows in sorted(by_doc.items()):
            row = doc_rows[0]
            if items is not None:
                subset, item = subset_hint, items[subset_hint][doc_id]
            else:
                try:
                    subset, item = item_from_doc(benchmark, row.get("doc") or {}, doc_id)
                except (KeyError, ValueError, TypeError) as exc:
                    raise ReferenceError(f"{path}: doc {doc_id} is not a {benchmark} row ({exc})") from exc
                subset = subset_hint if benchmark == "math" else subset
            response = sample_response(row)
            result = ItemResult(subset=subset, id=item.id, prompt=sample_prompt(row), response=response,
                                extracted=None, metrics={}, lm_eval=lm_eval_item_metrics(ref, doc_rows))
            if benchmark == "mmlu":
                lls = sample_loglikelihoods(row)
                gold = mmlu_answer_index((row.get("doc") or {}).get("answer", item.choices.index(item.answer)
                                                                    if item.choices else 0))
                result.metrics = {"acc": mmlu_acc(lls, gold)}
                result.extracted = MMLU_LETTERS[max(range(len(lls)), key=lambda i: (lls[i], -i))] if lls else None
            elif ref.code:
                program = reference_program(benchmark, kind, item, response)
                result.extracted = program.solution
                programs.append((f"{len(results)}", program))
            else:
                result.metrics = score_item(benchmark, item, response)
                result.extracted = extracted(benchmark, response)
            results.append(result)
    notes: list[str] = []
    if programs:
        if execute is None:
            raise ReferenceError(f"{benchmark} is scored by running code: the code executor is needed")
        passed = await execute(programs)
        for key, _ in programs:
            results[int(key)].metrics = {"pass@1": 1.0 if passed[key] else 0.0}
    if not results:
        raise ReferenceError("the samples files hold no items")
    scores, stderr = aggregate(ref, results)
    return ReferenceResult(benchmark=benchmark, protocol="reference", metric=ref.metric,
                           variant=variant or ("instruct" if any("instruct" in Path(p).name for p in files.values())
                                               else "plain"),
                           scores=scores, items=results, stderr=stderr, weighted=ref.weighted, notes=notes)


def samples_files(output_dir: Path, tasks: Mapping[str, str]) -> dict[str, Path]:
    """subset -> the samples file lm-eval left for its task under ``output_dir`` (the newest)."""
    found: dict[str, Path] = {}
    for subset, task in tasks.items():
        candidates = sorted(Path(output_dir).rglob(f"samples_{task}_*.jsonl"))
        if not candidates:
            raise ReferenceError(f"lm-eval left no samples of task {task} under {output_dir}")
        found[subset] = candidates[-1]
    return found


@dataclass
class ReferenceRun:
    """One ``lm_eval`` process generating the reference tasks of one or more benchmarks."""

    files: dict[str, ReferenceRunFiles]  # benchmark -> its tasks and items
    output_dir: Path
    argv: list[str]
    returncode: int
    log: Path
    seconds: float

    def samples(self, benchmark: str) -> dict[str, Path]:
        return samples_files(self.output_dir, self.files[benchmark].tasks)


def run_reference(specs: Sequence[BenchmarkSpec], run_dir: Path, *, toolchain_bin: Path, pretrained: Path,
                  peft: Path | None = None, chat: bool = False, limit: int | None = None,
                  max_gen_toks: int | None = None, device: str = "cpu", timeout_s: float = 3600,
                  max_length: int | None = None) -> ReferenceRun:
    """Generate ``specs``' reference tasks with the toolchain's ``lm_eval`` in one process (one model
    load), offline, its datasets cache inside ``run_dir``. ``limit`` and ``max_gen_toks`` are for a quick
    look (tests): with either, the numbers are not lm-eval's, and the caller must say so."""
    import os
    import time

    from shared.offline import OFFLINE_ENV

    run_dir = Path(run_dir)
    tasks_dir = lm_eval_tasks_dir(Path(toolchain_bin) / "python")
    files = {spec.name: write_reference_run(spec, run_dir / spec.name, tasks_dir, chat=chat, limit=limit)
             for spec in specs}
    include = run_dir / "include"
    include.mkdir(parents=True, exist_ok=True)
    for run in files.values():
        for path in run.include_path.glob("*.yaml"):
            (include / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    merged = ReferenceRunFiles(tasks={f"{b}/{s}": t for b, r in files.items() for s, t in r.tasks.items()},
                               include_path=include.resolve(), chat=chat, variant="", items={})
    output = run_dir / "output"
    argv = reference_command(lm_eval=Path(toolchain_bin) / "lm_eval", pretrained=pretrained, peft=peft, files=merged,
                             output_path=output, code=True, device=device, max_length=max_length)
    if max_gen_toks is not None:
        argv += ["--gen_kwargs", f"max_gen_toks={max_gen_toks}"]
    env = {**os.environ, **OFFLINE_ENV, "HF_DATASETS_CACHE": str(run_dir.resolve() / "hf_datasets_cache")}
    log = run_dir / "lm_eval.log"
    started = time.monotonic()
    with log.open("wb") as out:
        try:
            done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    return ReferenceRun(files=files, output_dir=output, argv=argv, returncode=code, log=log,
                        seconds=time.monotonic() - started)
