"""A YAML alias bomb in train.yaml is refused at once, with a clear reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.trainer.config import TrainConfigError, prepare_train_yaml

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(9)
) + "model_name_or_path: m\nstage: sft\ndataset: processed_data\n"


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(TrainConfigError, match="alias bomb"):
        prepare_train_yaml(BOMB, assets_dir=tmp_path, workspace_dir=tmp_path)
    assert time.monotonic() - started < 5


def test_a_plain_alias_is_fine(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    text = "base: &b {stage: sft}\nmodel_name_or_path: m\nstage: sft\ndataset: processed_data\nother: *b\n"
    try:
        prepare_train_yaml(text, assets_dir=tmp_path, workspace_dir=tmp_path)
    except TrainConfigError as exc:
        assert "alias bomb" not in str(exc)
