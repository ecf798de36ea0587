"""Scores one split from what lm-eval generated, with the scorer the benchmark names.

lm-eval computes ``exact`` and ``loglik`` itself (lmeval.parse_lm_eval_output). For the others,
the engine only generates, and this module scores the raw text in the bench worker:

- ``gsm8k``, ``math``, ``numeric``, ``f1``, ``rouge_l``, and the letter of ``choice``: pure
  functions (evaluation/scorers.py), after ``<think>`` blocks are stripped;
- ``math`` with ``llm_cascade`` (aime25): the rule first, then the LLM answer check for the items
  the rule marks wrong; an item counts when either says correct (``math_cascade``);
- ``llm``: the LLM answer check for every item;
- an LLM answer check is shown the scorer's extracted final answer (``extracted_answer``), never the
  model's output, and only when that answer looks like one (evaluation/answer_check.py);
- ``code``: each program (the item's prompt, the model's code, the benchmark's tests) runs in a
  container of its own (evaluation/executor.py): the engine never executes model code,
  and the tests never reach the engine.

Outputs that reached the token budget are counted in the scores' notes: a cut is never silent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluation.answer_check import AnswerCase, cascade, check_answers, rule_misses
from evaluation.inference import InferenceConfig
from evaluation.lmeval import Generated, LmEvalOutput, LmEvalOutputError, read_lm_eval_output
from evaluation.registry import BenchmarkItem, BenchmarkSpec
from evaluation.runs import VOTING_SCORERS
from evaluation.scorers import extracted_answer, score_text, strip_think
from evaluation.scoring import assemble_scores
from evaluation.splits import SplitManifest, split_items
from shared.events import AnswerCheckUsage, BenchmarkScores, ErrorSample
from shared.logs import get_logger

if TYPE_CHECKING:
    from evaluation.executor import CodeExecutor

log = get_logger("ftbus.benchmark.grading")

class GradingUnavailable(RuntimeError):
    """What scoring needs cannot run here (the code executor: no engine, no image); the message says
    what to do."""


TEXT_SCORERS = frozenset({"gsm8k", "math", "numeric", "f1", "rouge_l", "choice"})


@dataclass
class Graded:
    """Per subset: each item's metric values (0-1), in split order."""

    values: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    answer_check: AnswerCheckUsage | None = None
    #: What each item's output was scored as, where it differs from the output (extracted code).
    shown: dict[str, str] = field(default_factory=dict)


async def grade_split(
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    output_dir: Path,
    *,
    settings: Any,
    inference: InferenceConfig | None,
    tokenizer_dir: Path | None,
    executor: CodeExecutor | None = None,
) -> BenchmarkScores:
    """``BenchmarkScores`` of one lm-eval run of a benchmark that ftbus scores."""
    output = await asyncio.to_thread(read_lm_eval_output, output_dir, spec, manifest)
    items = {item.id: item for subset in split_items(spec, manifest).values() for item in subset}
    runs = _num_runs(output)
    # Every run of every item is scored as one more row: item by item, its runs in order.
    pairs = {subset: [(items[g.item_id], Generated(g.item_id, text)) for g in rows for text in g.outputs]
             for subset, rows in output.generated.items()}

    graded = Graded()
    scorer = spec.scorer_name
    if scorer in TEXT_SCORERS:
        graded.values = await asyncio.to_thread(_score_texts, scorer, pairs, spec.answer_range)
        if scorer == "math" and spec.llm_cascade:
            await _cascade(settings, pairs, graded)
        if scorer == "choice":
            _add_loglik(output, graded)
    elif scorer == "llm":
        await _llm_scores(settings, pairs, graded)
    elif scorer == "code":
        from evaluation.executor import CodeExecutor, CodeExecutorUnavailable

        try:
            await _code_scores(spec, pairs, graded, executor or CodeExecutor.from_settings(settings),
                               chat_variant=output.chat_variant)
        except CodeExecutorUnavailable as exc:
            raise GradingUnavailable(f"the code executor cannot run: {exc}") from exc
    else:
        raise ValueError(f"scorer {scorer} is lm-eval's own: parse it with parse_lm_eval_output")

    notes = list(graded.notes)
    if inference is not None:
        notes.insert(0, f"generated with {inference.describe()}")
    notes.extend(await asyncio.to_thread(_budget_notes, spec, inference, tokenizer_dir, pairs))

    summary: dict[str, dict[str, float]] = {}
    errors: list[ErrorSample] = []
    item_scores: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, dict[str, list[tuple[str | None, bool]]]] = {}
    primary = spec.primary_metric
    for subset, rows in graded.values.items():
        # The mean over items and runs alike: every item has the same number of runs (avg@n).
        summary[subset] = {m: sum(r[m] for r in rows) / len(rows) for m in spec.metrics if rows and m in rows[0]}
        item_scores[subset] = {}
        answers[subset] = {}
        for k, ((item, generated), values) in enumerate(zip(pairs[subset], rows, strict=True)):
            item_scores[subset].setdefault(item.id, []).append(values.get(primary, 0.0))
            if scorer in VOTING_SCORERS:
                answers[subset].setdefault(item.id, []).append(
                    (extracted_answer(scorer, generated.output), values.get(primary, 0.0) >= 1.0))
            # The judge is shown the first run's errors, as with one run.
            if k % runs == 0 and values.get(primary, 0.0) < 1.0:
                errors.append(_error_sample(spec, item, generated, graded))
    scores = assemble_scores(spec, manifest, summary, errors, settings.max_error_samples, settings.error_sample_seed,
                             item_scores=item_scores, answers=answers if scorer in VOTING_SCORERS else None)
    return scores.model_copy(update={"scorer": scorer, "notes": notes, "answer_check": graded.answer_check})


