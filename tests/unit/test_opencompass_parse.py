"""OpenCompass backend: config rendering, and parsing of REAL OpenCompass 0.5.4 output
(tests/fixtures/opencompass, captured from the env deploy/opencompass/install.sh builds).

Also the backend dispatch (evaluation/backends.py), checked against both backends' fixtures.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluation import backends
from evaluation.lmeval import parse_lm_eval_output
from evaluation.models import ModelSelection
from evaluation.opencompass import (
    MODEL_ABBR,
    PLUGIN_MODULE,
    PLUGIN_SOURCE,
    OpenCompassOutputError,
    OpenCompassUnsupported,
    build_opencompass_command,
    dataset_abbr,
    find_run_dir,
    opencompass_env,
    parse_opencompass_output,
    prepare_opencompass_run,
    read_summary,
)
from evaluation.registry import BenchmarkSpec, load_benchmark
from evaluation.splits import SplitManifest, make_split
from shared.events import BenchmarkScores

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OC = FIXTURES / "opencompass"
ASSETS = OC / "assets"
GEN_RUN = OC / "tiny-arith-validation-lora"
MC_RUN = OC / "tiny-arith-mc-validation-base"
LMEVAL_GEN_RUN = FIXTURES / "lmeval" / "tiny-arith-validation-lora"
LMEVAL_MC_RUN = FIXTURES / "lmeval" / "tiny-arith-mc-validation-base"

# Where the fixtures were captured (absolute paths recorded in their config.py).
CAPTURED_ROOT = "/tmp/oc-fixture2"
CAPTURED_MODEL = "/tmp/ocwork/assets/models/tiny-llama"
CAPTURED_ADAPTER = "/tmp/ocwork/lora/output"


def _manifest(run: Path) -> SplitManifest:
    return SplitManifest.model_validate_json((run / "data" / "manifest.json").read_text())


def _spec(name: str) -> BenchmarkSpec:
    return load_benchmark(ASSETS, name)


def _results(run: Path, abbr: str) -> dict:
    (path,) = (run / "output").glob(f"*/results/{MODEL_ABBR}/{abbr}.json")
    return json.loads(path.read_text())


# ------------------------------------------------------------------ parsing real output


def test_parse_generate_until_run() -> None:
    spec = _spec("tiny-arith")
    manifest = _manifest(GEN_RUN)
    scores = parse_opencompass_output(GEN_RUN / "output", spec, manifest, max_error_samples=10, seed=0)
    assert isinstance(scores, BenchmarkScores)
    assert scores.accuracy_summary == {"addition": {"exact_match": 0.0}, "subtraction": {"exact_match": 0.0}}
    assert (scores.primary_metric, scores.higher_is_better, scores.primary_value) == ("exact_match", True, 0.0)
    assert scores.item_ids == manifest.item_ids
    # All 40 answers are wrong: 10 are drawn, each a real item of the split with its gold answer.
    assert len(scores.error_samples) == 10
    items = {i.question: i.answer for s in ("addition", "subtraction") for i in spec.items(s)}
    for sample in scores.error_samples:
        assert items[sample.question] == sample.gold
        assert sample.model_output == ""  # what the 15-step adapter generated (lm-eval saw the same)


def test_parse_multiple_choice_run() -> None:
    spec = _spec("tiny-arith-mc")
    scores = parse_opencompass_output(MC_RUN / "output", spec, _manifest(MC_RUN), max_error_samples=100, seed=0)
    # OpenCompass's percentages, on lm-eval's 0-1 scale and under lm-eval's metric name.
    assert scores.accuracy_summary == {"sum_choice": {"acc": 0.1}, "parity": {"acc": 0.45}}
    assert scores.primary_metric == "acc"
    assert scores.primary_value == pytest.approx((0.1 + 0.45) / 2)
    # 18 + 11 wrong answers, exactly the items the evaluator marked wrong.
    assert len(scores.error_samples) == 29
    wrong = set()
    for subset in ("sum_choice", "parity"):
        questions = [i.question for i in spec.items(subset) if i.id in _manifest(MC_RUN).item_ids[subset]]
        details = _results(MC_RUN, dataset_abbr(spec, subset))["details"]
        wrong |= {q for q, d in zip(questions, details, strict=True) if d["correct"] == [False]}
    assert {s.question for s in scores.error_samples} == wrong
    choices = {i.question: i.choices for s in ("sum_choice", "parity") for i in spec.items(s)}
    for sample in scores.error_samples:
        assert sample.model_output != sample.gold
        assert sample.model_output in choices[sample.question]  # the choice text, not the label
    parity = next(s for s in scores.error_samples if s.question == "Is 921 even or odd?")
    assert (parity.gold, parity.model_output) == ("odd", "even")  # PPL(even) 7.132 < PPL(odd) 7.151


def test_keys_match_the_lm_eval_backend() -> None:
    """The same benchmark split through either backend: same subsets, metric names and item ids."""
    for bench, oc_run, lm_run in (("tiny-arith", GEN_RUN, LMEVAL_GEN_RUN), ("tiny-arith-mc", MC_RUN, LMEVAL_MC_RUN)):
        spec = _spec(bench)
        assert _manifest(oc_run) == _manifest(lm_run)
        oc = parse_opencompass_output(oc_run / "output", spec, _manifest(oc_run))
        lm = parse_lm_eval_output(lm_run / "output", spec, _manifest(lm_run))
        assert oc.accuracy_summary.keys() == lm.accuracy_summary.keys()
        for subset, metrics in oc.accuracy_summary.items():
            assert set(metrics) <= set(lm.accuracy_summary[subset])
            assert spec.primary_metric in metrics
        assert oc.item_ids == lm.item_ids
        assert oc.primary_metric == lm.primary_metric
    # Greedy generation with the same chat template: the two backends agree on the gen split.
    gen = _spec("tiny-arith")
    assert parse_opencompass_output(GEN_RUN / "output", gen, _manifest(GEN_RUN)).accuracy_summary == \
        parse_lm_eval_output(LMEVAL_GEN_RUN / "output", gen, _manifest(LMEVAL_GEN_RUN)).accuracy_summary


def test_error_samples_are_seeded() -> None:
    spec = _spec("tiny-arith")
    manifest = _manifest(GEN_RUN)
    a = parse_opencompass_output(GEN_RUN / "output", spec, manifest, max_error_samples=5, seed=7)
    b = parse_opencompass_output(GEN_RUN / "output", spec, manifest, max_error_samples=5, seed=7)
    c = parse_opencompass_output(GEN_RUN / "output", spec, manifest, max_error_samples=5, seed=8)
    assert a.error_samples == b.error_samples
    assert [s.question for s in a.error_samples] != [s.question for s in c.error_samples]
    none = parse_opencompass_output(GEN_RUN / "output", spec, manifest, max_error_samples=0, seed=7)
    assert none.error_samples == []


def test_scores_survive_the_event_round_trip() -> None:
    scores = parse_opencompass_output(MC_RUN / "output", _spec("tiny-arith-mc"), _manifest(MC_RUN))
    assert BenchmarkScores.model_validate_json(scores.model_dump_json()) == scores


def test_summary_csv_is_pivoted_by_dataset_and_metric() -> None:
    table = read_summary(find_run_dir(MC_RUN / "output"))
    assert table == {"tiny-arith-mc__sum_choice": {"acc": 10.0}, "tiny-arith-mc__parity": {"acc": 45.0}}


def test_unrounded_results_beat_the_rounded_summary(tmp_path: Path) -> None:
    out = tmp_path / "output"
    shutil.copytree(MC_RUN / "output", out)
    (results,) = out.glob(f"*/results/{MODEL_ABBR}/tiny-arith-mc__parity.json")
    data = json.loads(results.read_text())
    data["acc"] = 100 / 3  # the summary CSV would say 33.33
    results.write_text(json.dumps(data))
    (summary,) = out.glob("*/summary/*.csv")
    summary.write_text(summary.read_text().replace("parity,0fbf70,acc,ppl,45.00", "parity,0fbf70,acc,ppl,33.33"))
    scores = parse_opencompass_output(out, _spec("tiny-arith-mc"), _manifest(MC_RUN))
    assert scores.accuracy_summary["parity"]["acc"] == pytest.approx(1 / 3, abs=1e-12)


def test_missing_scores_in_the_summary_are_skipped_then_refused(tmp_path: Path) -> None:
    out = tmp_path / "output"
    shutil.copytree(GEN_RUN / "output", out)
    (summary,) = out.glob("*/summary/*.csv")
    # OpenCompass writes "-" for a dataset whose evaluation failed.
    summary.write_text(summary.read_text().replace("subtraction,efb986,exact_match,gen,0.00",
                                                   "subtraction,efb986,exact_match,gen,-"))
    assert "tiny-arith__subtraction" not in read_summary(find_run_dir(out))
    with pytest.raises(OpenCompassOutputError, match="no scores for tiny-arith__subtraction"):
        parse_opencompass_output(out, _spec("tiny-arith"), _manifest(GEN_RUN))


def test_newest_run_with_a_summary_wins(tmp_path: Path) -> None:
    out = tmp_path / "output"
    shutil.copytree(GEN_RUN / "output", out)
    (captured,) = [p for p in out.iterdir() if p.is_dir()]
    # An older complete run with another score, and a newer one that died before its summary.
    older = out / "20200101_000000"
    shutil.copytree(captured, older)
    (csv_file,) = (older / "summary").glob("*.csv")
    csv_file.write_text(csv_file.read_text().replace("addition,efb986,exact_match,gen,0.00",
                                                     "addition,efb986,exact_match,gen,75.00"))
    (out / "29991231_235959" / "predictions").mkdir(parents=True)
    assert find_run_dir(out) == captured
    scores = parse_opencompass_output(out, _spec("tiny-arith"), _manifest(GEN_RUN))
    assert scores.accuracy_summary["addition"]["exact_match"] == 0.0


def test_missing_summary(tmp_path: Path) -> None:
    with pytest.raises(OpenCompassOutputError, match="no <timestamp>/summary"):
        parse_opencompass_output(tmp_path, _spec("tiny-arith"), _manifest(GEN_RUN))
    with pytest.raises(OpenCompassOutputError, match="no <timestamp>/summary"):
        parse_opencompass_output(tmp_path / "absent", _spec("tiny-arith"), _manifest(GEN_RUN))


def test_missing_results_file(tmp_path: Path) -> None:
    out = tmp_path / "output"
    shutil.copytree(GEN_RUN / "output", out)
    for f in out.glob(f"*/results/{MODEL_ABBR}/tiny-arith__addition.json"):
        f.unlink()
    with pytest.raises(OpenCompassOutputError, match=r"no results/<model>/tiny-arith__addition\.json"):
        parse_opencompass_output(out, _spec("tiny-arith"), _manifest(GEN_RUN))


def test_results_of_another_benchmark_are_refused() -> None:
    with pytest.raises(OpenCompassOutputError, match="no scores for tiny-arith__addition"):
        parse_opencompass_output(MC_RUN / "output", _spec("tiny-arith"), _manifest(GEN_RUN))


def test_detail_count_must_match_the_manifest() -> None:
    spec = _spec("tiny-arith")
    bigger = make_split(spec, "validation", max_items=100).model_copy(
        update={"item_ids": {"addition": [f"x{i}" for i in range(21)], "subtraction": ["y"] * 20}})
    with pytest.raises(OpenCompassOutputError, match="20 evaluated items for 21"):
        parse_opencompass_output(GEN_RUN / "output", spec, bigger)


def test_reference_correctness_keys(tmp_path: Path) -> None:
    """Details from other evaluators: the reference's keys and truthy strings decide correctness."""
    out = tmp_path / "output"
    shutil.copytree(GEN_RUN / "output", out)
    (results,) = out.glob(f"*/results/{MODEL_ABBR}/tiny-arith__addition.json")
    data = json.loads(results.read_text())
    verdicts = [{"is_correct": True}, {"cascade_correct": "YES"}, {"exact_match": 1}, {"correct": "A"},
                {"correct": [True, False]}, {}]
    for detail, verdict in zip(data["details"], verdicts, strict=False):
        del detail["correct"]
        detail.update(verdict)
    results.write_text(json.dumps(data))
    scores = parse_opencompass_output(out, _spec("tiny-arith"), _manifest(GEN_RUN), max_error_samples=100)
    # 4 of the 40 are now correct; [True, False] needs all, and no verdict counts as an error.
    assert len(scores.error_samples) == 36


