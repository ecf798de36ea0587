"""The OpenCompass backend: render a config and the ``opencompass`` command, then read its outputs.

OpenCompass lives in its own environment (deploy/opencompass/install.sh): it pins numpy<2 and
datasets<4, which break the fine-tuning toolchain. This module only writes files, builds an argv for
that environment's ``opencompass`` executable and parses what it leaves behind, like lmeval.py.

One run evaluates one split of one benchmark:
  <run_dir>/data/<subset>.jsonl + manifest.json       the split's items (splits.write_split_data)
  <run_dir>/ftbus_oc_plugin.py                         dataset loader + evaluators (PLUGIN_SOURCE)
  <run_dir>/config.py                                  one OpenCompass dataset per subset, one model
  <run_dir>/output/<ts>/summary/summary_<ts>.csv       dataset,version,metric,mode,<model abbr>
  <run_dir>/output/<ts>/results/<model>/<abbr>.json    metrics + per-item details
  <run_dir>/output/<ts>/predictions/<model>/<abbr>.json   prompts and raw predictions

Unlike the reference (OpenCompass dataset modules from a fork, vLLM on GPU), the datasets here are
the registry's own jsonl splits and the model is OpenCompass's HuggingFace wrapper, which runs on CPU.
Scores are reported on lm-eval's 0-1 scale under lm-eval's metric names, keyed by subset name, so
``BenchmarkScores`` looks the same whichever backend produced it.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.models import ModelSelection, has_chat_template
from evaluation.registry import BenchmarkItem, BenchmarkSpec
from evaluation.scoring import assemble_scores, evaluated_subsets
from evaluation.splits import SplitManifest, split_items, write_split_data
from shared.events import BenchmarkScores, ErrorSample
from shared.offline import OFFLINE_ENV

PLUGIN_MODULE = "ftbus_oc_plugin"
CONFIG_FILE = "config.py"
MODEL_ABBR = "ftbus-model"

# What the OpenCompass backend computes per benchmark kind (lm-eval's names, see registry.KIND_METRICS).
# acc_norm (lm-eval's byte-length-normalised loglikelihood) has no OpenCompass counterpart: OpenCompass
# scores choices by perplexity of the whole prompt (PPLInferencer), so it reports ``acc`` only.
OPENCOMPASS_METRICS: dict[str, tuple[str, ...]] = {
    "generate_until": ("exact_match",),
    "multiple_choice": ("acc",),
}
# Columns of OpenCompass's summary CSV that are not a model's score (the reference's rule).
SUMMARY_KEY_COLUMNS = ("dataset", "version", "metric", "mode")
# lm-eval's target_delimiter: a choice is scored as "<prompt> <choice>", as lm-eval does.
CHOICE_DELIMITER = " "
_TIMESTAMP = re.compile(r"^\d{8}_\d{6}$")


class OpenCompassOutputError(RuntimeError):
    """OpenCompass's work dir lacks what a finished run leaves (summary, results, a subset)."""


class OpenCompassUnsupported(ValueError):
    """The benchmark asks for something this backend cannot compute (e.g. acc_norm)."""


# ------------------------------------------------------------------ the plugin written into the run dir

# Imported by config.py (the run dir is on PYTHONPATH) and by OpenCompass's task processes, which
# rebuild the classes from their dotted names. A real module shipped with the package
# (plugins/ftbus_oc_plugin.py), copied into the run folder: it runs in the OpenCompass environment
# (opencompass, datasets, transformers), which the services' environment lacks;
# tests/e2e/test_opencompass_backend.py runs it for real.
PLUGIN_FILE = Path(__file__).resolve().parent / "plugins" / f"{PLUGIN_MODULE}.py"
PLUGIN_SOURCE = PLUGIN_FILE.read_text(encoding="utf-8")


# ------------------------------------------------------------------ datasets and config


def dataset_abbr(spec: BenchmarkSpec, subset: str) -> str:
    """OpenCompass's name for one subset: it names result files and summary rows. Benchmark and
    subset names are already file-name safe (registry.NAME_PATTERN); parse maps it back."""
    return f"{spec.name}__{subset}"


def _num_choices(spec: BenchmarkSpec, subset: str, items: list[BenchmarkItem]) -> int:
    # PPLInferencer scores a fixed set of labels per dataset: every item needs as many choices.
    counts = {len(item.choices or []) for item in items}
    if len(counts) != 1:
        raise OpenCompassUnsupported(
            f"benchmark {spec.name} subset {subset}: items have {sorted(counts)} choices; the OpenCompass "
            "backend needs the same number of choices for every item of a subset"
        )
    return counts.pop()


