"""Real benchmarks' formats through the REAL lm-eval on the tiny model, in the Docker sandbox: the
warm engine generates, ftbus's scorers score (GSM8K's strict and flexible answers), and HumanEval's
programs run in the code executor's containers, never in the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.grading import grade_split
from evaluation.importer import import_benchmark
from evaluation.inference import inference_for
from evaluation.models import select_model
from evaluation.registry import load_benchmark
from evaluation.splits import make_split
from evaluation.warm import WarmEngine, WarmSplit
from runners.docker import DockerRunner, engine_client
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

pytestmark = pytest.mark.e2e
MAX_ITEMS = 2


async def _generate_and_grade(benchmark: str, assets: Path, toolchain: Path, tmp_path: Path,
                              **extra: object) -> tuple:
    image = require_sandbox()
    settings = Settings(home=tmp_path / "home", assets_dir=assets, toolchain_bin=toolchain, bench_max_items=MAX_ITEMS,
                        sandbox="docker", sandbox_image=image, code_exec_timeout_s=20, **extra)
    spec = load_benchmark(assets, benchmark)
    manifest = make_split(spec, "validation", MAX_ITEMS)
    base = select_model(assets / "models" / "tiny-llama", None)
    inference = inference_for(settings, base.pretrained)
    engine = WarmEngine(DockerRunner(image, stage="bench", client=engine_client(), memory="4g"), settings,
                        tmp_path / "engine")
    try:
        runs = await engine.run(spec, base, [WarmSplit("validation", manifest)], tmp_path / "w", device="cpu",
                                timeout_s=600, inference=inference)
    finally:
        await engine.stop()
    run = runs["validation"]
    assert run.result.exit_code == 0, run.result.output_tail
    assert run.result.sandbox == f"docker:{image}"
    scores = await grade_split(spec, manifest, run.output_dir, settings=settings, inference=inference,
                               tokenizer_dir=base.pretrained)
    return spec, manifest, run, scores


async def test_gsm8k_format_is_generated_by_lm_eval_and_scored_strict_and_flexible(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    _, manifest, _, scores = await _generate_and_grade("gsm8k-synth", real_assets, toolchain_bin, tmp_path)
    assert scores.scorer == "gsm8k" and scores.primary_metric == "strict_match"
    subsets = {s for s, ids in manifest.item_ids.items() if ids}
    assert set(scores.accuracy_summary) == subsets
    for metrics in scores.accuracy_summary.values():
        assert set(metrics) == {"strict_match", "flexible_match"}
        assert all(0.0 <= value <= 1.0 for value in metrics.values())
    # The base model answers nothing right: every item is an error sample with the model's own text.
    assert scores.primary_value == 0.0
    assert scores.error_samples and all("####" in e.gold for e in scores.error_samples)
    assert any(note.startswith("generated with") for note in scores.notes)


async def test_humaneval_programs_run_in_the_code_executor_not_in_the_engine(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    import_benchmark(real_assets, "humaneval", None)
    # The tiny model never stops by itself: a cap of 64 tokens (a model's max_gen_toks, reported as such)
    # instead of HumanEval's whole budget per item, which only made the test minutes longer.
    spec, manifest, run, scores = await _generate_and_grade(
        "humaneval", real_assets, toolchain_bin, tmp_path, bench_inference={"tiny-llama": {"max_gen_toks": 64}})
    assert scores.scorer == "code" and scores.primary_metric == "pass@1"
    assert set(scores.accuracy_summary) == {"humaneval"}
    # A random tiny model writes no working Python: every program ran, and failed its tests.
    assert scores.accuracy_summary["humaneval"]["pass@1"] == 0.0
    assert len(scores.error_samples) == MAX_ITEMS
    assert any(note.startswith("code samples:") for note in scores.notes), scores.notes
    # The engine saw the prompts, never the tests: the split's data holds no `check` function.
    data = (run.run_dir / "data" / "humaneval.jsonl").read_text()
    items = {i.id: i for i in spec.items("humaneval")}
    for item_id in manifest.item_ids["humaneval"]:
        assert items[item_id].test and items[item_id].test not in data
    assert "def check(" not in data