# ------------------------------------------------------------------ config and command


def _fake_model(root: Path, chat: bool = True) -> Path:
    model = root / "model"
    model.mkdir()
    if chat:
        (model / "chat_template.jinja").write_text("{{ x }}")
    return model


@pytest.mark.parametrize("run", [GEN_RUN, MC_RUN], ids=["gen-lora", "mc-base"])
def test_rendered_files_match_the_ones_that_ran(run: Path, tmp_path: Path) -> None:
    """prepare_opencompass_run today writes what OpenCompass ran for the fixtures (paths aside):
    the parse tests read output of the current config, not of an older one."""
    spec = _spec("tiny-arith" if run == GEN_RUN else "tiny-arith-mc")
    model_dir = _fake_model(tmp_path)
    adapter = tmp_path / "adapter"
    model = ModelSelection("lora", model_dir, adapter) if run == GEN_RUN else ModelSelection("base", model_dir)
    run_dir = tmp_path / "run"
    prepared = prepare_opencompass_run(spec, _manifest(run), run_dir, opencompass="opencompass", model=model)
    captured = (run / "config.py").read_text()
    for old, new in ((f"{CAPTURED_ROOT}/{run.name}", str(run_dir.resolve())), (CAPTURED_ADAPTER, str(adapter)),
                     (CAPTURED_MODEL, str(model_dir))):
        captured = captured.replace(old, new)
    assert (run_dir / "config.py").read_text() == captured
    assert (run_dir / f"{PLUGIN_MODULE}.py").read_text() == (run / f"{PLUGIN_MODULE}.py").read_text()
    for f in (run / "data").iterdir():
        assert (run_dir / "data" / f.name).read_text() == f.read_text()
    assert prepared.datasets == {s.name: dataset_abbr(spec, s.name) for s in spec.subsets}


