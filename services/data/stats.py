"""Token statistics of ``data.json`` (the reference's ``data_stats.json``), computed offline.

Which tokenizer: the base model's own ``tokenizer.json`` when the caller found one, since that is
what the fine-tune will see (sequence lengths against ``cutoff_len``). Without one, a regex
approximation of GPT-style pre-tokenisation (below). Nothing is ever downloaded: workers run
without network access, and the reference's tiktoken fallback needs its encoding files fetched.

Columns: every key whose non-null values are all strings (and that has at least one). A record
where that key is missing, null, or only whitespace counts in ``empty_count`` and as 0 tokens, so
each column's distribution is over all ``total_samples`` records. Keys holding other types
(numbers, ShareGPT message lists ...) are left out rather than guessed at.

Percentiles use the nearest-rank method on the sorted counts: the p-th percentile of N values is
the value at 1-based rank ``ceil(p / 100 * N)``. It always returns an observed count (an integer,
like the event's fields) and needs no interpolation convention.

Counts are of the text's own tokens: special tokens a post-processor would add (BOS/EOS) are not
counted, and any truncation or padding configured in tokenizer.json is switched off.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.events import ColumnStats, DataStats
from shared.logs import get_logger

STDOUT_SUMMARY_CHARS = 2000
REGEX_APPROX = "regex-approx"

# GPT-style (cl100k-like) pre-tokenisation, written for the standard ``re`` module, which has no
# \p{L}: ``[^\W\d_]`` is "a letter", ``\d`` "a digit". Pieces: contractions, words with one
# leading non-letter (usually the space), numbers in groups of at most three digits, runs of
# punctuation, newlines, other whitespace.
_PRETOKEN = re.compile(
    r"'(?i:[sdmt]|ll|ve|re)"
    r"|[^\r\n\w]?[^\W\d_]+"
    r"|\d{1,3}"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# BPE vocabularies hold most English words whole but split long or rare ones; ~8 ASCII characters
# per token within a word matches that well enough for length statistics. Ideographic scripts
# (CJK, kana, hangul: U+2E80 and up) take about one token per character, other non-ASCII letters
# (accented Latin, Cyrillic, Greek ...) about one per two characters.
_ASCII_CHARS_PER_TOKEN = 8
_OTHER_CHARS_PER_TOKEN = 2
_IDEOGRAPHIC_START = 0x2E80
_BATCH = 1024


def approx_token_count(text: str) -> int:
    """Approximate BPE token count of ``text`` without any vocabulary (see module docstring)."""
    total = 0
    for piece in _PRETOKEN.findall(text):
        body = piece.lstrip(" ")
        if piece.isascii():  # the common case, kept fast: whitespace, digits, words, punctuation
            total += max(1, -(-len(body) // _ASCII_CHARS_PER_TOKEN))
            continue
        if not body or body.isspace():
            total += 1
            continue
        ascii_chars = ideographic = other = 0
        for ch in body:
            code = ord(ch)
            if code < 128:
                ascii_chars += 1
            elif code >= _IDEOGRAPHIC_START:
                ideographic += 1
            else:
                other += 1
        cost = ascii_chars / _ASCII_CHARS_PER_TOKEN + other / _OTHER_CHARS_PER_TOKEN + ideographic
        total += max(1, math.ceil(cost))
    return total


def nearest_rank_percentile(sorted_values: Sequence[int], p: float) -> int:
    """The p-th percentile (0 < p <= 100) of ascending ``sorted_values`` by nearest rank."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def _string_columns(records: Sequence[dict[str, Any]]) -> list[str]:
    """Keys whose non-null values are all strings (at least one), in first-seen order."""
    has_string: dict[str, bool] = {}
    not_string: set[str] = set()
    for record in records:
        for key, value in record.items():
            if isinstance(value, str):
                has_string[key] = True
            else:
                has_string.setdefault(key, False)
                if value is not None:
                    not_string.add(key)
    return [key for key, ok in has_string.items() if ok and key not in not_string]


class _Counter:
    """Counts tokens with the model's tokenizer.json, or falls back to the regex approximation."""

    def __init__(self, tokenizer_json: Path | None) -> None:
        self.label = REGEX_APPROX
        self._tokenizer: Any = None
        if tokenizer_json is None:
            return
        model = tokenizer_json.parent.name or str(tokenizer_json)
        if not tokenizer_json.is_file():
            get_logger(__name__).warning("tokenizer_missing", path=str(tokenizer_json))
            self.label = f"{REGEX_APPROX} (no tokenizer.json for {model})"
            return
        try:
            # Imported here: the regex path must work even where the library is unavailable.
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(tokenizer_json))
            # A tokenizer.json may ship with truncation (e.g. 512) or padding enabled, which would
            # cap or inflate every count.
            tokenizer.no_truncation()
            tokenizer.no_padding()
        except Exception as exc:  # any unreadable/unsupported file: still give approximate stats
            get_logger(__name__).warning(
                "tokenizer_unreadable", path=str(tokenizer_json), error=f"{type(exc).__name__}: {exc}"
            )
            self.label = f"{REGEX_APPROX} (tokenizer.json of {model} unreadable)"
            return
        self._tokenizer = tokenizer
        self.label = f"tokenizer.json of {model}"

    def count(self, texts: list[str]) -> list[int]:
        if self._tokenizer is None:
            return [approx_token_count(t) for t in texts]
        counts: list[int] = []
        # In batches: an Encoding keeps offsets and masks per token, too much to hold for a whole
        # dataset at once.
        for start in range(0, len(texts), _BATCH):
            batch = self._tokenizer.encode_batch(texts[start : start + _BATCH], add_special_tokens=False)
            counts.extend(len(e.ids) for e in batch)
        return counts


def compute_data_stats(
    records: list[dict[str, Any]], tokenizer_json: Path | None, stdout: str
) -> DataStats:
    """Per-column token statistics of the processed data, plus the tail of the script's stdout."""
    counter = _Counter(tokenizer_json)
    token_stats: dict[str, ColumnStats] = {}
    for column in _string_columns(records):
        values = [record.get(column) for record in records]
        texts = [v for v in values if isinstance(v, str) and v.strip()]
        counts = iter(counter.count(texts))
        # Empty values are 0 tokens so that the distribution covers every sample.
        per_record = sorted(next(counts) if isinstance(v, str) and v.strip() else 0 for v in values)
        token_stats[column] = ColumnStats(
            empty_count=len(values) - len(texts),
            min_tokens=per_record[0],
            max_tokens=per_record[-1],
            p50_tokens=nearest_rank_percentile(per_record, 50),
            p99_tokens=nearest_rank_percentile(per_record, 99),
        )
    return DataStats(
        total_samples=len(records),
        token_stats=token_stats,
        tokenizer=counter.label,
        stdout_summary=stdout[-STDOUT_SUMMARY_CHARS:],
    )
