"""Merge a LoRA adapter into its base model (`ftbus pull --what merged`): the benchmark engine's own
merge (peft ``merge_and_unload``, safetensors only, the adapter's tokenizer), then the training's
records beside it.

Run by a Python that has torch, transformers and peft (the toolchain's):
    python merge_adapter.py ENGINE_DIR ADAPTER_DIR BASE_MODEL_DIR OUT_DIR
ENGINE_DIR holds ``vllm_support.py`` (evaluation/engine/). OUT_DIR gets a model that
``AutoModelForCausalLM.from_pretrained`` loads with no adapter.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

#: What the training left beside the adapter that stays with the merged model.
TRAINING_RECORDS = ("trainer_state.json", "trainer_log.jsonl", "all_results.json", "train_results.json",
                    "training_loss.png")


def main(engine_dir: str, adapter_dir: str, base_dir: str, out_dir: str) -> None:
    sys.path.insert(0, engine_dir)
    from vllm_support import merge_adapter

    merge_adapter(base_dir, adapter_dir, out_dir)
    for name in TRAINING_RECORDS:
        if (Path(adapter_dir) / name).is_file():
            shutil.copy2(Path(adapter_dir) / name, Path(out_dir) / name)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