def test_config_shapes(tmp_path: Path) -> None:
    spec = _spec("tiny-arith")
    model_dir = _fake_model(tmp_path, chat=False)
    run = prepare_opencompass_run(spec, make_split(spec, "test", 5), tmp_path / "run",
                                  opencompass="/oc/bin/opencompass", model=ModelSelection("full", model_dir),
                                  device="cuda")
    text = (tmp_path / "run" / "config.py").read_text()
    ast.parse(text)  # valid Python; OpenCompass's own classes cannot be imported here
    assert "'type': HuggingFaceBaseModel" in text  # no chat template: the base wrapper
    assert "peft_path" not in text
    assert "'num_gpus': 1" in text and "'device_map': 'auto'" in text and "'torch_dtype': 'auto'" in text
    assert "'max_out_len': 16" in text and "'stopping_criteria': [\n                    '\\n'," in text
    assert "vllm" not in text.lower()
    assert run.argv == ["/oc/bin/opencompass", str((tmp_path / "run" / "config.py").resolve()), "--work-dir",
                        str((tmp_path / "run" / "output").resolve()), "--debug"]
    assert run.output_dir == tmp_path / "run" / "output"
    rows = (tmp_path / "run" / "data" / "addition.jsonl").read_text().splitlines()
    assert [json.loads(r)["id"] for r in rows] == make_split(spec, "test", 5).item_ids["addition"]


