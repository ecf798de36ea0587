"""Build the GPU check's small model offline: the tiny model's tokenizer, wider layers.

    <toolchain python> build_model.py TOKENIZER_DIR DEST [--hidden 256 --heads 4 --layers 2]

The project's tiny model (``models/tiny-llama``: hidden 64, 4 heads) has 16-dimensional attention
heads, below what vLLM's GPU attention kernels take; this one keeps its tokenizer and chat template
(so LlamaFactory's ``default`` template and the tiny benchmarks apply unchanged) with 64-dimensional
heads. Randomly initialised with a fixed seed, saved as safetensors; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _assets_module():
    # The tiny model's builder (seed, output-layer scale), loaded by path: it is a standalone script.
    path = ROOT / "ftbus" / "toolchain" / "build_assets.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # as when run as a script: beside it, its items (asset_items.py)
    spec = importlib.util.spec_from_file_location("ftbus_build_assets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(tokenizer_dir: Path, dest: Path, hidden: int, heads: int, layers: int) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=False, local_files_only=True)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(dest))
    _assets_module().save_llama(tok, dest, hidden=hidden, heads=heads, layers=layers)
    if not (dest / "model.safetensors").is_file():
        raise SystemExit(f"{dest} has no model.safetensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer_dir", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    build(args.tokenizer_dir, args.dest, args.hidden, args.heads, args.layers)
    print(f"built {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
