"""What a LlamaFactory run left in ``output/``: model files, loss history, files worth keeping."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

from shared.events import EvalLossPoint, LossHistory, TrainLossPoint
from shared.logs import get_logger

_LOGGER = "ftbus.trainer.outputs"

TRAINER_STATE = "trainer_state.json"
TRAINER_LOG = "trainer_log.jsonl"
# HF Trainer writes the arguments it ran with next to the weights; a pickle, not a model file.
_NOT_MODEL_FILES = frozenset({"training_args.bin"})
# Resume state, not needed to use the model: folders of intermediate checkpoints (HF and DeepSpeed),
# optimizer/scheduler/grad-scaler state and RNG snapshots. Checkpoints can be several times the
# model's size; everything else in output/ (weights, configs, tokenizer, logs, plots) is kept.
_DROPPED_DIRS = re.compile(r"^(checkpoint-\d+|global_step\d+)$")
_DROPPED_FILES = re.compile(r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth)$")


def _is_model_file(name: str) -> bool:
    """The reference's test: ``*.safetensors``, ``*.bin`` or ``adapter_*`` (minus training_args.bin)."""
    if name in _NOT_MODEL_FILES:
        return False
    return name.endswith((".safetensors", ".bin")) or name.startswith("adapter_")


def find_model_files(output_dir: Path) -> tuple[Literal["lora", "full"] | None, list[str]]:
    """Model files directly in ``output_dir`` (not in checkpoints) and the kind of model they form.

    ``lora`` when there is an adapter (``adapter_config.json`` or ``adapter_model.*``), ``full``
    when there are other weight files, ``None`` when there is nothing: training produced no model.
    """
    if not output_dir.is_dir():
        return None, []
    names = sorted(p.name for p in output_dir.iterdir() if p.is_file() and _is_model_file(p.name))
    if not names:
        return None, []
    is_lora = any(n == "adapter_config.json" or n.startswith("adapter_model.") for n in names)
    return ("lora" if is_lora else "full"), names


# ---------------------------------------------------------------- loss history


def _number(value: Any) -> float | None:
    """A JSON number as float (NaN/inf kept: a diverged run must show as one), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _history_from_entries(entries: list[Any], step_key: str) -> LossHistory:
    history = LossHistory()
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        step = entry.get(step_key)
        if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step):
            continue
        epoch = _number(entry.get("epoch"))
        loss = _number(entry.get("loss"))
        if loss is not None:
            history.train.append(TrainLossPoint(step=int(step), epoch=epoch, loss=loss))
        eval_loss = _number(entry.get("eval_loss"))
        if eval_loss is not None:
            history.eval.append(EvalLossPoint(step=int(step), epoch=epoch, eval_loss=eval_loss))
    return history


def _from_trainer_state(path: Path) -> LossHistory:
    state = json.loads(path.read_text(encoding="utf-8"))
    entries = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(entries, list):
        raise ValueError("no log_history list")
    return _history_from_entries(entries, "step")


def _from_trainer_log(path: Path) -> LossHistory:
    entries: list[Any] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short when the run was killed
    return _history_from_entries(entries, "current_steps")


def _latest_checkpoint_state(output_dir: Path) -> Path | None:
    candidates = [
        (int(p.parent.name.split("-")[1]), p)
        for p in output_dir.glob(f"checkpoint-*/{TRAINER_STATE}")
        if re.fullmatch(r"checkpoint-\d+", p.parent.name)
    ]
    return max(candidates)[1] if candidates else None


def _written_in_place(path: Path, output_dir: Path) -> bool:
    """``path`` is itself inside ``output_dir``, not reached through a link the candidate planted
    (the sandbox wrote this folder; the worker reads it on the host, where a link could lead anywhere)."""
    if output_dir.is_symlink():
        return False
    real = Path(os.path.realpath(path))
    return real == Path(os.path.realpath(output_dir)) / path.relative_to(output_dir)


def merge_histories(*histories: LossHistory) -> LossHistory:
    """One history from several, one point per step (train and eval apart), in step order; a
    later history's point replaces an earlier one's at the same step. A resumed training's
    checkpoint holds steps 1..N and its log what came after; a killed run's log may repeat what
    its last checkpoint holds: either way, no step is missing or counted twice."""
    train: dict[int, TrainLossPoint] = {}
    evals: dict[int, EvalLossPoint] = {}
    for history in histories:
        train.update((p.step, p) for p in history.train)
        evals.update((p.step, p) for p in history.eval)
    return LossHistory(train=[train[k] for k in sorted(train)], eval=[evals[k] for k in sorted(evals)])


def _read_history(path: Path, read: Any, output_dir: Path) -> LossHistory | None:
    if not path.is_file() or not _written_in_place(path, output_dir):
        return None
    try:
        return read(path)
    except Exception as exc:  # a bad file must never fail the stage: the history is optional
        get_logger(_LOGGER).warning("loss history unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}")
        return None


def extract_loss_history(output_dir: Path) -> LossHistory:
    """Train/eval loss points from ``trainer_state.json``'s ``log_history``; never raises.

    A run that finished writes ``output/trainer_state.json``, whose history is whole (a resumed
    run's too: HF Trainer carries the checkpoint's history on). One that was killed (timeout,
    OOM) has not, yet its history is often still there: the latest ``checkpoint-N/`` holds steps
    up to N, and LlamaFactory's ``trainer_log.jsonl`` a line per logging step of this run (after
    N when it resumed from there). They are merged by step (`merge_histories`), since a timed-out
    run's loss curve is what its author needs most.
    """
    final = _read_history(output_dir / TRAINER_STATE, _from_trainer_state, output_dir)
    if final is not None:
        return final
    checkpoint_state = _latest_checkpoint_state(output_dir) if output_dir.is_dir() else None
    parts = [
        h for h in (
            _read_history(checkpoint_state, _from_trainer_state, output_dir) if checkpoint_state else None,
            _read_history(output_dir / TRAINER_LOG, _from_trainer_log, output_dir),
        ) if h is not None
    ]
    if not parts:
        get_logger(_LOGGER).warning("no loss history", output_dir=str(output_dir))
    return merge_histories(*parts)


# ---------------------------------------------------------------- artifacts


def output_files_to_keep(output_dir: Path) -> list[Path]:
    """Files under ``output_dir`` worth storing (as ``output_dir / relative``), sorted.

    Everything except resume state (see ``_DROPPED_*``). Links and special files are skipped:
    the candidate's code wrote this folder, and a link could point at any file on the worker.
    """
    if not output_dir.is_dir() or output_dir.is_symlink():
        return []
    kept: list[Path] = []
    stack = [output_dir]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if not _DROPPED_DIRS.match(entry.name):
                    stack.append(entry)
            elif entry.is_file() and not _DROPPED_FILES.match(entry.name):
                kept.append(entry)
    return sorted(kept)
