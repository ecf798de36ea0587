"""The gsm8k-synth benchmark and its training data: GSM8K's own format, scored by the GSM8K scorer,
and held out: no benchmark question, name or object occurs in the training records."""

from __future__ import annotations

from evaluation.registry import BenchmarkItem
from evaluation.scorers import check_gold, score_text
from ftbus.toolchain.asset_items import ARITH_NAMES, ARITH_OBJECTS, GSM8K_SYNTH, grade_school_items


def test_the_benchmark_is_held_out_of_the_training_records() -> None:
    bench, train = grade_school_items()
    items = [i for subset in bench.values() for i in subset]
    assert len(items) == 40 and len(train) == 600
    assert {i["question"] for i in items}.isdisjoint(r["question"] for r in train)
    held = [w for w in ARITH_NAMES + ARITH_OBJECTS if any(w in i["question"] for i in items)]
    assert held and not [w for w in held if any(w in r["question"] for r in train)]


def test_items_are_in_gsm8k_format_and_score_as_gsm8k() -> None:
    bench, train = grade_school_items()
    assert GSM8K_SYNTH["scorer"] == "gsm8k"
    for row in [*bench["word_numbers"], *train[:50]]:
        item = BenchmarkItem(id="x", question=row["question"], answer=row["answer"])
        assert check_gold("gsm8k", item) is None and "\n#### " in row["answer"]
        # The item's own worked answer is right by both of GSM8K's extractions.
        assert score_text("gsm8k", item, row["answer"]) == {"strict_match": 1.0, "flexible_match": 1.0}
