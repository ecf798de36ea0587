"""The lm-eval backend: render task files and the ``lm_eval`` command, then read its outputs.

lm-eval (and torch) live in the fine-tuning toolchain, not in the services' environment: this module
only writes files, builds an argv for the ``lm_eval`` executable and parses what it leaves behind.

One run evaluates one split of one benchmark:
  <run_dir>/data/<subset>.jsonl + manifest.json   the split's items (splits.write_split_data)
  <run_dir>/tasks/<task>.yaml                     one lm-eval custom task per subset
  <run_dir>/output/<model>/results_<ts>.json      lm-eval: metrics keyed "<metric>,<filter>"
  <run_dir>/output/<model>/samples_<task>_<ts>.jsonl   lm-eval --log_samples: one doc a line
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evaluation.inference import InferenceConfig
from evaluation.models import ModelSelection, has_chat_template
from evaluation.registry import BenchmarkSpec
from evaluation.scoring import assemble_scores, evaluated_subsets
from evaluation.splits import SplitManifest, write_split_data
from shared.events import BenchmarkScores, ErrorSample
from shared.offline import OFFLINE_ENV

TASK_PREFIX = "ftbus"
NO_FILTER = "none"
# lm-eval compares predictions and references after removing these: a model answering " 42" or
# "42 " to "42" is right. Applied to both sides, so golds are unaffected.
_STRIP_REGEXES = [r"^\s+", r"\s+$"]



class LmEvalOutputError(RuntimeError):
    """lm-eval's output directory lacks what a finished run leaves (results, samples, a subset)."""


# ------------------------------------------------------------------ tasks


def _slug(text: str) -> str:
    # lm-eval names sample files with re.sub(r"\W", "_", task): use names that survive unchanged.
    return re.sub(r"\W+", "_", text).strip("_").lower() or "x"


def task_name(benchmark: str, subset: str) -> str:
    return f"{TASK_PREFIX}_{_slug(benchmark)}_{_slug(subset)}"


#: The task of a choice subset that generates the answer letter (its main task scores the letters'
#: log-likelihood).
LETTER_TASK_SUFFIX = "_letter"
LETTERS = "ABCDEFGHIJ"


def letter_task_name(benchmark: str, subset: str) -> str:
    return task_name(benchmark, subset) + LETTER_TASK_SUFFIX


def _generation_kwargs(spec: BenchmarkSpec, inference: InferenceConfig | None) -> dict[str, Any]:
    budget = inference.budget(spec.generation.max_gen_toks) if inference else spec.generation.max_gen_toks
    sampling = inference.generation_kwargs() if inference else {"do_sample": False}
    return {"until": list(spec.generation.until), "max_gen_toks": budget, **sampling}


def render_task_config(
    spec: BenchmarkSpec, subset: str, data_file: Path, inference: InferenceConfig | None = None,
    *, letter: bool = False, chat: bool = False,
) -> dict[str, Any]:
    """An lm-eval custom task reading one local jsonl file (``dataset_path: json``).

    ``inference`` is the base model's sampling (None: greedy). ``letter``: the generated-letter
    task of a ``choice`` subset (MMLU's answer letter, read from generated text by ftbus). ``chat``:
    the model is shown the chat template, so the benchmark's chat variant is used where it has one
    (``chat_prompt``, ``chat_gen_prefix``: lm-eval's humaneval_instruct), recorded in the metadata."""
    variant = chat and spec.chat_prompt is not None and not letter
    config: dict[str, Any] = {
        "task": letter_task_name(spec.name, subset) if letter else task_name(spec.name, subset),
        "task_alias": f"{subset} (letter)" if letter else subset,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(data_file).resolve())}},
        "test_split": "test",
        "output_type": "generate_until" if letter else spec.kind,
        "doc_to_text": spec.chat_prompt if variant else spec.prompt,
        "num_fewshot": 0,
        "metadata": {"version": spec.version, "ftbus_benchmark": spec.name, "ftbus_subset": subset},
    }
    if variant:
        config["metadata"]["ftbus_chat_variant"] = True
        if spec.chat_gen_prefix:
            config["gen_prefix"] = spec.chat_gen_prefix
    if spec.kind == "generate_until" or letter:
        # For the scorers ftbus computes from the generated text (all but ``exact``), lm-eval's own
        # exact match is only what lm-eval needs to run a generation task: it is not reported.
        config |= {
            "doc_to_target": "{{answer}}",
            "generation_kwargs": _generation_kwargs(spec, inference),
            "metric_list": [{
                "metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                "ignore_case": True, "ignore_punctuation": False, "regexes_to_ignore": _STRIP_REGEXES,
            }],
        }
    else:
        config |= {
            # The choices' texts, or, for a choice benchmark whose prompt lists them, their letters
            # (as lm-eval's own mmlu task scores them).
            "doc_to_choice": (
                f"{{{{ {list(LETTERS)!r}[:choices|length] }}}}" if spec.scorer_name == "choice" else "{{choices}}"
            ),
            # An index, not the answer text: lm-eval would read a numeric answer ("41") as an index.
            "doc_to_target": "{{choices.index(answer)}}",
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")
            ],
        }
    if inference is not None and inference.num_runs > 1 and "generation_kwargs" in config:
        # lm-eval's own way to sample an item several times: each request cloned ``repeats`` times.
        config["repeats"] = inference.num_runs
    return config


