"""What the benchmarks that run the real toolchain share: settings in a scratch home, with its assets built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ftbus.assets import build_assets
from shared.logs import setup_logging
from shared.settings import Settings


def real_tool_settings(scratch: Path, console: Console, **extra: Any) -> Settings:
    """Settings whose home is under ``scratch``, with the offline assets built there; exits with
    code 2, saying what to run, when the toolchain is missing."""
    settings = Settings(home=scratch / "home", log_format="json", log_level="WARNING", **extra)
    setup_logging(settings.log_format, settings.log_level)
    toolchain = settings.toolchain_path()
    if toolchain is None:
        console.print("error: the toolchain is missing: run `make toolchain`")
        raise SystemExit(2)
    console.print(f"building assets in {settings.assets}")
    build_assets(settings.assets, toolchain / "python")
    return settings
