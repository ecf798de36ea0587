"""End-to-end fixtures: the real toolchain (LlamaFactory, lm-eval) on the tiny model built offline.

Skipped, with the reason, when the toolchain is absent (`make test` builds it first).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftbus.assets import build_assets
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def toolchain_bin() -> Path:
    toolchain = Settings().toolchain_path()
    if toolchain is None or not (toolchain / "llamafactory-cli").exists() or not (toolchain / "lm_eval").exists():
        pytest.skip("the fine-tuning toolchain is not installed: run `make toolchain` (make test does)")
    return toolchain


@pytest.fixture(scope="session")
def real_assets(tmp_path_factory: pytest.TempPathFactory, toolchain_bin: Path) -> Path:
    root = tmp_path_factory.mktemp("real-assets")
    build_assets(root, toolchain_bin / "python")
    return root
