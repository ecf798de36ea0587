"""The deterministic judge: decision from facts, feedback in the reference's four fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.judge.advice import classify_failure, rules_feedback
from services.judge.facts import JudgeFacts, collect_facts, default_log_stage
from services.judge.rules import rules_decision
from shared.events import DataResult, EvalLossPoint, FailedStage, LossHistory, TrainingMetrics, TrainLossPoint
from shared.settings import Settings
from tests.fakes import judge_events as ev
from tests.fakes.judge_events import CONFIG_LOG, DATA_LOG, NCCL_LOG, OOM_LOG


def _facts(event, log: str = "") -> JudgeFacts:  # type: ignore[no-untyped-def]
    """The facts as the judge collects them, with ``log`` as the log of the stage it reads."""
    stage = default_log_stage(event, rules_decision(event).failed_stage)
    train_yaml = "" if isinstance(event, DataResult) else event.train.train_yaml
    return collect_facts(event, train_yaml, {stage: log} if stage else {}, Settings())


def _judge_parts(event, log: str = ""):  # type: ignore[no-untyped-def]
    facts = _facts(event, log)
    return facts.rules, rules_feedback(facts)


def test_success_requires_every_criterion() -> None:
    rules, fb = _judge_parts(ev.bench_result(), "Training completed.\n")
    assert rules.decision and rules.failed_criteria == [] and rules.failed_stage is None
    assert rules.exit_code == 0
    assert fb.final_decision
    assert fb.execution.startswith("SUCCESS")
    assert "adapter_model.safetensors" in fb.execution and "gsm8k/accuracy = 0.52" in fb.execution
    assert "gsm8k: accuracy=0.52" in fb.return_checking
    assert "0.45" in fb.return_checking and "+0.07" in fb.return_checking


def test_precheck_failure_is_immediate() -> None:
    event = ev.precheck_failed("unsafe path in workspace: ../../etc/passwd")
    rules = rules_decision(event)
    assert not rules.decision and rules.failed_stage == FailedStage.precheck and rules.exit_code is None
    fb = rules_feedback(_facts(event))
    assert not fb.final_decision
    assert fb.execution.startswith("FAILED with category [Config]")
    assert "../../etc/passwd" in fb.execution and "nothing was run" in fb.execution


def test_data_timeout() -> None:
    event = ev.data_failed(124, "generating sample 17/2000 with gpt-4o-mini\n")
    rules, fb = _judge_parts(event, "generating sample 17/2000 with gpt-4o-mini\n")
    assert not rules.decision and rules.timed_out
    assert "data processing (process_data.py) timed out after 3600 s (exit code 124)" in rules.failed_criteria
    assert "training did not run" in rules.failed_criteria
    assert fb.execution.startswith("FAILED with category [Timeout]")
    assert "process_data.py to exit 0 within 3600 s" in fb.return_checking
    assert "LLM API" in fb.code and "concurrently" in fb.code
    assert not fb.final_decision


def test_data_script_crash_is_data() -> None:
    event = ev.data_failed(1, DATA_LOG)
    _rules, fb = _judge_parts(event, DATA_LOG)
    assert fb.execution.startswith("FAILED with category [Data]")
    assert "KeyError: 'answer_text'" in fb.execution
    assert "data.json" in fb.code


def test_data_stage_report_is_kept() -> None:
    event = ev.data_failed(0, "done\n", error="data.json is an empty list")
    _, fb = _judge_parts(event, "done\n")
    assert "data.json is an empty list" in fb.execution


def test_cuda_oom_suggests_smaller_batch_and_cutoff() -> None:
    event = ev.train_failed(1, OOM_LOG)
    rules, fb = _judge_parts(event, OOM_LOG)
    assert rules.failed_stage == FailedStage.training
    assert "training exited with code 1" in rules.failed_criteria
    assert "no model files in the training output" in rules.failed_criteria
    assert fb.execution.startswith("FAILED with category [OOM]")
    assert "torch.OutOfMemoryError: CUDA out of memory" in fb.execution
    # Concrete numbers from train.yaml: batch 8 -> 4, accumulation 2 -> 4, cutoff 4096 -> 2048.
    assert "per_device_train_batch_size from 8 to 4" in fb.code
    assert "gradient_accumulation_steps from 2 to 4" in fb.code
    assert "cutoff_len from 4096" in fb.code
    assert "last progress" in fb.return_checking


def test_sigkill_is_host_oom() -> None:
    event = ev.train_failed(137, "")
    _rules, fb = _judge_parts(event, "")
    assert fb.execution.startswith("FAILED with category [OOM]")
    assert "SIGKILL" in fb.code and "host" in fb.code


def test_config_error_names_unknown_keys() -> None:
    event = ev.train_failed(1, CONFIG_LOG)
    _, fb = _judge_parts(event, CONFIG_LOG)
    assert fb.execution.startswith("FAILED with category [Config]")
    assert "['lora_rnk']" in fb.code


def test_nccl_error_is_cuda() -> None:
    event = ev.train_failed(1, NCCL_LOG)
    assert classify_failure(_facts(event, NCCL_LOG)) == "CUDA"


def test_training_without_model_files_fails() -> None:
    event = ev.bench_result(model_files=[])
    rules = rules_decision(event)
    assert not rules.decision
    assert rules.failed_criteria == ["no model files in the training output"]


def test_empty_benchmark_fails() -> None:
    event = ev.bench_result(benchmark=ev.scores(accuracy={}))
    rules, fb = _judge_parts(event)
    assert not rules.decision and rules.failed_stage == FailedStage.benchmark
    assert "produced no results" in rules.failed_criteria[0]
    assert not fb.final_decision and fb.execution.startswith("FAILED")
    # A dataset entry with no metrics is no result either.
    assert not rules_decision(ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {}}))).decision


def test_failed_benchmark() -> None:
    log = 'Traceback (most recent call last):\n  File "x.py", line 1\nOSError: adapter_config.json not found\n'
    event = ev.bench_result(ok=False, exit_code=1, log=log)
    rules, fb = _judge_parts(event, log)
    assert rules.failed_criteria == ["the validation benchmark exited with code 1"]
    assert "OSError: adapter_config.json not found" in fb.execution
    assert "gsm8k" in fb.return_checking


def test_test_split_is_refused() -> None:
    with pytest.raises(ValueError, match="validation"):
        rules_decision(ev.bench_result(split="test"))


def test_loss_shapes_advice_never_the_decision() -> None:
    event = ev.bench_result()
    train = [TrainLossPoint(step=i, loss=2.0 - 0.001 * i) for i in range(1, 30)]
    evals = [
        EvalLossPoint(step=10, eval_loss=0.8),
        EvalLossPoint(step=20, eval_loss=0.7),
        EvalLossPoint(step=30, eval_loss=1.2),
    ]
    event.train.training_metrics = TrainingMetrics.from_history(LossHistory(train=train, eval=evals))
    rules, fb = _judge_parts(event)
    assert rules.decision and fb.final_decision
    assert "overfitting" in fb.code and "barely moved" in fb.code

    event.train.training_metrics = TrainingMetrics.from_history(
        LossHistory(train=[TrainLossPoint(step=1, loss=2.0), TrainLossPoint(step=2, loss=float("nan"))])
    )
    rules, fb = _judge_parts(event)
    assert rules.decision and fb.final_decision and "NaN" in fb.code


def test_below_baseline_is_advice_only() -> None:
    event = ev.bench_result(benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.30}}))
    rules, fb = _judge_parts(event)
    assert rules.decision and fb.final_decision
    assert "does not beat the base model" in fb.code


def test_rules_do_not_mutate_the_event() -> None:
    event = ev.bench_result(n_loss=200)
    before = event.model_dump()
    _judge_parts(event, "Training completed.\n")
    assert event.model_dump() == before


# ---------------------------------------------------------------- real LlamaFactory logs

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.mark.parametrize(
    ("name", "exit_code", "category", "advice"),
    [
        ("train_bad_key.log", 1, "Config", "Remove the parameters LlamaFactory does not know: ['lora_rnak']"),
        ("train_missing_dataset.log", 1, "Data", "Fix the data pipeline"),
        ("train_timeout.log", 124, "Timeout", "Training hit its 360000 s limit (last progress:"),
    ],
)
def test_real_training_failures(name: str, exit_code: int, category: str, advice: str) -> None:
    path = LOGS / name
    assert path.is_file(), f"the committed log fixture {name} is missing (tests/fixtures/logs/README.md)"
    log = path.read_bytes().decode("utf-8")
    event = ev.train_failed(exit_code, log[-20000:])
    rules, fb = _judge_parts(event, log)
    assert not rules.decision and not fb.final_decision
    assert fb.execution.startswith(f"FAILED with category [{category}]")
    assert advice in fb.code
