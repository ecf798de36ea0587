"""The deterministic judge: decides from facts (exit codes, files, results), writes plain feedback.

The reference let the LLM decide facts that a program can check (REFERENCE §10.4). Here the rules'
decision is always computed, and the final decision can never be true when one of them fails.
``rules_feedback`` is also the feedback of record when no LLM is configured or it is unavailable,
so it aims to say what the reference's LLM would: the failure category, what was expected, and
concrete configuration advice.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from services.judge.condense import TIMEOUT_EXIT, CondensedLog
from shared.events import (
    BenchResult,
    DataResult,
    FailedStage,
    Feedback,
    StageOutcome,
    TrainingMetrics,
    TrainResult,
)

JudgedEvent = DataResult | TrainResult | BenchResult
Category = Literal["Timeout", "OOM", "CUDA", "Config", "Data"]

_CUDA_PATTERNS = re.compile(
    r"CUDA error|NCCL|cuDNN|cuBLAS|CUBLAS_STATUS|no CUDA GPUs|CUDA driver|CUDA_VISIBLE_DEVICES"
    r"|device-side assert|nvidia-smi|torch\.cuda\.is_available|ProcessGroupNCCL|illegal memory access",
    re.IGNORECASE,
)
_DATA_PATTERNS = re.compile(
    r"dataset_info|data\.json|JSONDecodeError|Cannot find valid samples|No valid samples|"
    r"Undefined dataset|dataset .* not found|KeyError: '(instruction|input|output|prompt|query|response|"
    r"messages|conversations)'|empty dataset|num_samples=0|Expecting value",
    re.IGNORECASE,
)
_MISSING_PATH = re.compile(
    r"No such file or directory|does not appear to have a file|not a valid model identifier|Can't load"
)
_RESTATES_EXIT = re.compile(r"exit(?:ed)?(?: with)? (?:code|status)|timed out", re.IGNORECASE)
_UNUSED_KEYS = re.compile(r"Some keys are not used by the HfArgumentParser: (\[.*?\])")


class RulesOutcome(BaseModel):
    """The deterministic decision and why."""

    model_config = ConfigDict(extra="forbid")

    decision: bool
    failed_criteria: list[str]
    failed_stage: FailedStage | None
    exit_code: int | None
    timed_out: bool


# ---------------------------------------------------------------- facts shared with the prompt


def failed_stage_of(event: JudgedEvent) -> FailedStage | None:
    """Where the request stopped; an empty benchmark counts as a benchmark failure."""
    if event.failed_stage is not None:
        return event.failed_stage
    if isinstance(event, DataResult):
        return None if event.ok else FailedStage.data_processing
    if isinstance(event, TrainResult):
        return None if event.ok else FailedStage.training
    if not event.ok or not _has_results(event):
        return FailedStage.benchmark
    return None


def outcome_of(event: JudgedEvent, stage: FailedStage | None = None) -> StageOutcome | None:
    """The run of the stage that failed, or of the event's own stage."""
    stage = stage or failed_stage_of(event)
    if stage == FailedStage.data_processing:
        return event.data.outcome
    if stage == FailedStage.training and not isinstance(event, DataResult):
        return event.train.outcome
    if stage == FailedStage.precheck:
        return None
    if isinstance(event, DataResult):
        return event.data.outcome
    if isinstance(event, TrainResult):
        return event.train.outcome
    return event.outcome


def exit_code_of(event: JudgedEvent) -> int | None:
    """The failing stage's exit code (0 for a success); None when nothing ran (pre-check)."""
    stage = failed_stage_of(event)
    if stage == FailedStage.precheck:
        return None
    outcome = outcome_of(event, stage)
    if outcome is not None:
        return outcome.exit_code
    return 0 if stage is None else 1


def model_files_of(event: JudgedEvent) -> list[str]:
    return [] if isinstance(event, DataResult) else list(event.train.model_files)


def _has_results(event: BenchResult) -> bool:
    summary = event.benchmark.accuracy_summary if event.benchmark else {}
    return any(metrics for metrics in summary.values())