def write_task_configs(
    spec: BenchmarkSpec, data_files: Mapping[str, Path], include_dir: Path, inference: InferenceConfig | None = None,
    *, chat: bool = False,
) -> list[str]:
    """Write the task YAMLs of every subset into ``include_dir``; return the task names to run.
    ``chat``: lm-eval will apply the chat template (the benchmark's chat variant is used)."""
    include_dir = Path(include_dir)
    include_dir.mkdir(parents=True, exist_ok=True)
    tasks: list[str] = []
    for subset, data_file in data_files.items():
        configs = [render_task_config(spec, subset, data_file, inference, chat=chat)]
        if spec.scorer_name == "choice":
            configs.append(render_task_config(spec, subset, data_file, inference, letter=True))
        for config in configs:
            (include_dir / f"{config['task']}.yaml").write_text(
                yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8"
            )
            tasks.append(config["task"])
    return tasks


# ------------------------------------------------------------------ command


def _model_arg(path: Path) -> str:
    text = str(Path(path).resolve())
    # lm-eval splits --model_args on "," and "=": such a path cannot be passed through it.
    if "," in text or "=" in text:
        raise ValueError(f"model path {text!r} contains ',' or '=', which lm-eval's --model_args cannot carry")
    return text


def build_lm_eval_command(
    *,
    lm_eval: str | Path,
    model: ModelSelection,
    tasks: Sequence[str],
    include_path: Path,
    output_path: Path,
    device: str = "cpu",
    batch_size: int | str = 1,
    apply_chat_template: bool = False,
    dtype: str | None = None,
    seed: int = 0,
) -> list[str]:
    """The argv of one offline lm-eval run (``lm_eval run --model hf ...``)."""
    model_args = [f"pretrained={_model_arg(model.pretrained)}"]
    if model.peft is not None:
        model_args.append(f"peft={_model_arg(model.peft)}")
    if dtype:
        model_args.append(f"dtype={dtype}")
    argv = [
        str(lm_eval), "run",
        "--model", "hf",
        "--model_args", ",".join(model_args),
        "--tasks", ",".join(tasks),
        "--include_path", str(Path(include_path).resolve()),
        "--output_path", str(Path(output_path).resolve()),
        "--log_samples",
        "--device", device,
        "--batch_size", str(batch_size),
        "--seed", str(seed),
    ]
    if apply_chat_template:
        argv.append("--apply_chat_template")
    return argv


def lm_eval_env(run_dir: Path) -> dict[str, str]:
    """Variables for the lm-eval process: offline, and its datasets cache inside the run folder so
    that runs do not share (or leak) converted benchmark data through ~/.cache."""
    return {**OFFLINE_ENV, "HF_DATASETS_CACHE": str(Path(run_dir).resolve() / "hf_datasets_cache")}