def render_dataset_config(
    spec: BenchmarkSpec,
    subset: str,
    data_file: Path,
    *,
    num_choices: int = 0,
    chat_template_from: Path | None = None,
) -> dict[str, Any]:
    """One OpenCompass dataset config, as plain data: class names are strings (``_ref``) that
    ``render_config`` turns into the imported names."""
    load: dict[str, Any] = {"path": str(Path(data_file).resolve())}
    reader: dict[str, Any] = {"input_columns": ["question", "prompt"], "output_column": "answer"}
    if spec.kind == "generate_until":
        infer = {
            # A plain string, not a HUMAN round: OpenCompass's default chat meta template merges an
            # empty SYSTEM turn into the HUMAN one, which appends "\n" to every question. The chat
            # wrapper sends a string as one user message through the model's chat template.
            "prompt_template": {"type": _ref("PromptTemplate"), "template": "{question}"},
            "retriever": {"type": _ref("ZeroRetriever")},
            "inferencer": {"type": _ref("GenInferencer"), "max_out_len": spec.generation.max_gen_toks,
                           "stopping_criteria": list(spec.generation.until)},
        }
        evaluator = {"type": _ref("FtbusExactMatchEvaluator")}
    else:
        load["num_choices"] = num_choices
        if chat_template_from is not None:
            load["chat_template_from"] = str(Path(chat_template_from).resolve())
        reader = {"input_columns": ["prompt", *(f"choice{i}" for i in range(num_choices))], "output_column": "label"}
        infer = {
            "prompt_template": {
                "type": _ref("PromptTemplate"),
                "template": {str(i): f"{{prompt}}{CHOICE_DELIMITER}{{choice{i}}}" for i in range(num_choices)},
            },
            "retriever": {"type": _ref("ZeroRetriever")},
            "inferencer": {"type": _ref("PPLInferencer")},
        }
        evaluator = {"type": _ref("FtbusChoiceAccuracyEvaluator")}
    return {
        "abbr": dataset_abbr(spec, subset),
        "type": _ref("FtbusJsonlDataset"),
        **load,
        "reader_cfg": reader,
        "infer_cfg": infer,
        "eval_cfg": {"evaluator": evaluator},
    }


def render_model_config(
    spec: BenchmarkSpec,
    model: ModelSelection,
    *,
    device: str = "cpu",
    batch_size: int = 1,
    dtype: str | None = None,
    chat: bool = False,
) -> dict[str, Any]:
    """OpenCompass's HuggingFace wrapper (never vLLM: it must run on CPU). Generation with a chat
    template uses HuggingFacewithChatTemplate; perplexity scoring needs HuggingFaceBaseModel (the
    chat wrapper has no get_ppl), so multiple-choice prompts are chat-rendered by the dataset loader."""
    use_chat = chat and spec.kind == "generate_until"
    # float32 on CPU: OpenCompass falls back to float16 when it cannot read a dtype from the config.
    resolved_dtype = dtype or ("float32" if device == "cpu" else "auto")
    config: dict[str, Any] = {
        "type": _ref("HuggingFacewithChatTemplate" if use_chat else "HuggingFaceBaseModel"),
        "abbr": MODEL_ABBR,
        "path": str(Path(model.pretrained).resolve()),
        "model_kwargs": {"torch_dtype": resolved_dtype, "device_map": device if device == "cpu" else "auto"},
        "tokenizer_kwargs": {},
        "generation_kwargs": {"do_sample": False},  # greedy: the same model gives the same score
        "batch_size": batch_size,
        "run_cfg": {"num_gpus": 0 if device == "cpu" else 1},
    }
    if model.peft is not None:
        config["peft_path"] = str(Path(model.peft).resolve())
    return config


@dataclass(frozen=True)
class _Ref:
    name: str


def _ref(name: str) -> _Ref:
    return _Ref(name)


_IMPORTS = {
    "HuggingFaceBaseModel": "opencompass.models",
    "HuggingFacewithChatTemplate": "opencompass.models",
    "GenInferencer": "opencompass.openicl.icl_inferencer",
    "PPLInferencer": "opencompass.openicl.icl_inferencer",
    "PromptTemplate": "opencompass.openicl.icl_prompt_template",
    "ZeroRetriever": "opencompass.openicl.icl_retriever",
    "NaivePartitioner": "opencompass.partitioners",
    "LocalRunner": "opencompass.runners",
    "OpenICLInferTask": "opencompass.tasks",
    "OpenICLEvalTask": "opencompass.tasks",
    "FtbusJsonlDataset": PLUGIN_MODULE,
    "FtbusExactMatchEvaluator": PLUGIN_MODULE,
    "FtbusChoiceAccuracyEvaluator": PLUGIN_MODULE,
}