# ---------------------------------------------------------------- decision


def _stage_failure(name: str, outcome: StageOutcome | None, error: str | None) -> str:
    if outcome is not None and (outcome.timed_out or outcome.exit_code == TIMEOUT_EXIT):
        limit = f" after {outcome.timeout_s:g} s" if outcome.timeout_s else ""
        return f"{name} timed out{limit} (exit code {outcome.exit_code})"
    if outcome is not None and outcome.exit_code != 0:
        return f"{name} exited with code {outcome.exit_code}"
    return f"{name} failed: {error}" if error else f"{name} failed"


def restates_exit(error: str | None) -> bool:
    """True when a stage's error message says no more than its exit code or timeout."""
    return bool(error and _RESTATES_EXIT.search(error))


def rules_decision(event: JudgedEvent) -> RulesOutcome:
    """True iff every stage exited 0, the model files exist and the benchmark produced results."""
    if isinstance(event, BenchResult) and event.split != "validation":
        # The judge must never see the hidden test split; refuse rather than leak it.
        raise ValueError("the judge only accepts validation benchmark results")
    failed: list[str] = []
    stage = failed_stage_of(event)

    if stage == FailedStage.precheck:
        failed.append(f"pre-check failed: {event.error or 'workspace rejected'}")
        failed.append("nothing was run")
        return RulesOutcome(decision=False, failed_criteria=failed, failed_stage=stage, exit_code=None, timed_out=False)

    data_out = event.data.outcome
    if isinstance(event, DataResult) or stage == FailedStage.data_processing:
        failed.append(_stage_failure("data processing (process_data.py)", data_out, event.error))
    elif data_out is not None and data_out.exit_code != 0:
        failed.append(_stage_failure("data processing (process_data.py)", data_out, None))

    if isinstance(event, DataResult):
        failed.append("training did not run")
    else:
        train_out = event.train.outcome
        if stage == FailedStage.training:
            failed.append(_stage_failure("training", train_out, event.error))
        elif train_out is not None and train_out.exit_code != 0:
            failed.append(_stage_failure("training", train_out, None))
        elif train_out is None and not event.train.model_files:
            failed.append("training did not run")

    if not model_files_of(event):
        failed.append("no model files in the training output")

    if not isinstance(event, BenchResult):
        failed.append("the validation benchmark did not run")
    elif not event.ok or (event.outcome is not None and event.outcome.exit_code != 0):
        failed.append(_stage_failure("the validation benchmark", event.outcome, event.error))
    elif not _has_results(event):
        failed.append("the validation benchmark produced no results (empty accuracy_summary)")

    outcome = outcome_of(event, stage)
    return RulesOutcome(
        decision=not failed,
        failed_criteria=failed,
        failed_stage=stage,
        exit_code=exit_code_of(event),
        timed_out=bool(outcome and (outcome.timed_out or outcome.exit_code == TIMEOUT_EXIT)),
    )


# ---------------------------------------------------------------- failure taxonomy


def classify_failure(event: JudgedEvent, condensed: CondensedLog | None) -> Category:
    """The reference's taxonomy: Timeout, OOM, CUDA, Config or Data."""
    stage = failed_stage_of(event)
    outcome = outcome_of(event, stage)
    if (outcome and outcome.timed_out) or (condensed and condensed.timeout):
        return "Timeout"
    if condensed and (condensed.cuda_oom or condensed.oom_killed):
        return "OOM"
    text = "\n".join(filter(None, [condensed.error if condensed else None, event.error]))
    if _CUDA_PATTERNS.search(text):
        return "CUDA"
    if stage == FailedStage.data_processing or _DATA_PATTERNS.search(text):
        return "Data"
    return "Config"