def _num_runs(output: LmEvalOutput) -> int:
    counts = {len(g.outputs) for rows in output.generated.values() for g in rows}
    if len(counts) > 1:
        raise LmEvalOutputError(f"items were generated a different number of times: {sorted(counts)}")
    return counts.pop() if counts else 1


# ------------------------------------------------------------------ scorers


Pairs = dict[str, list[tuple[BenchmarkItem, Generated]]]


def _score_texts(scorer: str, pairs: Pairs, answer_range: tuple[int, int] | None = None,
                 ) -> dict[str, list[dict[str, float]]]:
    # In a thread: math-verify's symbolic comparison can take a while on a long answer.
    return {subset: [score_text(scorer, item, g.output, answer_range=answer_range) for item, g in rows]
            for subset, rows in pairs.items()}


def _add_loglik(output: LmEvalOutput, graded: Graded) -> None:
    """A choice item's log-likelihood scores are lm-eval's own, beside the generated letter's."""
    for subset, rows in graded.values.items():
        for row, lm_eval_row in zip(rows, output.item_metrics.get(subset, []), strict=True):
            row.update(lm_eval_row)


def _cases(scorer: str, rows: Sequence[tuple[BenchmarkItem, Generated]]) -> list[AnswerCase]:
    # The scorer's extracted final answer, never the output: the checker must not read the model's
    # reasoning, where a fine-tuned model can write instructions to it (evaluation/answer_check.py).
    return [AnswerCase(question=item.question, gold=item.answer, answer=extracted_answer(scorer, g.output))
            for item, g in rows]


async def _cascade(settings: Any, pairs: Pairs, graded: Graded) -> None:
    """The reference's aime25 cascade: only the items the rule marks wrong go to the LLM."""
    order = [(subset, i) for subset, rows in graded.values.items() for i in range(len(rows))]
    rule = [graded.values[s][i]["math_verify"] >= 1 for s, i in order]
    wrong = rule_misses(rule)
    check = await check_answers(settings, _cases("math", [pairs[order[k][0]][order[k][1]] for k in wrong]),
                                form="math")
    counted = cascade(rule, check)
    for (subset, i), correct in zip(order, counted, strict=True):
        graded.values[subset][i]["math_cascade"] = 1.0 if correct else 0.0
    rescued = sum(counted) - sum(rule)
    graded.notes.extend(check.notes)
    graded.answer_check = AnswerCheckUsage(
        model=check.model, items_asked=len(wrong) - check.not_asked, requests=check.requests,
        prompt_tokens=check.prompt_tokens, completion_tokens=check.completion_tokens,
        budget_requests=settings.bench_llm_budget_requests,
        rescued=rescued,
    )