def repeat_batch(inference: InferenceConfig | None) -> int:
    """The batch size that makes an item's repeats one batched generation: lm-eval sorts the cloned
    requests by their prompt, so the copies of one prompt are neighbours and fill one batch."""
    return inference.num_runs if inference else 1


def chat_template_for(model: ModelSelection, inference: InferenceConfig | None) -> bool:
    """The model entry's ``chat_template`` when it says, else whether the tokenizer lm-eval loads
    (the base model's, for an adapter) has one."""
    if inference is not None and inference.chat_template is not None:
        return inference.chat_template
    return has_chat_template(model.pretrained)


@dataclass
class LmEvalRun:
    argv: list[str]
    env: dict[str, str]
    output_dir: Path
    tasks: list[str] = field(default_factory=list)


def prepare_lm_eval_run(
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    run_dir: Path,
    *,
    lm_eval: str | Path,
    model: ModelSelection,
    device: str = "cpu",
    batch_size: int | str | None = None,
    apply_chat_template: bool | None = None,
    dtype: str | None = None,
    seed: int = 0,
    inference: InferenceConfig | None = None,
) -> LmEvalRun:
    """Write the split's data and task files under ``run_dir``; return what to run.

    ``apply_chat_template=None`` applies the chat template when the tokenizer lm-eval loads (the
    base model's, for an adapter) has one: fine-tuned chat models are evaluated as they were trained.
    """
    run_dir = Path(run_dir)
    data_files = write_split_data(spec, manifest, run_dir / "data")
    if apply_chat_template is None:
        apply_chat_template = chat_template_for(model, inference)
    tasks = write_task_configs(spec, data_files, run_dir / "tasks", inference, chat=apply_chat_template)
    if batch_size is None:
        batch_size = repeat_batch(inference)
    output_dir = run_dir / "output"
    argv = build_lm_eval_command(
        lm_eval=lm_eval, model=model, tasks=tasks, include_path=run_dir / "tasks",
        output_path=output_dir, device=device, batch_size=batch_size,
        apply_chat_template=apply_chat_template, dtype=dtype, seed=seed,
    )
    return LmEvalRun(argv=argv, env=lm_eval_env(run_dir), output_dir=output_dir, tasks=tasks)


# ------------------------------------------------------------------ parsing


def find_results_file(output_dir: Path) -> Path:
    """The newest ``results_<timestamp>.json`` under ``output_dir`` (lm-eval nests it in a folder
    named after the model path)."""
    found = sorted(Path(output_dir).rglob("results_*.json"), key=lambda p: (p.name, str(p)))
    if not found:
        raise LmEvalOutputError(f"lm-eval left no results_*.json under {output_dir}")
    return found[-1]


def _metric_name(key: str) -> str | None:
    """'exact_match,none' -> 'exact_match'; other filters keep theirs; stderr and aliases are dropped."""
    metric, _, flt = key.partition(",")
    if not flt or metric.endswith("_stderr"):
        return None
    return metric if flt == NO_FILTER else key


def _summary(task_results: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in task_results.items():
        name = _metric_name(key)
        if name is not None and isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _read_samples(results_file: Path, task: str) -> list[dict[str, Any]]:
    stamp = results_file.stem.removeprefix("results_")
    path = results_file.parent / f"samples_{task}_{stamp}.jsonl"
    if not path.is_file():
        candidates = sorted(results_file.parent.glob(f"samples_{task}_*.jsonl"))
        if not candidates:
            raise LmEvalOutputError(f"lm-eval left no samples for task {task} in {results_file.parent}")
        path = candidates[-1]
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r.get("doc_id", 0))


def _first(value: Any) -> Any:
    while isinstance(value, list) and value:
        value = value[0]
    return value


def _prompt(row: Mapping[str, Any]) -> str:
    # arguments: {"gen_args_0": {"arg_0": <prompt>, "arg_1": <gen kwargs>}, ...} in lm-eval 0.4.13
    args = row.get("arguments")
    first = next(iter(args.values()), None) if isinstance(args, dict) else _first(args)
    if isinstance(first, dict):
        first = first.get("arg_0")
    return "" if first is None else str(first)