def test_chat_models_generate_through_the_chat_wrapper(tmp_path: Path) -> None:
    spec = _spec("tiny-arith")
    model = ModelSelection("lora", _fake_model(tmp_path), tmp_path / "adapter")
    prepare_opencompass_run(spec, make_split(spec, "test", 5), tmp_path / "run", opencompass="oc", model=model)
    text = (tmp_path / "run" / "config.py").read_text()
    assert "'type': HuggingFacewithChatTemplate" in text
    assert f"'peft_path': '{tmp_path / 'adapter'}'" in text
    assert "'torch_dtype': 'float32'" in text and "'num_gpus': 0" in text
    # The chat wrapper applies the template itself: the loader must not apply it twice.
    assert "chat_template_from" not in text


def test_acc_norm_is_refused(tmp_path: Path) -> None:
    spec = _spec("tiny-arith-mc").model_copy(update={"primary_metric": "acc_norm"})
    with pytest.raises(OpenCompassUnsupported, match="not acc_norm"):
        prepare_opencompass_run(spec, make_split(spec, "test", 5), tmp_path, opencompass="oc",
                                model=ModelSelection("base", _fake_model(tmp_path)))


def test_subsets_with_varying_choice_counts_are_refused(tmp_path: Path) -> None:
    bench = tmp_path / "assets" / "benchmarks" / "ragged"
    bench.mkdir(parents=True)
    (bench / "benchmark.yaml").write_text(
        "name: ragged\nkind: multiple_choice\nprimary_metric: acc\nsubsets: [{name: s, file: s.jsonl}]\n")
    items = [{"id": f"q{i}", "question": f"q{i}?", "choices": ["a", "b", "c"][: 2 + i % 2], "answer": "a"}
             for i in range(4)]
    (bench / "s.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    spec = load_benchmark(tmp_path / "assets", "ragged")
    with pytest.raises(OpenCompassUnsupported, match=r"\[2, 3\] choices"):
        prepare_opencompass_run(spec, make_split(spec, "test", 5), tmp_path / "run", opencompass="oc",
                                model=ModelSelection("base", _fake_model(tmp_path)))


def test_plugin_is_valid_python() -> None:
    compile(PLUGIN_SOURCE, f"{PLUGIN_MODULE}.py", "exec")


def test_command_and_env(tmp_path: Path) -> None:
    argv = build_opencompass_command(opencompass="oc", config=tmp_path / "c.py", work_dir=tmp_path / "o", debug=False)
    assert argv == ["oc", str(tmp_path / "c.py"), "--work-dir", str(tmp_path / "o")]
    env = opencompass_env(tmp_path)
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    assert env["PYTHONPATH"] == str(tmp_path.resolve())  # config.py imports the plugin from the run dir
    assert env["HF_DATASETS_CACHE"].startswith(str(tmp_path.resolve()))


# ------------------------------------------------------------------ backend dispatch


def test_executables_per_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert backends.EXECUTABLES == {"lm-eval": "lm_eval", "opencompass": "opencompass"}
    assert backends.resolve_executable("lm-eval") == "lm_eval"
    bin_dir = tmp_path / "oc" / "bin"
    bin_dir.mkdir(parents=True)
    settings = SimpleNamespace(opencompass_bin=bin_dir)
    with pytest.raises(backends.BackendUnavailable, match=r"deploy/opencompass/install\.sh"):
        backends.resolve_executable("opencompass", settings)
    (bin_dir / "opencompass").write_text("#!/bin/sh\n")
    assert backends.resolve_executable("opencompass", settings) == str(bin_dir / "opencompass")
    # Unset setting, no repository env: PATH, else a clear error.
    monkeypatch.setattr(backends, "REPO_OPENCOMPASS_BIN", tmp_path / "absent")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert backends.opencompass_bin(SimpleNamespace()) is None
    with pytest.raises(backends.BackendUnavailable, match="no OpenCompass env was found"):
        backends.resolve_executable("opencompass", SimpleNamespace(opencompass_bin=None))
    with pytest.raises(ValueError, match="unknown benchmark backend"):
        backends.resolve_executable("helm")


def test_prepare_run_dispatches(tmp_path: Path) -> None:
    spec = _spec("tiny-arith")
    manifest = make_split(spec, "validation", 5)
    model = ModelSelection("base", _fake_model(tmp_path))
    argv, _env, out = backends.prepare_run("lm-eval", spec, manifest, tmp_path / "lm", model=model, device="cpu")
    assert argv[:2] == ["lm_eval", "run"] and out == tmp_path / "lm" / "output"
    settings = SimpleNamespace(opencompass_bin=tmp_path / "bin")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "opencompass").write_text("")
    run = backends.prepare_run("opencompass", spec, manifest, tmp_path / "oc", model=model, device="cpu",
                               settings=settings)
    assert run.argv[0] == str(tmp_path / "bin" / "opencompass")
    assert run.env["PYTHONPATH"] == str((tmp_path / "oc").resolve())
    assert (tmp_path / "oc" / "config.py").is_file()