def headline(condensed: CondensedLog | None, error: str | None = None) -> str | None:
    """The root exception line of the condensed error (the first one of a chain)."""
    source = condensed.error if condensed and condensed.error else error
    if not source:
        return None
    for line in source.splitlines():
        s = line.strip()
        if (
            not s
            or line.startswith((" ", "\t"))
            or s.startswith(("Traceback", "[Note:", "Root cause:", "During handling", "The above exception"))
            or s == "..."
        ):
            continue
        return s[:400]
    return source.strip().splitlines()[-1][:400]


# ---------------------------------------------------------------- feedback text


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def parse_train_yaml(train_yaml: str | None) -> tuple[dict[str, Any], str | None]:
    """The config as a dict, or an empty dict and why it could not be read."""
    if not train_yaml or not train_yaml.strip():
        return {}, "train.yaml is empty or missing"
    try:
        config = yaml.safe_load(train_yaml)
    except yaml.YAMLError as exc:
        return {}, f"train.yaml is not valid YAML: {str(exc).splitlines()[0]}"
    if not isinstance(config, dict):
        return {}, "train.yaml is not a mapping of parameters"
    return config, None


def _num(config: dict[str, Any], key: str) -> float | None:
    value = config.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _config_summary(config: dict[str, Any]) -> str:
    keys = (
        "model_name_or_path", "stage", "finetuning_type", "lora_rank", "template", "dataset", "cutoff_len",
        "max_samples", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
        "num_train_epochs", "max_steps", "bf16", "fp16", "quantization_bit", "deepspeed",
    )  # fmt: skip
    parts = [f"{k}={config[k]}" for k in keys if k in config]
    return "Config: " + (", ".join(parts) if parts else "no recognised training parameters") + "."


def _training_facts(metrics: TrainingMetrics, condensed: CondensedLog | None) -> str:
    parts = []
    if condensed and condensed.num_examples is not None:
        parts.append(f"{condensed.num_examples} examples")
    if condensed and condensed.num_epochs is not None:
        parts.append(f"{condensed.num_epochs:g} epochs")
    train = metrics.loss_history.train
    if train:
        parts.append(
            f"train loss {_fmt(metrics.initial_loss)} -> {_fmt(metrics.final_loss)} "
            f"over {len(train)} logged steps (last step {train[-1].step})"
        )
    if condensed and condensed.final_metrics and "train_runtime" in condensed.final_metrics:
        parts.append(f"train_runtime {condensed.final_metrics['train_runtime']:.0f} s")
    elif condensed and condensed.last_progress and not condensed.completed:
        parts.append(f"last progress {condensed.last_progress}")
    return ", ".join(parts)


def _benchmark_lines(event: BenchResult) -> list[str]:
    scores = event.benchmark
    if scores is None:
        return []
    lines = []
    for dataset, metrics in scores.accuracy_summary.items():
        shown = ", ".join(f"{m}={_fmt(v)}" for m, v in metrics.items())
        lines.append(f"{dataset}: {shown}" if shown else f"{dataset}: no metrics")
    if scores.primary_metric and scores.primary_value is not None:
        direction = "higher" if scores.higher_is_better else "lower"
        lines.append(f"Primary metric {scores.primary_metric} = {_fmt(scores.primary_value)} ({direction} is better).")
    base = event.baseline
    if base and base.baseline_value is not None and base.candidate_value is not None:
        diff = base.difference if base.difference is not None else base.candidate_value - base.baseline_value
        lines.append(f"Base model on the same validation split: {_fmt(base.baseline_value)}; difference {diff:+.4g}.")
    if scores.error_samples:
        first = scores.error_samples[0]
        lines.append(
            f"{len(scores.error_samples)} error samples recorded; e.g. gold {first.gold[:120]!r}, "
            f"model output {first.model_output[:200]!r}."
        )
    return lines


