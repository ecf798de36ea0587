"""Environment variables that ``process_data.py`` runs with.

The reference's set (the evaluator ftbus replaces, docs/design.md §1), so that scripts written for it run unchanged:
``PYTHONPATH=./`` (import helper modules of the workspace), the OpenAI endpoint and key, the
strong/weak model pools as JSON lists, and the quiet/unbuffered Python flags its Docker image
adds. Its constants ``FT_MODEL_PATH=/assets/models`` and ``FT_DATASET_PATH=/assets/datasets`` are
given as this worker's real paths, plus ``FTBUS_ASSETS_DIR`` for scripts written for ftbus.

A value that is not configured is left out rather than set empty: ``OPENAI_BASE_URL=""`` would
make the openai client call an empty URL instead of its default. The runner adds the host's
pass-through variables (settings.passthrough_env); this module adds nothing else from the host.
"""

from __future__ import annotations

import json
from pathlib import Path

from shared.settings import Settings


def data_processing_env(settings: Settings, assets_dir: Path) -> dict[str, str]:
    """The variables the data stage gives process_data.py, for a worker whose assets are ``assets_dir``."""
    # Absolute, without resolving links: the script runs with the workspace as its cwd, and a
    # container sees the mount point it was given, not where a host link leads.
    assets = assets_dir.absolute()
    env: dict[str, str] = {
        "PYTHONPATH": "./",
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore",
        "TOKENIZERS_PARALLELISM": "false",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "STRONG_MODEL_POOL": json.dumps(settings.strong_models),
        "WEAK_MODEL_POOL": json.dumps(settings.weak_models),
        "FTBUS_ASSETS_DIR": str(assets),
        "FT_MODEL_PATH": str(assets / "models"),
        "FT_DATASET_PATH": str(assets / "datasets"),
    }
    if settings.openai_api_key:
        env["OPENAI_API_KEY"] = settings.openai_api_key
    if settings.openai_base_url:
        env["OPENAI_BASE_URL"] = settings.openai_base_url
    return env
