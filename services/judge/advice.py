"""The judge's advice: the feedback prose written from the facts, per failure category.

The reference's LLM says what failed (Timeout, OOM, CUDA, Config or Data), what was expected, and
what to change in the configuration. :func:`rules_feedback` writes the same four fields from the
facts alone (``services/judge/facts.py``): it is the feedback of record when no LLM is configured
or it is unavailable, and for a pre-check failure. It never decides: the decision is the rules'
(``rules.py``) and the policy's (``decide.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from services.judge.condense import CondensedLog
from services.judge.facts import JudgeFacts
from services.judge.rules import train_of
from shared.events import BenchResult, FailedStage, Feedback, TrainingMetrics
from shared.paired import describe_with_power
from shared.statistics import PairedComparison
from shared.untrusted import fenced

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
_UNUSED_KEYS = re.compile(r"Some keys are not used by the HfArgumentParser: (\[.*?\])")


# ---------------------------------------------------------------- failure taxonomy


def classify_failure(facts: JudgeFacts) -> Category:
    """The reference's taxonomy: Timeout, OOM, CUDA, Config or Data."""
    if facts.failed_stage == FailedStage.precheck:
        return "Config"
    condensed = facts.condensed
    if facts.outcome.timed_out or condensed.timeout:
        return "Timeout"
    if condensed.cuda_oom or facts.outcome.oom_killed:
        return "OOM"
    text = _error_text(facts)
    if _CUDA_PATTERNS.search(text):
        return "CUDA"
    if facts.failed_stage == FailedStage.data_processing or _DATA_PATTERNS.search(text):
        return "Data"
    return "Config"


def _error_text(facts: JudgeFacts) -> str:
    return "\n".join(filter(None, [facts.condensed.error, facts.event.error]))


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


def _num(config: Mapping[str, Any], key: str) -> float | None:
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


def _config_summary(config: Mapping[str, Any]) -> str:
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


def _benchmark_lines(event: BenchResult, paired: PairedComparison | None = None) -> list[str]:
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
    if paired is not None:
        # What the comparison could have found, too: "not distinguishable" on 40 items means little.
        lines.append(f"Paired over the same items, the candidate is {describe_with_power(paired)}.")
    elif base and base.summary:
        lines.append(f"{base.summary[0].upper()}{base.summary[1:]}.")
    quote = error_sample_quote(event)
    if quote:
        lines.append(quote)
    return lines


#: How much of one error sample's output the feedback quotes.
QUOTED_OUTPUT_CHARS = 200


def error_sample_quote(event: BenchResult) -> str | None:
    """The first error sample, its output quoted inside a fence: the feedback goes to an agent whose
    own LLM reads it, and the output is the fine-tuned model's text (it may address that LLM)."""
    samples = event.benchmark.error_samples if event.benchmark else []
    if not samples:
        return None
    first = samples[0]
    output = fenced("the fine-tuned model's output, untrusted data", first.model_output[:QUOTED_OUTPUT_CHARS])
    return f"{len(samples)} error samples recorded; e.g. gold {first.gold[:120]!r}, model output:\n{output}"


def _expectation(facts: JudgeFacts) -> str:
    stage, event, timeout_s = facts.failed_stage, facts.event, facts.outcome.timeout_s
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


def _data_advice(facts: JudgeFacts) -> list[str]:
    stats, config = facts.event.data.data_stats, facts.config
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


def _oom_advice(facts: JudgeFacts) -> list[str]:
    config = facts.config
    advice = []
    if facts.outcome.oom_killed and not facts.condensed.cuda_oom:
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


def _timeout_advice(facts: JudgeFacts) -> list[str]:
    stage, config, timeout_s = facts.failed_stage, facts.config, facts.outcome.timeout_s
    limit = f"its {timeout_s:g} s limit" if timeout_s else "its time limit"
    if stage == FailedStage.data_processing:
        return [
            f"Data processing hit {limit}. That is usually slow LLM API generation (one long "
            "chain-of-thought call per sample): generate fewer samples, call the API concurrently with "
            "bounded parallelism, use a faster model from the weak pool for bulk work, cap max_tokens, "
            "and write partial results early."
        ]
    if stage == FailedStage.training:
        last = facts.condensed.last_progress
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


def _config_advice(text: str, config: Mapping[str, Any]) -> list[str]:
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


def _code_text(facts: JudgeFacts, category: Category | None) -> str:
    event, config, stage = facts.event, facts.config, facts.failed_stage
    parts = [facts.config_problem + "." if facts.config_problem else _config_summary(config)]
    if stage == FailedStage.precheck:
        parts.append(f"Fix the workspace: {event.error or 'see the pre-check error'}; nothing else was assessed.")
    elif category == "Timeout":
        parts.extend(_timeout_advice(facts))
    elif category == "OOM":
        parts.extend(_oom_advice(facts))
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
        parts.extend(_config_advice(_error_text(facts), config))
    if (train := train_of(event)) is not None:
        parts.extend(_loss_advice(train.training_metrics))
    parts.extend(_data_advice(facts))
    if facts.rules.decision and len(parts) == 1:
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


def rules_feedback(facts: JudgeFacts) -> Feedback:
    """Feedback written from the facts alone, in the reference's four fields.

    ``final_decision`` is the rules' decision; the policy (``decide.py``) may still turn it false.
    """
    event, rules, stage, condensed = facts.event, facts.rules, facts.failed_stage, facts.condensed

    if rules.decision and isinstance(event, BenchResult):  # only a benchmark result can pass
        training = _training_facts(event.train.training_metrics, condensed)
        primary = event.benchmark.primary_metric if event.benchmark else None
        value = event.benchmark.primary_value if event.benchmark else None
        execution = (
            "SUCCESS: data processing, training and the validation benchmark completed. "
            + (f"Training: {training}. " if training else "")
            + f"Model files: {', '.join(facts.model_files)}. "
            + (f"Validation {primary} = {_fmt(value)}." if primary and value is not None else "")
        ).strip()
        intro = f"Validation benchmark {event.context.task.benchmark} produced results:"
        return_checking = "\n".join([intro, *_benchmark_lines(event, facts.paired)])
        code = _code_text(facts, None)
        return Feedback(execution=execution, return_checking=return_checking, code=code, final_decision=True)

    category = classify_failure(facts)
    if stage == FailedStage.precheck:
        what = f"the workspace pre-check rejected it, nothing was run: {event.error or 'no reason given'}"
    else:
        what = rules.failed_criteria[0]
        cause = headline(condensed)
        if cause:
            what += f". Error: {cause}"
        if facts.stage_report and facts.stage_report not in what:
            # The stage's own diagnosis (e.g. "data.json is empty"), when it adds to the exit code.
            what += f". Stage report: {facts.stage_report[:400]}"
    execution = f"FAILED with category [{category}]: {what}"

    got = ["Got: " + "; ".join(rules.failed_criteria) + "."]
    if condensed.training_started:
        metrics = train.training_metrics if (train := train_of(event)) is not None else TrainingMetrics()
        training = _training_facts(metrics, condensed)
        if training:
            got.append(f"Training had started: {training}.")
    if isinstance(event, BenchResult):
        got.extend(_benchmark_lines(event, facts.paired))
    return_checking = "\n".join([_expectation(facts), *got])
    code = _code_text(facts, category)
    return Feedback(execution=execution, return_checking=return_checking, code=code, final_decision=False)