def _expectation(stage: FailedStage | None, event: JudgedEvent, timeout_s: float | None) -> str:
    limit = f" within {timeout_s:g} s" if timeout_s else ""
    if stage == FailedStage.precheck:
        return "Expected: a workspace with train.yaml and only relative paths inside it."
    if stage == FailedStage.data_processing:
        return (
            f"Expected: process_data.py to exit 0{limit} and write data.json, a non-empty list of records "
            "in the format dataset_info.json declares."
        )
    if stage == FailedStage.training:
        return (
            f"Expected: `llamafactory-cli train train.yaml` to exit 0{limit} and write model files "
            "(adapter_model.safetensors or model*.safetensors) to output/."
        )
    return (
        f"Expected: the validation benchmark ({event.context.task.benchmark}) to load the trained model"
        f"{limit} and report accuracy for each dataset."
    )


def _loss_advice(metrics: TrainingMetrics) -> list[str]:
    """Loss trends shape the advice only; they never change the decision."""
    advice = []
    train = metrics.loss_history.train
    losses = [p.loss for p in train]
    if any(not math.isfinite(v) for v in losses):
        advice.append(
            "The training loss became NaN/inf: lower learning_rate (e.g. by 10x), use bf16 rather than fp16, "
            "and check for empty or malformed samples."
        )
    elif len(losses) >= 2 and metrics.initial_loss and metrics.final_loss is not None:
        drop = (metrics.initial_loss - metrics.final_loss) / abs(metrics.initial_loss)
        if drop < 0.02:
            advice.append(
                "The training loss barely moved "
                f"({_fmt(metrics.initial_loss)} -> {_fmt(metrics.final_loss)}): raise learning_rate or "
                "num_train_epochs, or check that the template matches the base model."
            )
        elif metrics.final_loss < 0.05:
            advice.append(
                f"The training loss fell to {_fmt(metrics.final_loss)}: the model may be memorising the "
                "data; consider fewer epochs, more diverse data, or a validation split (val_size) to watch "
                "eval_loss."
            )
    evals = metrics.loss_history.eval
    if len(evals) >= 2:
        best = min(evals, key=lambda p: p.eval_loss)
        last = evals[-1]
        if last.eval_loss > best.eval_loss * 1.05 and last.step != best.step:
            advice.append(
                f"eval_loss rose from its minimum {_fmt(best.eval_loss)} (step {best.step}) to "
                f"{_fmt(last.eval_loss)} (step {last.step}): overfitting; stop earlier (fewer epochs) "
                "or lower the learning rate."
            )
    return advice


def _data_advice(event: JudgedEvent, config: dict[str, Any]) -> list[str]:
    stats = event.data.data_stats
    if stats is None:
        return []
    advice = []
    cutoff = _num(config, "cutoff_len")
    longest = max((c.p99_tokens for c in stats.token_stats.values()), default=0)
    if cutoff and longest > cutoff:
        advice.append(
            f"p99 sample length is about {longest} tokens, above cutoff_len={cutoff:g}: long samples are "
            "truncated; raise cutoff_len if memory allows, or shorten the samples."
        )
    # An empty alpaca `input` (or `system`/`history`) is normal; an empty prompt or answer is not.
    optional = {"input", "system", "history", "query"}
    empty = {
        name: c.empty_count for name, c in stats.token_stats.items() if c.empty_count and name not in optional
    }
    if empty:
        advice.append(f"Some columns have empty values {empty}: filter them out in process_data.py.")
    if stats.total_samples < 50:
        advice.append(f"Only {stats.total_samples} training samples: generate or select more data.")
    return advice


