"""A YAML alias bomb in train.yaml is refused at once, with a clear reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.trainer.config import TrainConfigError, prepare_train_yaml
from shared import train_yaml

count_values = train_yaml._count_values

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(9)
) + "model_name_or_path: m\nstage: sft\ndataset: processed_data\n"


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quickly: by counting, without expanding it. The BOMB expands to 9**10 (3.5 billion) values; the
    count stops one past the limit, and it is the only walk of the values before the refusal."""
    counted: list[int] = []

    def counting(data: object, limit: int) -> int:
        counted.append(count_values(data, limit))
        return counted[-1]

    monkeypatch.setattr(train_yaml, "_count_values", counting)
    started = time.monotonic()
    with pytest.raises(TrainConfigError, match="alias bomb"):
        prepare_train_yaml(BOMB, assets_dir=tmp_path, workspace_dir=tmp_path)
    assert counted == [train_yaml.MAX_VALUES + 1]  # stopped at the limit
    # Hang guard only: walking the whole expansion, anywhere, would take far longer than this.
    assert time.monotonic() - started < 60


def test_a_plain_alias_is_fine(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    text = "base: &b {stage: sft}\nmodel_name_or_path: m\nstage: sft\ndataset: processed_data\nother: *b\n"
    try:
        prepare_train_yaml(text, assets_dir=tmp_path, workspace_dir=tmp_path)
    except TrainConfigError as exc:
        assert "alias bomb" not in str(exc)
