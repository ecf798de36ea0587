"""lm-eval backend: task files, argv, and parsing of REAL lm-eval 0.4.13 output (tests/fixtures/lmeval)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from evaluation.lmeval import (
    LmEvalOutputError,
    build_lm_eval_command,
    lm_eval_env,
    parse_lm_eval_output,
    prepare_lm_eval_run,
    render_task_config,
    task_name,
)
from evaluation.models import ModelSelection, has_chat_template, select_model
from evaluation.registry import load_benchmark
from evaluation.splits import SplitManifest, make_split
from shared.events import BenchmarkScores

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lmeval"
ASSETS = FIXTURES / "assets"
GEN_RUN = FIXTURES / "tiny-arith-validation-lora"
MC_RUN = FIXTURES / "tiny-arith-mc-validation-base"


def _manifest(run: Path) -> SplitManifest:
    return SplitManifest.model_validate_json((run / "data" / "manifest.json").read_text())


def _samples(run: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((run / "output").rglob("samples_*.jsonl"))
            for line in f.read_text().splitlines()]


# ------------------------------------------------------------------ parsing real output


def test_parse_generate_until_run() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    manifest = _manifest(GEN_RUN)
    scores = parse_lm_eval_output(GEN_RUN / "output", spec, manifest, max_error_samples=10, seed=0)
    assert isinstance(scores, BenchmarkScores)
    assert scores.accuracy_summary == {"addition": {"exact_match": 0.0}, "subtraction": {"exact_match": 0.0}}
    assert (scores.primary_metric, scores.higher_is_better, scores.primary_value) == ("exact_match", True, 0.0)
    assert scores.item_ids == manifest.item_ids
    # Every one of the 40 answers is wrong: 10 are drawn, each a real item of the split.
    assert len(scores.error_samples) == 10
    items = {i.question: i.answer for s in ("addition", "subtraction") for i in spec.items(s)}
    for sample in scores.error_samples:
        assert items[sample.question] == sample.gold
        assert sample.model_output == ""  # what the 15-step adapter generated


def test_parse_multiple_choice_run() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith-mc")
    scores = parse_lm_eval_output(MC_RUN / "output", spec, _manifest(MC_RUN), max_error_samples=100, seed=0)
    assert scores.accuracy_summary == {
        "sum_choice": {"acc": 0.2, "acc_norm": 0.15},
        "parity": {"acc": 0.45, "acc_norm": 0.45},
    }
    assert scores.primary_metric == "acc"
    assert scores.primary_value == pytest.approx((0.2 + 0.45) / 2)
    # 16 + 11 wrong answers; the model "answered" the choice with the highest log-likelihood.
    assert len(scores.error_samples) == 27
    wrong = {(r["doc"]["question"]) for r in _samples(MC_RUN) if r["acc"] == 0.0}
    assert {s.question for s in scores.error_samples} == wrong
    for sample in scores.error_samples:
        assert sample.model_output != sample.gold
        assert sample.model_output  # one of the choices, never empty
    parity = next(s for s in scores.error_samples if s.question == "Is 921 even or odd?")
    assert (parity.gold, parity.model_output) == ("odd", "even")  # ll(even) -15.15 > ll(odd) -15.25


def test_metric_names_drop_the_none_filter_and_stderr() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith-mc")
    scores = parse_lm_eval_output(MC_RUN / "output", spec, _manifest(MC_RUN))
    for metrics in scores.accuracy_summary.values():
        assert all("," not in m and not m.endswith("_stderr") for m in metrics)


def test_error_samples_are_seeded() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    manifest = _manifest(GEN_RUN)
    a = parse_lm_eval_output(GEN_RUN / "output", spec, manifest, max_error_samples=5, seed=7)
    b = parse_lm_eval_output(GEN_RUN / "output", spec, manifest, max_error_samples=5, seed=7)
    c = parse_lm_eval_output(GEN_RUN / "output", spec, manifest, max_error_samples=5, seed=8)
    assert a.error_samples == b.error_samples
    assert [s.question for s in a.error_samples] != [s.question for s in c.error_samples]
    none = parse_lm_eval_output(GEN_RUN / "output", spec, manifest, max_error_samples=0, seed=7)
    assert none.error_samples == []


def test_scores_survive_the_event_round_trip() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith-mc")
    scores = parse_lm_eval_output(MC_RUN / "output", spec, _manifest(MC_RUN))
    assert BenchmarkScores.model_validate_json(scores.model_dump_json()) == scores


def test_missing_results_file(tmp_path: Path) -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    with pytest.raises(LmEvalOutputError, match="no results"):
        parse_lm_eval_output(tmp_path, spec, _manifest(GEN_RUN))


def test_results_of_another_benchmark_are_refused() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    mc_manifest = _manifest(MC_RUN)
    # The arith manifest's subsets against the MC run's output: its tasks are not there.
    with pytest.raises(LmEvalOutputError, match="no results for task ftbus_tiny_arith_addition"):
        parse_lm_eval_output(MC_RUN / "output", spec, _manifest(GEN_RUN))
    assert mc_manifest.benchmark == "tiny-arith-mc"


def test_missing_samples_file(tmp_path: Path) -> None:
    out = tmp_path / "output"
    shutil.copytree(GEN_RUN / "output", out)
    for f in out.rglob("samples_ftbus_tiny_arith_subtraction_*.jsonl"):
        f.unlink()
    with pytest.raises(LmEvalOutputError, match="no samples for task ftbus_tiny_arith_subtraction"):
        parse_lm_eval_output(out, load_benchmark(ASSETS, "tiny-arith"), _manifest(GEN_RUN))


def test_sample_count_must_match_the_manifest() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    bigger = make_split(spec, "validation", max_items=100).model_copy(
        update={"item_ids": {"addition": [f"x{i}" for i in range(21)], "subtraction": ["y"] * 20}})
    with pytest.raises(LmEvalOutputError, match="20 samples for 21 items"):
        parse_lm_eval_output(GEN_RUN / "output", spec, bigger)


def test_newest_results_file_wins(tmp_path: Path) -> None:
    out = tmp_path / "output"
    shutil.copytree(GEN_RUN / "output", out)
    (older,) = out.rglob("results_*.json")
    stale = json.loads(older.read_text())
    stale["results"]["ftbus_tiny_arith_addition"]["exact_match,none"] = 0.75
    # An earlier run of the same folder: its timestamp sorts first, so it is ignored.
    (older.parent / "results_2020-01-01T00-00-00.000000.json").write_text(json.dumps(stale))
    scores = parse_lm_eval_output(out, load_benchmark(ASSETS, "tiny-arith"), _manifest(GEN_RUN))
    assert scores.accuracy_summary["addition"]["exact_match"] == 0.0


# ------------------------------------------------------------------ task files and command


def test_rendered_tasks_match_the_ones_that_ran(tmp_path: Path) -> None:
    for bench, run in (("tiny-arith", GEN_RUN), ("tiny-arith-mc", MC_RUN)):
        spec = load_benchmark(ASSETS, bench)
        for subset in spec.subsets:
            ran = yaml.safe_load((run / "tasks" / f"{task_name(bench, subset.name)}.yaml").read_text())
            data_file = Path(ran["dataset_kwargs"]["data_files"]["test"])
            assert render_task_config(spec, subset.name, data_file) == ran


def test_task_config_shapes() -> None:
    gen = render_task_config(load_benchmark(ASSETS, "tiny-arith"), "addition", Path("/d/addition.jsonl"))
    assert gen["task"] == "ftbus_tiny_arith_addition"
    assert (gen["dataset_path"], gen["test_split"], gen["output_type"]) == ("json", "test", "generate_until")
    assert gen["dataset_kwargs"] == {"data_files": {"test": "/d/addition.jsonl"}}
    assert gen["generation_kwargs"] == {"until": ["\n"], "max_gen_toks": 16, "do_sample": False}
    assert [m["metric"] for m in gen["metric_list"]] == ["exact_match"]
    mc = render_task_config(load_benchmark(ASSETS, "tiny-arith-mc"), "sum_choice", Path("/d/s.jsonl"))
    assert mc["output_type"] == "multiple_choice"
    assert mc["doc_to_target"] == "{{choices.index(answer)}}"
    assert [m["metric"] for m in mc["metric_list"]] == ["acc", "acc_norm"]
    assert task_name("My Bench-2", "sub.set") == "ftbus_my_bench_2_sub_set"


def test_build_command_for_an_adapter(tmp_path: Path) -> None:
    model = ModelSelection("lora", tmp_path / "base", tmp_path / "adapter")
    argv = build_lm_eval_command(
        lm_eval="/tc/bin/lm_eval", model=model, tasks=["t1", "t2"], include_path=tmp_path / "tasks",
        output_path=tmp_path / "out", device="cuda", batch_size=4, apply_chat_template=True,
    )
    assert argv[:2] == ["/tc/bin/lm_eval", "run"]
    def opts(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert opts("--model") == "hf"
    assert opts("--model_args") == f"pretrained={tmp_path / 'base'},peft={tmp_path / 'adapter'}"
    assert opts("--tasks") == "t1,t2"
    assert opts("--include_path") == str(tmp_path / "tasks")
    assert opts("--device") == "cuda"
    assert opts("--batch_size") == "4"
    assert "--log_samples" in argv and argv[-1] == "--apply_chat_template"


def test_build_command_for_a_full_model_without_chat_template(tmp_path: Path) -> None:
    argv = build_lm_eval_command(
        lm_eval="lm_eval", model=ModelSelection("full", tmp_path / "m"), tasks=["t"],
        include_path=tmp_path, output_path=tmp_path, dtype="bfloat16",
    )
    assert f"pretrained={tmp_path / 'm'},dtype=bfloat16" in argv
    assert "--apply_chat_template" not in argv
    assert argv[argv.index("--device") + 1] == "cpu"


def test_paths_lm_eval_cannot_carry_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot carry"):
        build_lm_eval_command(lm_eval="lm_eval", model=ModelSelection("full", tmp_path / "a,b"),
                              tasks=["t"], include_path=tmp_path, output_path=tmp_path)


def test_env_is_offline_with_a_private_datasets_cache(tmp_path: Path) -> None:
    env = lm_eval_env(tmp_path)
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    assert env["HF_DATASETS_CACHE"].startswith(str(tmp_path.resolve()))


def test_select_model(tmp_path: Path) -> None:
    base, lora, full = tmp_path / "base", tmp_path / "lora", tmp_path / "full"
    for d in (base, lora, full):
        d.mkdir()
    (lora / "adapter_config.json").write_text("{}")
    (full / "model.safetensors").write_bytes(b"")
    assert select_model(base, lora) == ModelSelection("lora", base, lora)
    assert select_model(base, full) == ModelSelection("full", full)
    assert select_model(base, None) == ModelSelection("base", base)


def test_has_chat_template(tmp_path: Path) -> None:
    assert not has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert has_chat_template(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "chat_template.jinja").write_text("{{ x }}")
    assert has_chat_template(other)


def test_prepare_run_writes_data_tasks_and_argv(tmp_path: Path) -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    manifest = make_split(spec, "test", max_items=5)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "chat_template.jinja").write_text("{{ x }}")
    run = prepare_lm_eval_run(spec, manifest, tmp_path / "run", lm_eval="lm_eval",
                              model=select_model(model_dir, None), batch_size=2)
    assert run.tasks == ["ftbus_tiny_arith_addition", "ftbus_tiny_arith_subtraction"]
    assert sorted(p.name for p in (tmp_path / "run" / "tasks").iterdir()) == [
        "ftbus_tiny_arith_addition.yaml", "ftbus_tiny_arith_subtraction.yaml"]
    rows = (tmp_path / "run" / "data" / "addition.jsonl").read_text().splitlines()
    assert [json.loads(r)["id"] for r in rows] == manifest.item_ids["addition"]
    assert "--apply_chat_template" in run.argv  # the tokenizer has a template
    assert run.output_dir == tmp_path / "run" / "output"


def test_a_chat_model_gets_the_benchmarks_chat_variant_humaneval_instruct(tmp_path: Path) -> None:
    from evaluation.catalogue import HUMANEVAL_CHAT_GEN_PREFIX, HUMANEVAL_CHAT_PROMPT
    from evaluation.importer import import_benchmark

    import_benchmark(tmp_path, "humaneval")
    spec = load_benchmark(tmp_path, "humaneval")
    plain = render_task_config(spec, "humaneval", tmp_path / "h.jsonl")
    chat = render_task_config(spec, "humaneval", tmp_path / "h.jsonl", chat=True)
    assert plain["doc_to_text"] == "{{question}}" and "gen_prefix" not in plain
    assert (chat["doc_to_text"], chat["gen_prefix"]) == (HUMANEVAL_CHAT_PROMPT, HUMANEVAL_CHAT_GEN_PREFIX)
    assert chat["metadata"]["ftbus_chat_variant"] is True
    # The stops stay human-eval's: the reply is already inside the fence, after the prompt.
    assert chat["generation_kwargs"]["until"] == plain["generation_kwargs"]["until"]