def _oom_advice(config: dict[str, Any], condensed: CondensedLog | None) -> list[str]:
    advice = []
    if condensed and condensed.oom_killed and not condensed.cuda_oom:
        advice.append(
            "The process was killed by SIGKILL (exit 137), typically the kernel OOM killer running out of "
            "host RAM: lower preprocessing_num_workers / dataloader_num_workers, stream the data instead "
            "of loading it all, or free memory in process_data.py."
        )
    batch = _num(config, "per_device_train_batch_size")
    accum = _num(config, "gradient_accumulation_steps") or 1
    if batch and batch > 1:
        new = max(1, int(batch) // 2)
        advice.append(
            f"Lower per_device_train_batch_size from {batch:g} to {new} and raise "
            f"gradient_accumulation_steps from {accum:g} to {accum * batch / new:g} to keep the effective "
            "batch size."
        )
    cutoff = _num(config, "cutoff_len")
    if cutoff and cutoff > 1024:
        advice.append(f"Lower cutoff_len from {cutoff:g} (e.g. to {int(cutoff) // 2}).")
    if str(config.get("finetuning_type", "lora")).lower() == "full":
        advice.append("Switch finetuning_type from full to lora: far less optimizer state.")
    elif "quantization_bit" not in config:
        advice.append("Use QLoRA (quantization_bit: 4) to shrink the base model's weights.")
    if config.get("disable_gradient_checkpointing"):
        advice.append("Remove disable_gradient_checkpointing: checkpointing trades compute for memory.")
    advice.append("If none of this is enough, pick a smaller base model or use DeepSpeed ZeRO-3.")
    return advice


def _timeout_advice(
    stage: FailedStage | None, config: dict[str, Any], condensed: CondensedLog | None, timeout_s: float | None
) -> list[str]:
    limit = f"its {timeout_s:g} s limit" if timeout_s else "its time limit"
    if stage == FailedStage.data_processing:
        return [
            f"Data processing hit {limit}. That is usually slow LLM API generation (one long "
            "chain-of-thought call per sample): generate fewer samples, call the API concurrently with "
            "bounded parallelism, use a faster model from the weak pool for bulk work, cap max_tokens, "
            "and write partial results early."
        ]
    if stage == FailedStage.training:
        last = condensed.last_progress if condensed else None
        progress = f" (last progress: {last})" if last else ""
        advice = [f"Training hit {limit}{progress}."]
        parts = []
        if (_num(config, "num_train_epochs") or 0) > 1:
            parts.append(f"fewer num_train_epochs (now {config['num_train_epochs']})")
        if "max_samples" not in config:
            parts.append("a max_samples cap")
        if (_num(config, "cutoff_len") or 0) > 1024:
            parts.append(f"a shorter cutoff_len (now {config['cutoff_len']})")
        parts.append("or max_steps sized to the time limit")
        advice.append("Shorten the run: " + ", ".join(parts) + ".")
        return advice
    return [
        f"The benchmark hit {limit}: generations are probably too long; make sure the fine-tuned model emits "
        "the end-of-turn token (template matching the base model) so generation stops."
    ]


def _config_advice(text: str, config: dict[str, Any]) -> list[str]:
    advice = []
    unused = _UNUSED_KEYS.search(text)
    if unused:
        advice.append(f"Remove the parameters LlamaFactory does not know: {unused.group(1)}.")
    if re.search(r"template", text, re.IGNORECASE):
        advice.append("Set `template` to the one matching the base model's chat format.")
    if _MISSING_PATH.search(text):
        advice.append(
            f"Check paths: model_name_or_path ({config.get('model_name_or_path', 'unset')}) must point to "
            "the base model under the assets' models/ folder, and dataset_dir to the workspace."
        )
    if not advice:
        advice.append("Fix the parameter or value named in the error, then re-run.")
    return advice


def _code_text(
    event: JudgedEvent,
    condensed: CondensedLog | None,
    rules: RulesOutcome,
    category: Category | None,
    train_yaml: str | None,
    timeout_s: float | None,
) -> str:
    config, problem = parse_train_yaml(train_yaml)
    parts = [problem + "." if problem else _config_summary(config)]
    stage = rules.failed_stage
    text = "\n".join(filter(None, [condensed.error if condensed else None, event.error]))
    if stage == FailedStage.precheck:
        parts.append(f"Fix the workspace: {event.error or 'see the pre-check error'}; nothing else was assessed.")
    elif category == "Timeout":
        parts.extend(_timeout_advice(stage, config, condensed, timeout_s))
    elif category == "OOM":
        parts.extend(_oom_advice(config, condensed))
    elif category == "CUDA":
        parts.append(
            "A CUDA/NCCL error points at the environment (driver, visible devices, communication), not at "
            "the candidate; a 'device-side assert' however usually means label ids outside the vocabulary, "
            "i.e. a template or tokenizer mismatch."
        )
    elif category == "Data":
        parts.append(
            "Fix the data pipeline: process_data.py must write data.json as a non-empty JSON list whose keys "
            "match the columns dataset_info.json declares, and train.yaml's dataset must name that entry."
        )
    elif category == "Config":
        parts.extend(_config_advice(text, config))
    if not isinstance(event, DataResult):
        parts.extend(_loss_advice(event.train.training_metrics))
    parts.extend(_data_advice(event, config))
    if rules.decision and len(parts) == 1:
        parts.append("No problem found in the configuration, the data statistics or the loss curve.")
    if isinstance(event, BenchResult) and event.baseline and event.baseline.difference is not None:
        higher_is_better = event.benchmark is None or event.benchmark.higher_is_better
        diff = event.baseline.difference
        if (diff <= 0) if higher_is_better else (diff >= 0):
            parts.append(
                "The candidate does not beat the base model on validation: revisit data quality and the "
                "learning rate before scaling up."
            )
    return "\n".join(parts)


def rules_feedback(
    event: JudgedEvent,
    condensed: CondensedLog | None,
    *,
    train_yaml: str | None = None,
    timeout_s: float | None = None,
) -> Feedback:
    """Feedback written from facts alone, in the reference's four fields."""
    rules = rules_decision(event)
    stage = rules.failed_stage
    if train_yaml is None:
        train_yaml = "" if isinstance(event, DataResult) else event.train.train_yaml
    if timeout_s is None:
        outcome = outcome_of(event, stage)
        timeout_s = outcome.timeout_s if outcome else None

    if rules.decision and isinstance(event, BenchResult):  # only a benchmark result can pass
        facts = _training_facts(event.train.training_metrics, condensed)
        primary = event.benchmark.primary_metric if event.benchmark else None
        value = event.benchmark.primary_value if event.benchmark else None
        execution = (
            "SUCCESS: data processing, training and the validation benchmark completed. "
            + (f"Training: {facts}. " if facts else "")
            + f"Model files: {', '.join(model_files_of(event))}. "
            + (f"Validation {primary} = {_fmt(value)}." if primary and value is not None else "")
        ).strip()
        intro = f"Validation benchmark {event.context.task.benchmark} produced results:"
        return_checking = "\n".join([intro, *_benchmark_lines(event)])
        code = _code_text(event, condensed, rules, None, train_yaml, timeout_s)
        return Feedback(execution=execution, return_checking=return_checking, code=code, final_decision=True)

    category: Category = "Config" if stage == FailedStage.precheck else classify_failure(event, condensed)
    if stage == FailedStage.precheck:
        what = f"the workspace pre-check rejected it, nothing was run: {event.error or 'no reason given'}"
    else:
        what = rules.failed_criteria[0]
        cause = headline(condensed)
        if cause:
            what += f". Error: {cause}"
        if event.error and not restates_exit(event.error) and event.error not in what:
            # The stage's own diagnosis (e.g. "data.json is empty"), when it adds to the exit code.
            what += f". Stage report: {event.error[:400]}"
    execution = f"FAILED with category [{category}]: {what}"

    got = ["Got: " + "; ".join(rules.failed_criteria) + "."]
    if condensed and condensed.training_started:
        metrics = TrainingMetrics() if isinstance(event, DataResult) else event.train.training_metrics
        facts = _training_facts(metrics, condensed)
        if facts:
            got.append(f"Training had started: {facts}.")
    if isinstance(event, BenchResult):
        got.extend(_benchmark_lines(event))
    return_checking = "\n".join([_expectation(stage, event, timeout_s), *got])
    code = _code_text(event, condensed, rules, category, train_yaml, timeout_s)
    return Feedback(execution=execution, return_checking=return_checking, code=code, final_decision=False)
