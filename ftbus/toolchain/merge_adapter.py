"""Merge a LoRA adapter into its base model (`ftbus pull --what merged`), with peft.

Run by a Python that has torch, transformers and peft (the toolchain's):
    python merge_adapter.py ADAPTER_DIR BASE_MODEL_DIR OUT_DIR
OUT_DIR gets the merged model (safetensors), its config and the tokenizer: a folder that
``AutoModelForCausalLM.from_pretrained`` loads with no adapter.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(adapter_dir: str, base_dir: str, out_dir: str) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    source = adapter_dir if (Path(adapter_dir) / "tokenizer_config.json").is_file() else base_dir
    AutoTokenizer.from_pretrained(source).save_pretrained(out_dir)
    # What the training left beside the adapter (loss history, trainer state) stays with the model.
    for name in ("trainer_state.json", "trainer_log.jsonl", "all_results.json", "train_results.json",
                 "training_loss.png"):
        if (Path(adapter_dir) / name).is_file():
            shutil.copy2(Path(adapter_dir) / name, Path(out_dir) / name)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
