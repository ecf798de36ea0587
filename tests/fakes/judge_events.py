"""Builders of the events the judge receives, with realistic LlamaFactory-shaped content."""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime

from shared.events import (
    ArtifactRef,
    BaselineComparison,
    BenchmarkScores,
    BenchResult,
    ColumnStats,
    DataResult,
    DataStats,
    DataSummary,
    ErrorSample,
    EvalLossPoint,
    FailedStage,
    LossHistory,
    RequestContext,
    StageOutcome,
    StageRun,
    TaskSpec,
    Timeouts,
    TrainingMetrics,
    TrainLossPoint,
    TrainResult,
    TrainSummary,
    WorkspaceFile,
)

TRAIN_YAML = """\
### model
model_name_or_path: /assets/models/Qwen2.5-0.5B-Instruct
### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 16
lora_target: all
### dataset
dataset: processed_data
dataset_dir: .
template: qwen
cutoff_len: 4096
max_samples: 2000
overwrite_cache: true
preprocessing_num_workers: 8
### output
output_dir: ./output
logging_steps: 5
save_only_model: true
### train
per_device_train_batch_size: 8
gradient_accumulation_steps: 2
learning_rate: 1.0e-4
num_train_epochs: 3
lr_scheduler_type: cosine
bf16: true
per_device_eval_batch_size: 1
"""


STARTED = datetime(2025, 11, 30, 10, 0, tzinfo=UTC)


