"""Build the offline assets a new user needs: a tiny model, a raw dataset and two tiny benchmarks.

    <toolchain python> build_assets.py ASSETS_DIR [--force]

A standalone script run by the fine-tuning toolchain's interpreter (it imports torch, tokenizers and
transformers); the services never import it, they call ``ftbus.assets.build_assets``. Nothing is
downloaded: the tokenizer is trained here and the model is randomly initialised with a fixed seed,
so the whole pipeline (data -> train -> benchmark) runs on a machine without network or GPU.

Layout written under ASSETS_DIR (each folder built in a temporary sibling, then renamed into place,
and skipped when its stamp matches this script's hash, so re-running is cheap and never leaves half
an asset behind):

    models/tiny-llama/            LlamaForCausalLM (hidden 64, 2 layers, 4 heads) + tokenizer.json
                                  + ftbus_inference.yaml (greedy)
    datasets/tiny-qa/raw.jsonl    synthetic {id, kind, question, answer} records
    datasets/tiny-reviews/raw.jsonl   synthetic restaurant and film reviews labelled positive/negative
    datasets/grade-school-arith/raw.jsonl   synthetic word problems in GSM8K's format {id, question, answer}
    benchmarks/tiny-arith/        benchmark.yaml (generate_until, exact_match) + one jsonl per subset
    benchmarks/tiny-arith-mc/     benchmark.yaml (multiple_choice, acc) + one jsonl per subset
    benchmarks/tiny-sentiment/    benchmark.yaml (generate_until, exact_match): "positive" or "negative"
    benchmarks/gsm8k-synth/       benchmark.yaml (generate_until, scorer gsm8k, strict_match): held out
                                  of grade-school-arith (examples/gsm8k learns it in under a minute)
    benchmarks/README.md          the registry folder format
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

if __package__:  # imported: ftbus.toolchain.build_assets (tests, deploy/gpu)
    from ftbus.toolchain import asset_items
else:  # run as a script by the toolchain's interpreter (no ftbus installed): its folder is on sys.path
    import asset_items  # type: ignore[no-redef]

STAMP = ".ftbus-asset.json"

# LlamaFactory's `default` template (llamafactory/data/template.py, 0.9.5), as its own
# Template._get_jinja_template renders it: the model then chats the way `template: default` trains
# it, and lm-eval's --apply_chat_template produces the same prompt as training did.
DEFAULT_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% if system_message is defined %}{{ 'System: ' + system_message + '</s>' + '\n' }}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'user' %}"
    "{{ 'Human: ' + content + '</s>' + '\nAssistant:' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ content + '</s>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
LM_HEAD_STD = 0.5

BENCHMARKS_README = """\
# Benchmark registry

One folder per benchmark, named like the benchmark: `benchmarks/<name>/`.

`benchmark.yaml`:

```yaml
name: tiny-arith              # must equal the folder name
version: 1                    # bump when items change: split manifests and caches key on it
description: free text shown to the judge
kind: generate_until          # or multiple_choice
primary_metric: exact_match   # generate_until: exact_match; multiple_choice: acc or acc_norm
higher_is_better: true
subsets:                      # evaluated and reported one by one
  - {name: addition, file: addition.jsonl}
generation: {max_gen_toks: 16, until: ["\\n"]}   # optional, generate_until only
```

