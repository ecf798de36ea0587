"""Build the offline assets (tiny model, raw dataset, benchmarks) with the fine-tuning toolchain.

The services never import torch or transformers: the builder is a standalone script
(``ftbus/toolchain/build_assets.py``) run as a subprocess by the toolchain's own interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from shared.offline import OFFLINE_ENV

BUILD_SCRIPT = Path(__file__).resolve().parent / "toolchain" / "build_assets.py"

# The builder needs no network; saying so keeps transformers from probing the Hub.

_HINT = "run `make toolchain` (or set FTBUS_TOOLCHAIN_BIN to a folder with the toolchain's python)"


class AssetsError(RuntimeError):
    """Assets could not be built; the message says why and what to do."""


class ToolchainMissingError(AssetsError):
    """The fine-tuning toolchain's interpreter is missing, or lacks torch/transformers."""


class AssetBuildError(AssetsError):
    """The builder ran and failed; the message carries the end of its output."""


def _resolve_python(toolchain_python: Path) -> Path:
    # A bare name ("python") means "from PATH", which is what settings fall back to without .toolchain/.
    if len(toolchain_python.parts) == 1 and not toolchain_python.is_file():
        found = shutil.which(str(toolchain_python))
        if found:
            return Path(found)
    if toolchain_python.is_file() and os.access(toolchain_python, os.X_OK):
        return toolchain_python
    raise ToolchainMissingError(f"the fine-tuning toolchain's python is missing ({toolchain_python}): {_HINT}")


def build_assets(assets_dir: Path, toolchain_python: Path, *, force: bool = False,
                 timeout_s: float = 600.0) -> None:
    """Build ``models/tiny-llama``, ``datasets/tiny-{qa,reviews}`` and
    ``benchmarks/tiny-{arith,arith-mc,sentiment}`` under ``assets_dir``. Idempotent: assets already
    built by the same builder are left alone."""
    python = _resolve_python(Path(toolchain_python))
    argv = [str(python), str(BUILD_SCRIPT), str(Path(assets_dir).resolve())]
    if force:
        argv.append("--force")
    try:
        proc = subprocess.run(
            argv, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssetBuildError(f"building assets took over {timeout_s:.0f} s: {' '.join(argv)}") from exc
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        if "ModuleNotFoundError" in output and any(m in output for m in ("torch", "transformers", "tokenizers")):
            raise ToolchainMissingError(f"{python} lacks the fine-tuning toolchain: {_HINT}")
        raise AssetBuildError(f"building assets failed (exit {proc.returncode}):\n{output[-4000:]}")
