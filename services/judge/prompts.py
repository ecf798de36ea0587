"""Render the judge's prompts from ``prompts/judge.yaml``.

Only what the judge is given can reach the prompt, and the judge is only given validation results
or failed-stage events: the hidden test split travels on a subject the judge never reads, and
``build_context`` refuses a test-split event outright.

What the candidate's processes and its fine-tuned model wrote (train.yaml, the condensed log, the
stage's error message, the model file names, the error samples with the model's outputs) reaches
the prompt fenced as untrusted data (shared/untrusted.py), with one fence per prompt: the system
prompt names its token (``untrusted_data_rule``). ftbus's own facts (exit codes, scores, the
comparison with the base model) and the benchmark's are not fenced.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict

from services.judge.facts import JudgeFacts
from services.judge.rules import JudgedEvent, train_of
from shared.events import BenchResult, LossHistory, TaskSpec
from shared.settings import Settings
from shared.untrusted import Fence

PROMPTS_FILE = Path(__file__).resolve().parents[2] / "prompts" / "judge.yaml"
LOSS_KEEP_EACH_END = 30  # first 30 + last 30 points when there are more than 60
NO_BENCHMARK = "N/A (not executed or failed)"


class JudgeTemplates:
    """The compiled templates of one prompts file."""

    def __init__(self, path: Path) -> None:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        missing = {"system", "user", "retry_note"} - set(raw or {})
        if missing:
            raise ValueError(f"{path} lacks the prompt templates {sorted(missing)}")
        # StrictUndefined: a renamed context variable fails loudly instead of rendering as "".
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
        self.system = env.from_string(raw["system"])
        self.user = env.from_string(raw["user"])
        self.retry_note = env.from_string(raw["retry_note"])


@lru_cache(maxsize=4)
def load_templates(path: Path = PROMPTS_FILE) -> JudgeTemplates:
    return JudgeTemplates(path)


def templates_for(settings: Settings) -> JudgeTemplates:
    """The templates a worker uses: ``judge_prompts_file`` when set (e.g. in a container image)."""
    return load_templates(settings.judge_prompts_file or PROMPTS_FILE)


class PromptContext(BaseModel):
    """Everything the user prompt shows, already reduced to text."""

    model_config = ConfigDict(extra="forbid")

    task: TaskSpec
    #: The fence's instruction (its token); the system prompt carries it, a custom user prompt may.
    untrusted_data_rule: str
    train_yaml: str  # fenced
    exit_code: str
    model_files_status: str
    model_files: str | None  # fenced, one name a line
    failed_stage: str | None
    stage_error: str | None  # fenced
    timeout_seconds: int | None
    data_summary: str | None
    benchmark_result: str
    error_samples: str | None  # fenced
    baseline: str | None
    loss_history: str
    loss_note: str | None
    condensed_log: str  # fenced


def truncate_loss_history(history: LossHistory, keep: int = LOSS_KEEP_EACH_END) -> tuple[LossHistory, str | None]:
    """A shortened COPY of the history; the event's own history is never touched."""
    notes = []
    train, evals = list(history.train), list(history.eval)
    if len(train) > 2 * keep:
        notes.append(f"train: first {keep} and last {keep} of {len(train)} points")
        train = train[:keep] + train[-keep:]
    if len(evals) > 2 * keep:
        notes.append(f"eval: first {keep} and last {keep} of {len(evals)} points")
        evals = evals[:keep] + evals[-keep:]
    copy = LossHistory(train=[p.model_copy() for p in train], eval=[p.model_copy() for p in evals])
    return copy, "; ".join(notes) or None


def _loss_json(history: LossHistory) -> str:
    if not history.train and not history.eval:
        return "N/A"

    # One point per line: readable, and far smaller than indented JSON.
    def block(points: list[dict[str, Any]]) -> str:
        if not points:
            return "[]"
        return "[\n" + ",\n".join("    " + json.dumps(p) for p in points) + "\n  ]"

    train = [p.model_dump(exclude_none=True) for p in history.train]
    evals = [p.model_dump(exclude_none=True) for p in history.eval]
    return '{\n  "train": ' + block(train) + ',\n  "eval": ' + block(evals) + "\n}"


def _benchmark_json(event: JudgedEvent) -> str:
    # Only the validation split's summary (the error samples go in a fence of their own): item ids stay out.
    if not isinstance(event, BenchResult) or event.benchmark is None:
        return NO_BENCHMARK
    scores = event.benchmark
    if not scores.accuracy_summary and not scores.error_samples:
        return NO_BENCHMARK
    return json.dumps({"accuracy_summary": scores.accuracy_summary}, indent=2, ensure_ascii=False)


