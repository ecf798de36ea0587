"""Assets for integration tests: a model folder with a real tokenizer.json, a dataset, a benchmark.

The weights are not real (the stand-in toolchain never loads them); the tokenizer is, so the
data stage's token statistics run for real.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

MODEL = "tiny-standin"
DATASET = "qa"
BENCHMARK = "tiny-arith"
POOLED_BENCHMARK = "pooled-arith"


def build_standin_assets(root: Path) -> None:
    model_dir = root / "models" / MODEL
    model_dir.mkdir(parents=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([f"add {i} and {i} gives {2 * i}" for i in range(200)], trainer)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))

    dataset_dir = root / "datasets" / DATASET
    dataset_dir.mkdir(parents=True)
    (dataset_dir / "raw.jsonl").write_text(
        "".join(json.dumps({"question": f"add {i} and {i}", "answer": str(2 * i)}) + "\n" for i in range(50))
    )

    bench_dir = root / "benchmarks" / BENCHMARK
    bench_dir.mkdir(parents=True)
    (bench_dir / "benchmark.yaml").write_text(
        "name: tiny-arith\nversion: 1\ndescription: doubling questions\nkind: generate_until\n"
        "primary_metric: exact_match\nhigher_is_better: true\n"
        "subsets:\n- name: doubling\n  file: doubling.jsonl\n- name: halving\n  file: halving.jsonl\n"
    )
    (bench_dir / "doubling.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "question": f"double {i}", "answer": str(2 * i)}) + "\n" for i in range(20))
    )
    (bench_dir / "halving.jsonl").write_text(
        "".join(json.dumps({"id": f"h{i}", "question": f"halve {2 * i}", "answer": str(i)}) + "\n" for i in range(12))
    )


def add_pooled_benchmark(root: Path, items: int = 160) -> None:
    """A benchmark with a confirmation pool (shared/decision.py), under ``root/benchmarks``: with
    bench_max_items 40 each subset's first 40 items are validation, its last 40 test, and the
    ``items`` - 80 between them its part of the hidden pool (160 items in all by default)."""
    pooled_dir = root / "benchmarks" / POOLED_BENCHMARK
    pooled_dir.mkdir(parents=True)
    (pooled_dir / "benchmark.yaml").write_text(
        f"name: {POOLED_BENCHMARK}\nversion: 1\ndescription: tripling questions\nkind: generate_until\n"
        "primary_metric: exact_match\nhigher_is_better: true\n"
        "subsets:\n- name: tripling\n  file: tripling.jsonl\n- name: thirds\n  file: thirds.jsonl\n"
    )
    (pooled_dir / "tripling.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "question": f"triple {i}", "answer": str(3 * i)}) + "\n"
                for i in range(items)))
    (pooled_dir / "thirds.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}", "question": f"a third of {3 * i}", "answer": str(i)}) + "\n"
                for i in range(items)))
