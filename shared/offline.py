"""The one environment that keeps the Hugging Face stack off the network.

Every process of the fine-tuning toolchain (training, benchmarks, the asset builder) runs with it:
models and datasets are local paths, and the sandbox has no network anyway, so a library that
tries the Hub would only wait for a timeout before failing.
"""

from __future__ import annotations

OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}