def _error_samples(event: JudgedEvent, fence: Fence) -> str | None:
    """The validation error samples, fenced: the model's outputs (and what the scorer read from them)
    are the fine-tuned model's text, the one place where a trained-in attack would show."""
    if not isinstance(event, BenchResult) or event.benchmark is None or not event.benchmark.error_samples:
        return None
    samples = json.dumps([s.model_dump() for s in event.benchmark.error_samples], indent=2, ensure_ascii=False)
    return fence.wrap("error samples: questions, gold answers, the fine-tuned model's outputs", samples)


def _baseline_text(facts: JudgeFacts) -> str | None:
    """The base model's score, and the paired comparison in words: the interval and the p-value,
    never a bare difference that may be noise."""
    event = facts.event
    if not isinstance(event, BenchResult) or event.baseline is None:
        return None
    base = event.baseline
    if base.baseline_value is None:
        return None
    text = f"{base.primary_metric or 'primary metric'} = {base.baseline_value:.4g}"
    if base.difference is not None:
        text += f" (candidate minus base: {base.difference:+.4g})"
    if facts.paired is not None:
        p = facts.paired
        text += (f". Paired over the same {p.items} items, the candidate is {p.describe()}; "
                 f"{p.level * 100:.0f}% interval of the difference [{p.ci_low:+.4f}, {p.ci_high:+.4f}], "
                 f"p-value {p.p_value:.4g} ({p.method})")
    elif base.summary:
        text += f". {base.summary}"
    return text


def _data_summary(event: JudgedEvent) -> str | None:
    stats = event.data.data_stats
    parts = []
    if stats is not None:
        parts.append(f"{stats.total_samples} samples")
        longest = max((c.p99_tokens for c in stats.token_stats.values()), default=None)
        if longest is not None:
            parts.append(f"p99 length {longest} tokens ({stats.tokenizer})")
    if event.data.cached:
        parts.append("reused from the data cache (process_data.py not re-run)")
    return ", ".join(parts) or None


def build_context(facts: JudgeFacts, fence: Fence) -> PromptContext:
    """The user prompt's values, all read from the facts; the candidate's text inside ``fence``."""
    event = facts.event
    if isinstance(event, BenchResult) and event.split != "validation":
        raise ValueError("the judge only accepts validation benchmark results")
    exit_code = facts.outcome.exit_code
    train = train_of(event)
    history = train.training_metrics.loss_history if train is not None else LossHistory()
    shown, note = truncate_loss_history(history)
    timeout = facts.outcome.timeout_s
    stage_error = (facts.stage_report or "")[:1000]
    files = facts.model_files
    return PromptContext(
        task=event.context.task,
        untrusted_data_rule=fence.rule(),
        train_yaml=fence.wrap("train.yaml, written by the candidate", facts.train_yaml.strip() or "(empty or missing)"),
        exit_code="N/A (nothing was run)" if exit_code is None else str(exit_code),
        model_files_status=f"Found ({len(files)} files)" if files else "Not found",
        model_files=fence.wrap("model file names, as training wrote them", "\n".join(files)) if files else None,
        failed_stage=str(facts.failed_stage) if facts.failed_stage else None,
        stage_error=fence.wrap("the stage's error message", stage_error) if stage_error else None,
        timeout_seconds=round(timeout) if timeout is not None else None,
        data_summary=_data_summary(event),
        benchmark_result=_benchmark_json(event),
        error_samples=_error_samples(event, fence),
        baseline=_baseline_text(facts),
        loss_history=_loss_json(shown),
        loss_note=note,
        condensed_log=fence.wrap("the stage log, condensed", facts.condensed.as_prompt_json()),
    )


def render_system(templates: JudgeTemplates | None = None, *, fence: Fence | None = None) -> str:
    """The system prompt; ``fence`` must be the one the user prompt's context was built with."""
    rule = (fence or Fence()).rule()
    return (templates or load_templates()).system.render(untrusted_data_rule=rule).strip()


def render_user(context: PromptContext, templates: JudgeTemplates | None = None) -> str:
    return (templates or load_templates()).user.render(**context.model_dump()).strip()


def render_retry_note(attempt: int, error: str, templates: JudgeTemplates | None = None) -> str:
    return (templates or load_templates()).retry_note.render(attempt=attempt, error=error).strip()