def test_parse_run_dispatches() -> None:
    spec = _spec("tiny-arith-mc")
    oc = backends.parse_run("opencompass", MC_RUN / "output", spec, _manifest(MC_RUN), 3, 0)
    lm = backends.parse_run("lm-eval", LMEVAL_MC_RUN / "output", spec, _manifest(LMEVAL_MC_RUN), 3, 0)
    assert oc.accuracy_summary.keys() == lm.accuracy_summary.keys()
    assert len(oc.error_samples) == len(lm.error_samples) == 3
    with pytest.raises(backends.OUTPUT_ERRORS):
        backends.parse_run("opencompass", LMEVAL_MC_RUN / "output", spec, _manifest(MC_RUN))
    with pytest.raises(backends.OUTPUT_ERRORS):
        backends.parse_run("lm-eval", MC_RUN / "output", spec, _manifest(MC_RUN))


def test_both_backends_keep_the_backend_protocol_and_neither_imports_the_other() -> None:
    import ast
    from pathlib import Path

    for backend in backends.REGISTRY.values():
        assert isinstance(backend, backends.Backend) and callable(backend.prepare) and callable(backend.parse)
        assert backends.LOG_FILES[backend.name] == backend.log_file
    folder = Path(backends.__file__).parent
    for mine, other in (("lmeval", "opencompass"), ("opencompass", "lmeval")):
        tree = ast.parse((folder / f"{mine}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert f"evaluation.{other}" not in imported, f"{mine} imports {other}"