def _error_sample(spec: BenchmarkSpec, row: Mapping[str, Any]) -> ErrorSample:
    doc = row.get("doc") or {}
    question = str(doc["question"]) if "question" in doc else _prompt(row)
    if spec.kind == "multiple_choice":
        choices = list(doc.get("choices") or [])
        # filtered_resps: one [loglikelihood, is_greedy] per choice; the model "answers" the argmax.
        lls = [float(_first(r)) for r in row.get("filtered_resps") or []]
        pred = choices[max(range(len(lls)), key=lls.__getitem__)] if lls and len(lls) == len(choices) else ""
        return ErrorSample(question=question, gold=str(doc.get("answer", "")), model_output=pred)
    output = row.get("filtered_resps")
    return ErrorSample(
        question=question,
        gold=str(doc.get("answer", row.get("target", ""))),
        model_output=str(_first(output) if output is not None else _first(row.get("resps")) or ""),
    )


def _is_correct(spec: BenchmarkSpec, row: Mapping[str, Any]) -> bool:
    return _row_value(spec, row) >= 1.0


def _row_value(spec: BenchmarkSpec, row: Mapping[str, Any]) -> float:
    for metric in (spec.primary_metric, *spec.metrics):
        if metric in row:
            return float(row[metric])
    raise LmEvalOutputError(f"sample {row.get('doc_id')} has none of the metrics {spec.metrics}")


def run_outputs(row: Mapping[str, Any]) -> list[str]:
    """Every generation of one item, in run order: lm-eval logs ``resps`` as one list per request,
    holding one response per repeat."""
    resps = row.get("resps")
    runs = resps[0] if isinstance(resps, list) and resps and isinstance(resps[0], list) else [_first(resps)]
    return ["" if r is None else str(_first(r)) for r in runs]


def exact_match(output: str, gold: str) -> float:
    """lm-eval's exact_match as our tasks configure it (case ignored, outer whitespace stripped), for
    the runs after the first: lm-eval scores only the first of repeated samples."""
    def norm(text: str) -> str:
        for pattern in _STRIP_REGEXES:
            text = re.sub(pattern, "", text)
        return text.lower()

    return float(norm(output) == norm(gold))


def parse_lm_eval_output(
    output_dir: Path,
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    max_error_samples: int = 10,
    seed: int = 0,
) -> BenchmarkScores:
    """Turn one lm-eval run into ``BenchmarkScores``.

    ``accuracy_summary`` is {subset: {metric: value}} (metric names without the ``,none`` filter);
    ``primary_value`` the mean of the primary metric over evaluated subsets; ``error_samples`` at
    most ``max_error_samples`` wrong answers over all subsets, drawn with ``random.Random(seed)`` so
    that the same run always shows the judge the same samples (the reference's were unseeded).
    """
    results_file = find_results_file(output_dir)
    try:
        results = json.loads(results_file.read_text(encoding="utf-8"))["results"]
    except (ValueError, KeyError) as exc:
        raise LmEvalOutputError(f"{results_file} is not an lm-eval results file: {exc}") from exc

    summary: dict[str, dict[str, float]] = {}
    errors: list[ErrorSample] = []
    item_scores: dict[str, dict[str, list[float]]] = {}
    runs = 1
    for subset, ids in evaluated_subsets(spec, manifest):
        task = task_name(spec.name, subset.name)
        if task not in results:
            raise LmEvalOutputError(f"{results_file.name} has no results for task {task} (subset {subset.name})")
        metrics = _summary(results[task])
        if spec.primary_metric not in metrics:
            raise LmEvalOutputError(f"task {task} reports {sorted(metrics)}, not {spec.primary_metric}")
        summary[subset.name] = metrics
        rows = _read_samples(results_file, task)
        if len(rows) != len(ids):
            raise LmEvalOutputError(f"task {task}: {len(rows)} samples for {len(ids)} items in the split")
        errors.extend(_error_sample(spec, row) for row in rows if not _is_correct(spec, row))
        item_scores[subset.name] = scores = {}
        for row, item_id in zip(rows, ids, strict=True):
            outputs = run_outputs(row) if spec.kind == "generate_until" else []
            if len(outputs) > 1:
                gold = str((row.get("doc") or {}).get("answer", row.get("target", "")))
                scores[item_id] = [exact_match(text, gold) for text in outputs]
            else:
                scores[item_id] = [_row_value(spec, row)]
            runs = max(runs, len(scores[item_id]))
        if runs > 1:
            # lm-eval's own number is the first run's: report the mean over every run instead.
            values = [v for item in scores.values() for v in item]
            metrics[spec.primary_metric] = sum(values) / len(values)

    notes = [f"{spec.primary_metric} over {runs} runs per item (lm-eval's own scores only the first run)"] if runs > 1 \
        else []
    scores_out = assemble_scores(spec, manifest, summary, errors, max_error_samples, seed, item_scores=item_scores)
    return scores_out.model_copy(update={"notes": [*scores_out.notes, *notes]})


