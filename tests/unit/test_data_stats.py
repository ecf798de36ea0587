"""Token statistics of data.json: the model's own tokenizer when there is one, offline always."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from services.data.stats import (
    REGEX_APPROX,
    STDOUT_SUMMARY_CHARS,
    approx_token_count,
    compute_data_stats,
    nearest_rank_percentile,
)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Fine-tuning a small model needs clean instruction data.",
    "What is 12 plus 30? The answer is 42.",
    "LoRA adapters are small; full fine-tuning updates every weight.",
    "Tokenizers split words into sub-word pieces.",
]


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    """A tiny byte-level BPE trained on a few sentences, saved as a model folder's tokenizer.json."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(SENTENCES, trainer=trainer)
    model_dir = tmp_path / "tiny-model"
    model_dir.mkdir()
    path = model_dir / "tokenizer.json"
    tokenizer.save(str(path))
    return path


# ---------------------------------------------------------------- percentiles


def test_nearest_rank_percentiles_on_known_lists() -> None:
    ten = list(range(1, 11))
    assert nearest_rank_percentile(ten, 50) == 5  # rank ceil(0.5 * 10) = 5
    assert nearest_rank_percentile(ten, 99) == 10  # rank ceil(9.9) = 10
    assert nearest_rank_percentile(ten, 100) == 10
    hundred = list(range(1, 101))
    assert nearest_rank_percentile(hundred, 50) == 50
    assert nearest_rank_percentile(hundred, 99) == 99
    assert nearest_rank_percentile([7], 50) == 7
    assert nearest_rank_percentile([1, 2, 3], 50) == 2
    with pytest.raises(ValueError):
        nearest_rank_percentile([], 50)


# ---------------------------------------------------------------- with the model's tokenizer.json


def test_counts_match_the_model_tokenizer(tokenizer_json: Path) -> None:
    records = [{"instruction": s, "output": s.upper()} for s in SENTENCES]
    stats = compute_data_stats(records, tokenizer_json, stdout="done")
    assert stats.tokenizer == "tokenizer.json of tiny-model"
    assert stats.total_samples == len(SENTENCES)

    reference = Tokenizer.from_file(str(tokenizer_json))
    for column in ("instruction", "output"):
        counts = sorted(len(reference.encode(r[column]).ids) for r in records)
        col = stats.token_stats[column]
        assert col.empty_count == 0
        assert (col.min_tokens, col.max_tokens) == (counts[0], counts[-1])
        assert col.p50_tokens == counts[math.ceil(0.5 * len(counts)) - 1]
        assert col.p99_tokens == counts[-1]
    # The byte-level tokenizer really splits: more tokens than words for unseen upper-case text.
    assert stats.token_stats["output"].max_tokens > len(SENTENCES[3].split())


def test_truncation_saved_in_tokenizer_json_does_not_cap_counts(tokenizer_json: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    full = len(tokenizer.encode(SENTENCES[1]).ids)
    tokenizer.enable_truncation(max_length=3)
    tokenizer.save(str(tokenizer_json))
    stats = compute_data_stats([{"instruction": SENTENCES[1]}], tokenizer_json, stdout="")
    assert stats.token_stats["instruction"].max_tokens == full > 3


def test_unreadable_tokenizer_falls_back_to_regex(tmp_path: Path) -> None:
    bad = tmp_path / "broken-model" / "tokenizer.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    stats = compute_data_stats([{"instruction": "hello world"}], bad, stdout="")
    assert stats.tokenizer.startswith(REGEX_APPROX) and "broken-model" in stats.tokenizer
    assert stats.token_stats["instruction"].max_tokens == 2

    missing = compute_data_stats([{"instruction": "hello world"}], tmp_path / "nope" / "tokenizer.json", "")
    assert missing.tokenizer.startswith(REGEX_APPROX)


# ---------------------------------------------------------------- without one


def test_regex_approximation() -> None:
    assert approx_token_count("") == 0
    # GPT tokenizers give 10 tokens for this sentence: one per word, one for the full stop.
    assert approx_token_count("The quick brown fox jumps over the lazy dog.") == 10
    assert approx_token_count("12345") == 2  # digits go in groups of at most three
    assert approx_token_count("你好世界") == 4  # about one token per CJK character
    assert approx_token_count("internationalization") == 3  # long words split


def test_columns_empty_values_and_non_string_keys() -> None:
    records = [
        {"instruction": "Say hi", "input": "", "output": "hi", "id": 1, "history": [["a", "b"]]},
        {"instruction": "Say hello there", "input": "   ", "output": "hello there"},
        {"instruction": "Count", "input": None, "output": "one two three four"},
        {"instruction": "Nothing"},  # input and output missing
    ]
    stats = compute_data_stats(records, None, stdout="")
    assert stats.tokenizer == REGEX_APPROX
    assert stats.total_samples == 4
    # Only keys whose values are strings; numbers and message lists are not token columns.
    assert list(stats.token_stats) == ["instruction", "input", "output"]
    inp = stats.token_stats["input"]
    assert inp.empty_count == 4 and inp.max_tokens == 0
    out = stats.token_stats["output"]
    # Missing counts as empty, with 0 tokens, so the distribution covers all 4 samples.
    assert out.empty_count == 1
    assert (out.min_tokens, out.p50_tokens, out.max_tokens, out.p99_tokens) == (0, 1, 4, 4)


def test_mixed_type_key_is_not_a_token_column() -> None:
    stats = compute_data_stats([{"label": "yes"}, {"label": 3}], None, stdout="")
    assert stats.token_stats == {}


def test_stdout_summary_is_the_tail() -> None:
    stdout = "start\n" + "x" * 5000 + "\nwrote 4 samples\n"
    stats = compute_data_stats([{"instruction": "a"}], None, stdout=stdout)
    assert len(stats.stdout_summary) == STDOUT_SUMMARY_CHARS
    assert stats.stdout_summary.endswith("wrote 4 samples\n")
    assert compute_data_stats([{"instruction": "a"}], None, stdout="short").stdout_summary == "short"


def test_large_dataset_counts_stay_aligned(tokenizer_json: Path) -> None:
    # More records than one encode batch: each count must stay with its own record.
    texts = [" ".join(SENTENCES[: 1 + i % 5]) for i in range(2600)]
    records = [{"instruction": t} for t in texts]
    reference = Tokenizer.from_file(str(tokenizer_json))
    counts = sorted(len(reference.encode(t).ids) for t in texts)
    col = compute_data_stats(records, tokenizer_json, stdout="").token_stats["instruction"]
    assert (col.min_tokens, col.p50_tokens, col.p99_tokens, col.max_tokens) == (
        counts[0],
        nearest_rank_percentile(counts, 50),
        nearest_rank_percentile(counts, 99),
        counts[-1],
    )