Each subset file is JSON Lines, one item a line: `{"id": str, "question": str, "answer": str}`;
multiple_choice items add `"choices": [str, ...]` and `answer` is the text of the right choice.
Ids are unique within a subset. Items keep their file order: the validation split is the first
min(max_items, n//2) items of each subset, the hidden test split the last min(max_items, n//2).
"""


# ------------------------------------------------------------------ helpers


def _script_hash() -> str:
    """This script's and its items' (asset_items.py): either changing rebuilds the assets."""
    here = Path(__file__).resolve()
    return hashlib.sha256(here.read_bytes() + (here.parent / "asset_items.py").read_bytes()).hexdigest()


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _make_readable(root: Path) -> None:
    """mkdtemp makes 0700 folders and safetensors writes 0600 files: assets are mounted read-only
    into containers that run as another user, so everything must be world-readable."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _build(dest: Path, builder: Callable[[Path], None], force: bool) -> bool:
    """Run ``builder`` into a temporary sibling of ``dest`` and swap it in. False if up to date."""
    stamp = dest / STAMP
    want = {"builder_sha256": _script_hash()}
    if not force and stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == want:
                return False
        except json.JSONDecodeError:
            pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        builder(tmp)
        (tmp / STAMP).write_text(json.dumps(want))
        _make_readable(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return True


#: The tiny model is evaluated greedily: its scores are the same run to run (docs/benchmarks.md).
TINY_INFERENCE = "# Sampling of this model in benchmarks (evaluation/inference.py).\ngreedy: true\n"


def build_gsm8k_synth(dest: Path, subsets: dict[str, list[dict[str, str]]]) -> None:
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "benchmark.yaml").write_text(yaml.safe_dump(asset_items.GSM8K_SYNTH, sort_keys=False, allow_unicode=True))
    for subset, items in subsets.items():
        _write_jsonl(dest / f"{subset}.jsonl", items)


# ------------------------------------------------------------------ builders


def build_tiny_model(dest: Path, corpus: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE over the full byte alphabet: any text encodes, nothing maps to <unk>.
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=1024,
        padding_side="right",
    )
    fast.chat_template = DEFAULT_CHAT_TEMPLATE
    fast.save_pretrained(dest)

    save_llama(fast, dest)


def save_llama(tokenizer: Any, dest: Path, *, hidden: int = 64, heads: int = 4, layers: int = 2) -> None:
    """A randomly initialised Llama for ``tokenizer`` (fixed seed), saved as safetensors in ``dest``.

    The defaults are the tiny model's; deploy/gpu/build_model.py asks for wider heads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(asset_items.SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # A pretrained model's output layer can make one token far likelier than the rest; a freshly
    # initialised one (std 0.02) cannot: after the final RMSNorm its logits stay within about +-1.3,
    # so no amount of LoRA training (which leaves lm_head alone) gets the loss below ~6. A wider
    # output layer gives the tiny model the dynamic range of a real one.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, LM_HEAD_STD)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)


def build_dataset(dest: Path, records: list[dict[str, str]], readme: str = "") -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _write_jsonl(dest / "raw.jsonl", records)
    (dest / "README.md").write_text(readme or (
        "# tiny-qa\n\nSynthetic question/answer records (addition, subtraction, parity, successor),\n"
        "one JSON object a line in `raw.jsonl`: `{id, kind, question, answer}`. None of the\n"
        "questions appears in the tiny-arith benchmarks. Built by ftbus/toolchain/build_assets.py.\n"
    ))


REVIEWS_README = (
    "# tiny-reviews\n\nSynthetic restaurant (`food`) and film (`films`) reviews, one JSON object a line in\n"
    "`raw.jsonl`: `{id, kind: sentiment, domain, question, answer}`, answer `positive` or `negative`.\n"
    "None of the questions appears in the tiny-sentiment benchmark. Built by ftbus/toolchain/build_assets.py.\n"
)
BENCH_DESCRIPTIONS = {
    "tiny-sentiment": "Is a short restaurant or film review positive or negative? Exact match (synthetic).",
}


def build_benchmark(dest: Path, name: str, subsets: dict[str, list[dict[str, Any]]],
                    split_size: int | None = None) -> None:
    import yaml  # comes with the toolchain (transformers, LlamaFactory)

    dest.mkdir(parents=True, exist_ok=True)
    mc = any("choices" in item for items in subsets.values() for item in items)
    spec: dict[str, Any] = {
        "name": name,
        "version": 1,
        "description": BENCH_DESCRIPTIONS.get(name) or (
            "Tiny multiple-choice arithmetic and parity questions (synthetic, for tests and demos)."
            if mc else "Tiny addition and subtraction questions, answered by exact match (synthetic)."
        ),
        "kind": "multiple_choice" if mc else "generate_until",
        "primary_metric": "acc" if mc else "exact_match",
        "higher_is_better": True,
        "subsets": [{"name": s, "file": f"{s}.jsonl"} for s in subsets],
    }
    if not mc:
        spec["generation"] = {"max_gen_toks": 16, "until": ["\n"]}
    if split_size is not None:
        spec["split_size"] = split_size
    (dest / "benchmark.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    for subset, items in subsets.items():
        _write_jsonl(dest / f"{subset}.jsonl", items)


def build_all(assets: Path, force: bool = False) -> list[str]:
    """Build every asset under ``assets``; return a line per asset saying built or up to date."""
    report: list[str] = []
    benches = asset_items.benchmark_items()
    bench_questions = {i["question"] for subsets in benches.values() for items in subsets.values() for i in items}
    records = asset_items.dataset_records(bench_questions)
    sentiment = asset_items.sentiment_items()
    reviews = asset_items.review_records({i["question"] for items in sentiment.values() for i in items})
    benches["tiny-sentiment"] = sentiment
    corpus = [f"{r['question']} {r['answer']}" for r in records] + [
        f"{i['question']} {i['answer']}" for s in benches.values() for items in s.values() for i in items
    ] + ["Human: Assistant: System: even odd What is comes after number"] * 8
    corpus += [f"{r['question']} {r['answer']}" for r in reviews]
    # Every number up to 1999, so that BPE has enough to merge to its ~2000-token vocabulary.
    corpus += [" ".join(str(k) for k in range(start, start + 100)) for start in range(0, 2000, 100)] * 4

    steps: list[tuple[Path, Callable[[Path], None]]] = [
        (assets / "models" / "tiny-llama", lambda d: build_tiny_model(d, corpus)),
        (assets / "datasets" / "tiny-qa", lambda d: build_dataset(d, records)),
        (assets / "datasets" / "tiny-reviews", lambda d: build_dataset(d, reviews, REVIEWS_README)),
    ]
    # tiny-sentiment gets its confirmation pool here, after the tokenizer's corpus and the training
    # reviews were made without it: both stay as they were.
    benches["tiny-sentiment"] = asset_items.with_sentiment_pool(sentiment, {r["question"] for r in reviews})
    split_sizes = {"tiny-sentiment": asset_items.SENTIMENT_SPLIT}
    for name, subsets in benches.items():
        steps.append((assets / "benchmarks" / name,
                      lambda d, name=name, subsets=subsets: build_benchmark(d, name, subsets, split_sizes.get(name))))
    grade_school, grade_school_records = asset_items.grade_school_items()
    steps += [
        (assets / "datasets" / "grade-school-arith",
         lambda d: build_dataset(d, grade_school_records, asset_items.GRADE_SCHOOL_README)),
        (assets / "benchmarks" / "gsm8k-synth", lambda d: build_gsm8k_synth(d, grade_school)),
    ]
    for dest, builder in steps:
        built = _build(dest, builder, force)
        report.append(f"{'built' if built else 'up to date'}: {dest}")
    inference = assets / "models" / "tiny-llama" / "ftbus_inference.yaml"
    if not inference.is_file() or inference.read_text() != TINY_INFERENCE:
        inference.write_text(TINY_INFERENCE)
    readme = assets / "benchmarks" / "README.md"
    if force or not readme.is_file() or readme.read_text() != BENCHMARKS_README:
        readme.write_text(BENCHMARKS_README)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assets_dir", type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    for line in build_all(args.assets_dir.resolve(), force=args.force):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