@dataclass(frozen=True)
class Generated:
    """One item's generated text, as lm-eval logged it (before its own filters); ``runs``: every
    repeat's text, the first being ``output`` (empty: only ``output``)."""

    item_id: str
    output: str
    runs: tuple[str, ...] = ()

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.runs or (self.output,)


@dataclass
class LmEvalOutput:
    """What ftbus's own scorers read from one lm-eval run: per subset, the generated text of each
    item, and lm-eval's own per-item metrics (a choice benchmark's log-likelihood ``acc``,
    ``acc_norm``), in split order."""

    generated: dict[str, list[Generated]] = field(default_factory=dict)
    item_metrics: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    #: The subsets generated with the benchmark's chat variant (their task's metadata says so).
    chat_variant: set[str] = field(default_factory=set)


def read_lm_eval_output(output_dir: Path, spec: BenchmarkSpec, manifest: SplitManifest) -> LmEvalOutput:
    """The generations of a benchmark scored by ftbus (registry: not ``exact``/``loglik``)."""
    results_file = find_results_file(output_dir)
    try:
        results = json.loads(results_file.read_text(encoding="utf-8"))["results"]
    except (ValueError, KeyError) as exc:
        raise LmEvalOutputError(f"{results_file} is not an lm-eval results file: {exc}") from exc
    out = LmEvalOutput()
    configs = json.loads(results_file.read_text(encoding="utf-8")).get("configs") or {}
    for subset, ids in evaluated_subsets(spec, manifest):
        main = task_name(spec.name, subset.name)
        if ((configs.get(main) or {}).get("metadata") or {}).get("ftbus_chat_variant"):
            out.chat_variant.add(subset.name)
        generating = letter_task_name(spec.name, subset.name) if spec.scorer_name == "choice" else main
        for task in {main, generating}:
            if task not in results:
                raise LmEvalOutputError(f"{results_file.name} has no results for task {task} (subset {subset.name})")
        if spec.scorer_name == "choice":
            scored = _read_samples(results_file, main)
            if len(scored) != len(ids):
                raise LmEvalOutputError(f"task {main}: {len(scored)} samples for {len(ids)} items in the split")
            out.item_metrics[subset.name] = [
                {m: float(row[m]) for m in ("acc", "acc_norm") if m in row} for row in scored
            ]
        rows = _read_samples(results_file, generating)
        if len(rows) != len(ids):
            raise LmEvalOutputError(f"task {generating}: {len(rows)} samples for {len(ids)} items in the split")
        generated = []
        for row, item_id in zip(rows, ids, strict=True):
            doc_id = (row.get("doc") or {}).get("id", item_id)
            if doc_id != item_id:
                raise LmEvalOutputError(
                    f"task {generating}: sample {row.get('doc_id')} is item {doc_id}, not {item_id}")
            # resps: the raw generation, one list per request; filtered_resps went through lm-eval's
            # filters (none for our tasks, but the raw text is what the scorers must see).
            outputs = run_outputs(row)
            generated.append(Generated(item_id, outputs[0], tuple(outputs)))
        out.generated[subset.name] = generated
    return out
