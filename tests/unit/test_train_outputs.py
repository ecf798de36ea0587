"""Training outputs: which model was made, its loss curve, and which files are kept."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from services.trainer.outputs import extract_loss_history, find_model_files, output_files_to_keep
from shared.logs import get_logger

LOG_HISTORY = [
    {"epoch": 0.5, "grad_norm": 1.2, "learning_rate": 1e-4, "loss": 2.5, "step": 10},
    {"epoch": 1.0, "eval_loss": 2.1, "eval_runtime": 0.5, "step": 20},
    {"epoch": 1.0, "learning_rate": 5e-5, "loss": 1.75, "step": 20},
    {"epoch": 1.5, "loss": 1.25, "step": 30},
    {"epoch": 2.0, "step": 40, "total_flos": 1.0, "train_loss": 1.8, "train_runtime": 9.1},
]


@pytest.fixture(autouse=True)
def _logging_configured() -> None:
    # The first get_logger() configures structlog, which would replace capture_logs' set-up.
    get_logger()


def _touch(path: Path, content: str | bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return path


# ---------------------------------------------------------------- model files


def test_lora_output(tmp_path: Path) -> None:
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "training_args.bin"):
        _touch(tmp_path / name)
    _touch(tmp_path / "checkpoint-10" / "adapter_model.safetensors")  # not searched: non-recursive
    kind, files = find_model_files(tmp_path)
    assert kind == "lora"
    assert files == ["adapter_config.json", "adapter_model.safetensors"]


def test_full_output_with_shards(tmp_path: Path) -> None:
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        _touch(tmp_path / name)
    _touch(tmp_path / "pytorch_model.bin")
    kind, files = find_model_files(tmp_path)
    assert kind == "full"
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "pytorch_model.bin"]


def test_no_model(tmp_path: Path) -> None:
    _touch(tmp_path / "training_args.bin")  # arguments, not weights
    _touch(tmp_path / "trainer_log.jsonl")
    _touch(tmp_path / "checkpoint-5" / "model.safetensors")
    assert find_model_files(tmp_path) == (None, [])
    assert find_model_files(tmp_path / "missing") == (None, [])


# ---------------------------------------------------------------- loss history


def test_loss_history_from_trainer_state(tmp_path: Path) -> None:
    _touch(tmp_path / "trainer_state.json", json.dumps({"global_step": 40, "log_history": LOG_HISTORY}))
    history = extract_loss_history(tmp_path)
    assert [(p.step, p.epoch, p.loss) for p in history.train] == [(10, 0.5, 2.5), (20, 1.0, 1.75), (30, 1.5, 1.25)]
    assert [(p.step, p.epoch, p.eval_loss) for p in history.eval] == [(20, 1.0, 2.1)]


def test_diverged_loss_is_kept(tmp_path: Path) -> None:
    state = '{"log_history": [{"loss": 3.0, "step": 1}, {"loss": NaN, "step": 2}]}'
    _touch(tmp_path / "trainer_state.json", state)
    history = extract_loss_history(tmp_path)
    assert len(history.train) == 2 and math.isnan(history.train[1].loss)


@pytest.mark.parametrize("content", ["{broken", '{"log_history": 3}', "[]"])
def test_bad_trainer_state_gives_empty_history_and_warning(tmp_path: Path, content: str) -> None:
    _touch(tmp_path / "trainer_state.json", content)
    with capture_logs() as logs:
        history = extract_loss_history(tmp_path)
    assert history.train == [] and history.eval == []
    assert any(e["event"] == "loss history unreadable" and e["log_level"] == "warning" for e in logs)


def test_missing_trainer_state_gives_empty_history(tmp_path: Path) -> None:
    with capture_logs() as logs:
        history = extract_loss_history(tmp_path / "output")
    assert history.train == [] and history.eval == []
    assert [e["event"] for e in logs] == ["no loss history"]


def test_killed_run_uses_latest_checkpoint_then_trainer_log(tmp_path: Path) -> None:
    _touch(tmp_path / "checkpoint-10" / "trainer_state.json", json.dumps({"log_history": LOG_HISTORY[:1]}))
    _touch(tmp_path / "checkpoint-30" / "trainer_state.json", json.dumps({"log_history": LOG_HISTORY[:4]}))
    _touch(tmp_path / "checkpoint-9" / "trainer_state.json", json.dumps({"log_history": []}))
    assert [p.step for p in extract_loss_history(tmp_path).train] == [10, 20, 30]

    log_dir = tmp_path / "only-log"
    lines = [
        {"current_steps": 5, "total_steps": 20, "loss": 2.0, "epoch": 0.25, "remaining_time": "0:00:09"},
        {"current_steps": 10, "total_steps": 20, "eval_loss": 1.9, "epoch": 0.5},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"current_steps": 15, "lo'
    _touch(log_dir / "trainer_log.jsonl", text)
    history = extract_loss_history(log_dir)
    assert [(p.step, p.loss) for p in history.train] == [(5, 2.0)]
    assert [(p.step, p.eval_loss) for p in history.eval] == [(10, 1.9)]


# ---------------------------------------------------------------- files kept


def test_output_files_to_keep_drops_resume_state_only(tmp_path: Path) -> None:
    out = tmp_path / "output"
    kept_names = [
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "trainer_state.json",
        "trainer_log.jsonl",
        "all_results.json",
        "train_results.json",
        "eval_results.json",
        "training_loss.png",
        "training_eval_loss.png",
        "training_args.bin",
        "README.md",
        "runs/events.out.tfevents",
    ]
    for name in kept_names:
        _touch(out / name)
    for name in (
        "checkpoint-10/adapter_model.safetensors",
        "checkpoint-10/optimizer.pt",
        "checkpoint-20/trainer_state.json",
        "global_step20/mp_rank_00_model_states.pt",
        "optimizer.pt",
        "scheduler.pt",
        "scaler.pt",
        "rng_state.pth",
        "rng_state_3.pth",
    ):
        _touch(out / name)
    kept = output_files_to_keep(out)
    assert kept == sorted(out / name for name in kept_names)


def test_output_files_to_keep_skips_links(tmp_path: Path) -> None:
    secret = _touch(tmp_path / "secret.txt", "token")
    out = tmp_path / "output"
    _touch(out / "model.safetensors")
    (out / "leak.txt").symlink_to(secret)
    (out / "leakdir").symlink_to(tmp_path)
    assert output_files_to_keep(out) == [out / "model.safetensors"]
    assert output_files_to_keep(tmp_path / "absent") == []