def _py(value: Any, indent: int = 0) -> str:
    """Python source for config data: dicts, lists, scalars and class references."""
    pad = "    " * (indent + 1)
    if isinstance(value, _Ref):
        return value.name
    if isinstance(value, dict):
        if not value:
            return "dict()"
        items = ",\n".join(f"{pad}{k!r}: {_py(v, indent + 1)}" for k, v in value.items())
        return "{\n" + items + ",\n" + "    " * indent + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        items = ",\n".join(f"{pad}{_py(v, indent + 1)}" for v in value)
        return "[\n" + items + ",\n" + "    " * indent + "]"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    raise TypeError(f"cannot render {type(value).__name__} into an OpenCompass config")


def render_config(datasets: list[dict[str, Any]], model: dict[str, Any], work_dir: Path) -> str:
    """The config.py OpenCompass runs: every subset in ONE inference task (the model is loaded once)
    and one evaluation task, run one at a time (a CPU has no spare device for a second model)."""
    runtime = {
        "infer": {
            "partitioner": {"type": _ref("NaivePartitioner"), "n": max(1, len(datasets))},
            "runner": {"type": _ref("LocalRunner"), "max_num_workers": 1,
                       "task": {"type": _ref("OpenICLInferTask")}},
        },
        "eval": {
            "partitioner": {"type": _ref("NaivePartitioner"), "n": max(1, len(datasets))},
            # dump_details: per-item results, the source of error samples (as the reference).
            "runner": {"type": _ref("LocalRunner"), "max_num_workers": 1,
                       "task": {"type": _ref("OpenICLEvalTask"), "dump_details": True}},
        },
    }
    by_module: dict[str, list[str]] = {}
    for name, module in _IMPORTS.items():
        by_module.setdefault(module, []).append(name)
    imports = "\n".join(f"from {m} import {', '.join(sorted(names))}" for m, names in by_module.items())
    return (
        "# Written by ftbus (evaluation/opencompass.py) for one benchmark split.\n"
        f"{imports}\n\n"
        f"datasets = {_py(datasets)}\n\n"
        f"models = [{_py(model)}]\n\n"
        f"infer = {_py(runtime['infer'])}\n\n"
        f"eval = {_py(runtime['eval'])}\n\n"
        f"work_dir = {str(Path(work_dir).resolve())!r}\n"
    )


# ------------------------------------------------------------------ command


def build_opencompass_command(
    *, opencompass: str | Path, config: Path, work_dir: Path, debug: bool = True
) -> list[str]:
    """``opencompass <config> --work-dir <dir>``. ``--debug`` runs the tasks inside this one process:
    one torch import instead of three, task logs in our log instead of files, and a failing task
    fails the command (without it OpenCompass logs the failure and exits 0)."""
    argv = [str(opencompass), str(Path(config).resolve()), "--work-dir", str(Path(work_dir).resolve())]
    if debug:
        argv.append("--debug")
    return argv


def opencompass_env(run_dir: Path) -> dict[str, str]:
    """Offline; the plugin importable (config.py and, without --debug, the task processes import it
    by name); the datasets cache inside the run folder, not shared through ~/.cache."""
    run_dir = Path(run_dir).resolve()
    return {
        **OFFLINE_ENV,
        "PYTHONPATH": str(run_dir),
        "HF_DATASETS_CACHE": str(run_dir / "hf_datasets_cache"),
        "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ of the plugin among the run's files
    }


@dataclass
class OpenCompassRun:
    argv: list[str]
    env: dict[str, str]
    output_dir: Path
    datasets: dict[str, str] = field(default_factory=dict)  # subset -> OpenCompass dataset abbr


