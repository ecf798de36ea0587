"""`ftbus score BENCHMARK --model M --protocol validation`: the pipeline's own protocol on any model,
through the real lm-eval on the tiny model (the reference protocol has its side-by-side in
test_reference_protocol.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.registry import load_benchmark
from evaluation.splits import make_split
from ftbus.score_model import score_model
from shared.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_the_validation_protocol_scores_the_first_validation_items_of_each_subset(
    real_assets: Path, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home", assets_dir=real_assets)
    result = score_model(settings, "tiny-arith", "tiny-llama", protocol="validation", limit=2,
                         workdir=tmp_path / "run")
    assert result.protocol == "validation" and result.metric == "exact_match"
    spec = load_benchmark(real_assets, "tiny-arith")
    expected = make_split(spec, "validation", 2).item_ids
    assert {s: sorted(i.id for i in result.items if i.subset == s) for s in expected} == \
        {s: sorted(ids) for s, ids in expected.items()}, "not the first validation items of each subset"
    for item in result.items:
        assert item.prompt and item.metrics["exact_match"] in (0.0, 1.0)
    mean = sum(i.metrics["exact_match"] for i in result.items) / len(result.items)
    assert result.value == pytest.approx(mean)  # equal subsets: the mean over subsets is the items' mean
    assert any("--limit 2" in note for note in result.notes), "a quick look must say it is one"