def ref(name: str, content: str = "") -> ArtifactRef:
    data = (content or name).encode()
    return ArtifactRef(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def context(timeouts: Timeouts | None = None) -> RequestContext:
    files = {"train.yaml": TRAIN_YAML, "process_data.py": "print('hi')\n", "dataset_info.json": "{}"}
    return RequestContext(
        task=TaskSpec(
            base_model="Qwen2.5-0.5B-Instruct",
            benchmark="gsm8k",
            description="Teach the model step-by-step grade-school arithmetic.",
            involving_datasets=["gsm8k-train"],
        ),
        workspace=[WorkspaceFile(path=p, ref=ref(f"req-1/{p}", c)) for p, c in files.items()],
        timeouts=timeouts or Timeouts(),
    )


def outcome(exit_code: int = 0, log_tail: str = "", timeout_s: float | None = None) -> StageOutcome:
    return StageOutcome(
        exit_code=exit_code,
        timed_out=exit_code == 124,
        duration_s=12.5,
        timeout_s=timeout_s,
        log_tail=log_tail,
    )


def data_stats() -> DataStats:
    col = ColumnStats(empty_count=0, min_tokens=12, max_tokens=900, p50_tokens=180, p99_tokens=640)
    return DataStats(total_samples=1234, token_stats={"instruction": col, "output": col}, tokenizer="cl100k_base")


def data_summary(exit_code: int = 0) -> DataSummary:
    return DataSummary(
        data=ref("req-1/data.json") if exit_code == 0 else None,
        data_stats=data_stats() if exit_code == 0 else None,
    )


def data_outcome(exit_code: int = 0, log_tail: str = "wrote 1234 samples to data.json\n") -> StageOutcome:
    return outcome(exit_code, log_tail, timeout_s=3600.0)


def runs(**outcomes: StageOutcome | None) -> dict[str, StageRun]:
    """The stages' runs as their workers stamp them, by record name, in pipeline order."""
    return {stage: StageRun(started_at=STARTED, attempt=1, outcome=out) for stage, out in outcomes.items()}


def loss_history(n_train: int = 20, n_eval: int = 3) -> LossHistory:
    train = [
        TrainLossPoint(step=5 * (i + 1), epoch=round(0.01 * (i + 1), 4), loss=round(2.0 * math.exp(-i / 40) + 0.3, 4))
        for i in range(n_train)
    ]
    evals = [EvalLossPoint(step=100 * (i + 1), epoch=float(i + 1), eval_loss=0.9 - 0.05 * i) for i in range(n_eval)]
    return LossHistory(train=train, eval=evals)


def train_outcome(exit_code: int = 0, log_tail: str = "") -> StageOutcome:
    return outcome(exit_code, log_tail, timeout_s=360000.0)


def train_summary(model_files: list[str] | None = None, n_loss: int = 20) -> TrainSummary:
    files = ["adapter_model.safetensors", "adapter_config.json"] if model_files is None else model_files
    return TrainSummary(
        model_kind="lora",
        model_files=files,
        outputs=[WorkspaceFile(path=f"output/{f}", ref=ref(f"req-1/output/{f}")) for f in files],
        training_metrics=TrainingMetrics.from_history(loss_history(n_loss) if n_loss else LossHistory()),
        train_yaml=TRAIN_YAML,
    )


def precheck_failed(error: str = "train.yaml is missing from the workspace") -> DataResult:
    return DataResult(
        request_id="req-1",
        ok=False,
        context=context(),
        data=DataSummary(),
        failed_stage=FailedStage.precheck,
        error=error,
        runs=runs(data_processing=None),
    )


def data_failed(exit_code: int = 1, log: str = "", error: str | None = None) -> DataResult:
    return DataResult(
        request_id="req-1",
        ok=False,
        context=context(),
        data=data_summary(exit_code),
        failed_stage=FailedStage.data_processing,
        error=error or f"process_data.py exited with code {exit_code}",
        outcome=data_outcome(exit_code, log),
        runs=runs(data_processing=data_outcome(exit_code, log)),
    )


def train_failed(
    exit_code: int = 1, log: str = "", model_files: list[str] | None = None, n_loss: int = 0
) -> TrainResult:
    return TrainResult(
        request_id="req-1",
        ok=False,
        context=context(),
        data=data_summary(),
        train=train_summary([] if model_files is None else model_files, n_loss=n_loss),
        failed_stage=FailedStage.training,
        error=f"training exited with code {exit_code}",
        outcome=train_outcome(exit_code, log),
        runs=runs(data_processing=data_outcome(), training=train_outcome(exit_code, log)),
    )


# ---------------------------------------------------------------- stage logs

OOM_LOG = """\
[INFO|trainer.py:2414] 2025-11-30 10:00:01,123 >> ***** Running training *****
[INFO|trainer.py:2415] 2025-11-30 10:00:01,123 >>   Num examples = 1,234
 3%|▎         | 7/231 [00:07<04:00,  1.1s/it]
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 3104, in cross_entropy
    return torch._C._nn.cross_entropy_loss(input, target, weight)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has 1.2 GiB free.
"""
CONFIG_LOG = """\
Traceback (most recent call last):
  File "/opt/venv/bin/llamafactory-cli", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/llamafactory/hparams/parser.py", line 71, in _parse_args
    raise ValueError(f"Some keys are not used by the HfArgumentParser: {sorted(unknown_args)}")
ValueError: Some keys are not used by the HfArgumentParser: ['lora_rnk']
"""
NCCL_LOG = """\
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4159, in barrier
    work = default_pg.barrier(opts=opts)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error
"""  # noqa: E501
DATA_LOG = """\
loading /assets/datasets/gsm8k/train.jsonl
Traceback (most recent call last):
  File "/workspace/process_data.py", line 52, in <module>
    rows = [to_alpaca(r) for r in raw]
  File "/workspace/process_data.py", line 30, in to_alpaca
    return {"instruction": r["question"], "output": r["answer_text"]}
KeyError: 'answer_text'
"""


VALIDATION_SAMPLES = [
    ErrorSample(
        question="VAL-Q-7781: Tom has 3 apples and buys 4 more. How many apples?",
        gold="7",
        model_output="Tom has 3 + 4 = 8 apples. The answer is 8.",
    ),
    ErrorSample(
        question="VAL-Q-1203: A train travels 60 km in 1.5 hours. Speed in km/h?",
        gold="40",
        model_output="60 / 1.5 = 45. The answer is 45.",
    ),
]


def scores(
    accuracy: dict[str, dict[str, float]] | None = None,
    samples: list[ErrorSample] | None = None,
    ids: list[str] | None = None,
) -> BenchmarkScores:
    summary = {"gsm8k": {"accuracy": 0.52}} if accuracy is None else accuracy
    return BenchmarkScores(
        accuracy_summary=summary,
        # Copies: an event a test changes leaves the next test's samples as they are.
        error_samples=[s.model_copy() for s in VALIDATION_SAMPLES] if samples is None else samples,
        primary_metric="gsm8k/accuracy",
        primary_value=summary.get("gsm8k", {}).get("accuracy"),
        item_ids={"gsm8k": ids or ["val-0001", "val-0002"]},
    )


def bench_result(
    ok: bool = True,
    split: str = "validation",
    benchmark: BenchmarkScores | None = None,
    n_loss: int = 20,
    model_files: list[str] | None = None,
    exit_code: int = 0,
    log: str = "",
    error: str | None = None,
) -> BenchResult:
    bench = benchmark if benchmark is not None else (scores() if ok else None)
    baseline = None
    if bench is not None and bench.primary_value is not None:
        base_scores = BenchmarkScores(accuracy_summary={"gsm8k": {"accuracy": 0.45}}, primary_value=0.45)
        baseline = BaselineComparison(
            baseline=base_scores,
            primary_metric=bench.primary_metric,
            candidate_value=bench.primary_value,
            baseline_value=0.45,
            difference=round(bench.primary_value - 0.45, 6),
        )
    return BenchResult(
        request_id="req-1",
        ok=ok,
        split=split,  # type: ignore[arg-type]
        context=context(),
        data=data_summary(),
        train=train_summary(model_files, n_loss=n_loss),
        benchmark=bench,
        baseline=baseline,
        outcome=outcome(exit_code, log, timeout_s=604800.0),
        failed_stage=None if ok else FailedStage.benchmark,
        error=error,
        runs=runs(data_processing=data_outcome(), training=train_outcome(0, "Training completed.\n"),
                  benchmark=outcome(exit_code, log, timeout_s=604800.0)),
    )