async def _llm_scores(settings: Any, pairs: Pairs, graded: Graded) -> None:
    order = [(subset, i) for subset, rows in pairs.items() for i in range(len(rows))]
    check = await check_answers(settings, _cases("llm", [pairs[s][i] for s, i in order]), form="short")
    graded.values = {subset: [{} for _ in rows] for subset, rows in pairs.items()}
    unanswered = 0
    for (subset, i), verdict in zip(order, check.verdicts, strict=True):
        graded.values[subset][i]["llm_judge"] = 1.0 if verdict else 0.0
        unanswered += verdict is None
    graded.notes.extend(check.notes)
    if unanswered:
        graded.notes.append(f"{unanswered} of {len(order)} items got no usable LLM verdict: counted wrong")
    graded.answer_check = AnswerCheckUsage(
        model=check.model, items_asked=len(order) - check.not_asked, requests=check.requests,
        prompt_tokens=check.prompt_tokens, completion_tokens=check.completion_tokens,
        budget_requests=settings.bench_llm_budget_requests,
    )


async def _code_scores(
    spec: BenchmarkSpec, pairs: Pairs, graded: Graded,
    executor: CodeExecutor, *, chat_variant: set[str] | frozenset[str] = frozenset(),
) -> None:
    from evaluation.code_programs import build_program
    from evaluation.executor import CodeSample
    from evaluation.registry import CHAT_CODE_STYLES

    def style(subset: str) -> str:
        plain = spec.code_style or "humaneval"
        # A chat model shown the chat variant (humaneval_instruct) answers inside a fence: its program
        # is built as lm-eval builds that variant's.
        return CHAT_CODE_STYLES.get(plain, plain) if subset in chat_variant else plain

    # One sample per row (an item's runs are rows of their own): keyed by the row, as an item repeats.
    samples = [
        CodeSample(key=f"{subset}:{k}",
                   program=build_program(style(subset), item, strip_think(g.output, keep_indent=True)))
        for subset, rows in pairs.items() for k, (item, g) in enumerate(rows)
    ]
    outcomes = {o.key: o for o in await executor.run(samples)}
    graded.values = {
        subset: [{"pass@1": 1.0 if outcomes[f"{subset}:{k}"].passed else 0.0} for k in range(len(rows))]
        for subset, rows in pairs.items()
    }
    statuses: dict[str, int] = {}
    for subset, rows in pairs.items():
        for k, (item, _) in enumerate(rows):
            outcome = outcomes[f"{subset}:{k}"]
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
            if not outcome.passed:
                graded.shown.setdefault(item.id, outcome.detail[-500:])
    graded.notes.append("code samples: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))


# ------------------------------------------------------------------ notes and errors


def _budget_notes(
    spec: BenchmarkSpec, inference: InferenceConfig | None, tokenizer_dir: Path | None,
    generated: Pairs,
) -> list[str]:
    """How many outputs reached the token budget, counted with the model's own tokenizer."""
    budget = inference.budget(spec.generation.max_gen_toks) if inference else spec.generation.max_gen_toks
    notes = []
    if budget < spec.generation.max_gen_toks:
        notes.append(f"the model's entry caps generation at {budget} tokens (the benchmark's budget: "
                     f"{spec.generation.max_gen_toks})")
    tokenizer = _tokenizer(tokenizer_dir)
    if tokenizer is None:
        return notes
    total = sum(len(rows) for rows in generated.values())
    reached = sum(len(tokenizer.encode(g.output, add_special_tokens=False).ids) >= budget
                  for rows in generated.values() for _, g in rows)
    if reached:
        notes.append(f"{reached} of {total} outputs reached the {budget}-token budget and were cut there")
    return notes


def _tokenizer(model_dir: Path | None) -> Any:
    path = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
    if path is None or not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception:  # an unreadable tokenizer only loses the budget count
        log.warning("tokenizer unreadable: outputs at the token budget are not counted", path=str(path))
        return None


def _error_sample(spec: BenchmarkSpec, item: BenchmarkItem, generated: Generated, graded: Graded) -> ErrorSample:
    scorer = spec.scorer_name
    gold = item.answer
    if scorer == "choice" and item.choices:
        gold = f"{'ABCDEFGHIJ'[item.choices.index(item.answer)]}. {item.answer}"
    extracted = None
    if scorer in TEXT_SCORERS:
        choices = {"n_choices": len(item.choices)} if item.choices else {}
        extracted = extracted_answer(scorer, generated.output, **choices)
    elif scorer == "code":
        extracted = graded.shown.get(item.id)
    return ErrorSample(question=item.question, gold=gold, model_output=generated.output, extracted=extracted)