def prepare_opencompass_run(
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    run_dir: Path,
    *,
    opencompass: str | Path,
    model: ModelSelection,
    device: str = "cpu",
    batch_size: int = 1,
    apply_chat_template: bool | None = None,
    dtype: str | None = None,
    debug: bool = True,
) -> OpenCompassRun:
    """Write the split's data, the plugin and config.py under ``run_dir``; return what to run.

    ``apply_chat_template=None`` uses the chat template when the tokenizer OpenCompass loads (the
    base model's, for an adapter) has one, as the lm-eval backend does. The command must run with
    ``cwd=run_dir``: OpenCompass writes its task parameter files under ``./tmp``.
    """
    if spec.primary_metric not in OPENCOMPASS_METRICS[spec.kind]:
        raise OpenCompassUnsupported(
            f"benchmark {spec.name}: the OpenCompass backend computes {', '.join(OPENCOMPASS_METRICS[spec.kind])} "
            f"for {spec.kind}, not {spec.primary_metric}; use the lm-eval backend"
        )
    run_dir = Path(run_dir)
    data_files = write_split_data(spec, manifest, run_dir / "data")
    if apply_chat_template is None:
        apply_chat_template = has_chat_template(model.pretrained)
    items = split_items(spec, manifest)
    datasets = []
    for subset, data_file in data_files.items():
        choices = _num_choices(spec, subset, items[subset]) if spec.kind == "multiple_choice" else 0
        datasets.append(render_dataset_config(
            spec, subset, data_file, num_choices=choices,
            chat_template_from=model.pretrained if apply_chat_template else None,
        ))
    output_dir = run_dir / "output"
    model_cfg = render_model_config(spec, model, device=device, batch_size=batch_size, dtype=dtype,
                                    chat=apply_chat_template)
    (run_dir / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    config = run_dir / CONFIG_FILE
    config.write_text(render_config(datasets, model_cfg, output_dir), encoding="utf-8")
    return OpenCompassRun(
        argv=build_opencompass_command(opencompass=opencompass, config=config, work_dir=output_dir, debug=debug),
        env=opencompass_env(run_dir),
        output_dir=output_dir,
        datasets={subset: dataset_abbr(spec, subset) for subset in data_files},
    )


# ------------------------------------------------------------------ parsing


def find_run_dir(output_dir: Path) -> Path:
    """The newest ``<YYYYmmdd_HHMMSS>`` folder that holds a summary (the reference's rule)."""
    runs = sorted(p for p in Path(output_dir).iterdir() if p.is_dir() and _TIMESTAMP.match(p.name)) \
        if Path(output_dir).is_dir() else []
    for run in reversed(runs):
        if any((run / "summary").glob("*.csv")):
            return run
    raise OpenCompassOutputError(f"OpenCompass left no <timestamp>/summary/*.csv under {output_dir}")


def read_summary(run: Path) -> dict[str, dict[str, float]]:
    """Pivot the newest summary CSV into {dataset abbr: {metric: score}}, skipping '-' (no score)."""
    path = sorted((run / "summary").glob("*.csv"))[-1]
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        columns = [c for c in reader.fieldnames or [] if c not in SUMMARY_KEY_COLUMNS]
        if not columns:
            raise OpenCompassOutputError(f"{path} has no score column")
        score = columns[0]
        table: dict[str, dict[str, float]] = {}
        for row in reader:
            try:
                value = float(row[score])
            except (TypeError, ValueError):
                continue  # "-": the dataset failed or the metric is missing
            table.setdefault(row["dataset"], {})[row["metric"]] = value
    return table


def _model_dirs(run: Path, kind: str) -> list[Path]:
    root = run / kind
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _find_json(run: Path, kind: str, abbr: str) -> Path | None:
    # One model per ftbus run, but the model folder is named after its abbr: do not assume it.
    for model_dir in _model_dirs(run, kind):
        if (model_dir / f"{abbr}.json").is_file():
            return model_dir / f"{abbr}.json"
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise OpenCompassOutputError(f"{path} is not JSON: {exc}") from exc


def _first(value: Any) -> Any:
    # Evaluators' details hold one value per replica (n runs); ftbus runs n=1.
    while isinstance(value, list) and value:
        value = value[0]
    return value


def _truthy(value: Any) -> bool:
    """The reference's correctness rule: booleans, numbers, or strings A/CORRECT/TRUE/YES/1;
    lists (one entry per replica) must all be correct."""
    if isinstance(value, list):
        return bool(value) and all(_truthy(v) for v in value)
    if isinstance(value, str):
        return value.strip().upper() in {"A", "CORRECT", "TRUE", "YES", "1"}
    return bool(value)


def _is_correct(detail: Mapping[str, Any]) -> bool:
    for key in ("cascade_correct", "correct", "is_correct", "exact_match"):
        if key in detail:
            return _truthy(detail[key])
    return False  # no verdict: counted as an error, as the reference does


def _details(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    details = results.get("details")
    if isinstance(details, dict):  # format_details() keys items by index, plus a "type" entry
        details = [v for k, v in sorted(((k, v) for k, v in details.items() if k.isdigit()), key=lambda kv: int(kv[0]))]
    return [d for d in details or [] if isinstance(d, dict)]


def _predictions(run: Path, abbr: str) -> list[dict[str, Any]]:
    path = _find_json(run, "predictions", abbr)
    if path is None:
        return []
    data = _read_json(path)
    if isinstance(data, dict):  # {"0": {...}, "1": {...}}: items by index
        return [data[k] for k in sorted((k for k in data if str(k).isdigit()), key=int)]
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def _prediction_text(prediction: Mapping[str, Any]) -> str:
    text = prediction.get("prediction", "")
    return str(_first(text)) if text is not None else ""


def _index(detail: Mapping[str, Any], position: int) -> int:
    # example_abbr is "<dataset abbr>_<index in the dataset>" (BaseDataset numbers the items).
    _, _, tail = str(detail.get("example_abbr", "")).rpartition("_")
    return int(tail) if tail.isdigit() else position


def _error_samples(
    items: list[BenchmarkItem | None], details: list[dict[str, Any]], predictions: list[dict[str, Any]]
) -> list[ErrorSample]:
    errors: list[ErrorSample] = []
    for position, detail in enumerate(details):
        if _is_correct(detail):
            continue
        i = _index(detail, position)
        item = items[i] if i < len(items) else None
        prediction = predictions[i] if i < len(predictions) else {}
        # The evaluator's pred is what was compared; predictions/ has the raw text as a fallback.
        output = _first(detail.get("pred", detail.get("predictions")))
        if output is None:
            output = _prediction_text(prediction)
        gold = _first(detail.get("answer", detail.get("references")))
        question = item.question if item is not None else str(prediction.get("origin_prompt", ""))
        errors.append(ErrorSample(
            question=question,
            gold=str(gold if gold is not None else (item.answer if item is not None else "")),
            model_output="" if output is None else str(output),
        ))
    return errors


def _to_unit_scale(value: float) -> float:
    # OpenCompass reports percentages; lm-eval (and so ftbus's summaries and baselines) 0-1.
    return value / 100.0


def parse_opencompass_output(output_dir: Path, spec: BenchmarkSpec, manifest: SplitManifest,
                             max_error_samples: int = 10, seed: int = 0) -> BenchmarkScores:
    """Turn one OpenCompass run into ``BenchmarkScores``, keyed like the lm-eval backend's.

    The newest ``<ts>/summary/*.csv`` says which subsets scored what (score column: the first not
    in dataset/version/metric/mode). The summary rounds to two decimals, so each value is taken
    from ``results/<model>/<abbr>.json`` when it holds the same metric unrounded. Error samples pair
    the results' per-item details with ``predictions/``; at most ``max_error_samples`` over all
    subsets, drawn with ``random.Random(seed)`` (the reference's were unseeded).
    """
    run = find_run_dir(output_dir)
    table = read_summary(run)

    summary: dict[str, dict[str, float]] = {}
    errors: list[ErrorSample] = []
    for subset, ids in evaluated_subsets(spec, manifest):
        abbr = dataset_abbr(spec, subset.name)
        if abbr not in table:
            raise OpenCompassOutputError(f"{run.name}: the summary has no scores for {abbr} (subset {subset.name})")
        results_path = _find_json(run, "results", abbr)
        if results_path is None:
            raise OpenCompassOutputError(f"{run.name}: no results/<model>/{abbr}.json")
        results = _read_json(results_path)
        if not isinstance(results, dict):
            raise OpenCompassOutputError(f"{results_path} is not an OpenCompass results object")
        metrics: dict[str, float] = {}
        for metric, rounded in table[abbr].items():
            exact = results.get(metric)
            value = float(exact) if isinstance(exact, int | float) and not isinstance(exact, bool) else rounded
            metrics[metric] = _to_unit_scale(value)
        if spec.primary_metric not in metrics:
            raise OpenCompassOutputError(f"{abbr} reports {sorted(metrics)}, not {spec.primary_metric}")
        summary[subset.name] = metrics
        details = _details(results)
        if len(details) != len(ids):
            raise OpenCompassOutputError(f"{abbr}: {len(details)} evaluated items for {len(ids)} in the split")
        # The split's items in run order give each error its question and gold (looked up by id,
        # not re-validated: a changed benchmark must not turn a finished run into a crash).
        by_id = {item.id: item for item in spec.items(subset.name)}
        items = [by_id.get(item_id) for item_id in ids]
        errors.extend(_error_samples(items, details, _predictions(run, abbr)))

    return assemble_scores(spec, manifest, summary, errors, max_error_samples, seed)
