"""What a benchmark run loads: the base model, a full fine-tune, or the base plus a LoRA adapter.

Shared by every backend (lm-eval, OpenCompass); read from files only, no transformers import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class ModelSelection:
    """What lm-eval loads: a full model folder, or a base model plus a LoRA adapter."""

    kind: Literal["lora", "full", "base"]
    pretrained: Path
    peft: Path | None = None


def is_adapter_dir(path: Path) -> bool:
    return any((Path(path) / f).is_file() for f in ADAPTER_FILES)


def select_model(base_model: Path, trained_dir: Path | None) -> ModelSelection:
    """The reference's LoRA detection: adapter files in the training output mean base + adapter;
    otherwise the output is a full model. No output at all means the base model alone (baseline)."""
    if trained_dir is None:
        return ModelSelection("base", Path(base_model))
    if is_adapter_dir(trained_dir):
        return ModelSelection("lora", Path(base_model), Path(trained_dir))
    return ModelSelection("full", Path(trained_dir))


def has_chat_template(model_dir: Path) -> bool:
    """Whether the model's tokenizer carries a chat template (read from files, no transformers)."""
    model_dir = Path(model_dir)
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    config = model_dir / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return False
