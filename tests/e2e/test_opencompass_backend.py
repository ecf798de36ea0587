"""The OpenCompass backend for real: the `opencompass` of its own env on the tiny model, base and
base + a LoRA adapter trained by examples/lora, beside lm-eval on the same split.

Skipped, with the reason, when the OpenCompass env is absent: `make test` does not build it (~2 min,
~2.1 GB). Build it with `deploy/opencompass/install.sh` (default <repo>/.opencompass), or point
FTBUS_OPENCOMPASS_BIN at another env's bin folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluation import backends
from evaluation.models import ModelSelection, select_model
from evaluation.registry import load_benchmark
from evaluation.splits import SplitManifest, make_split
from shared.events import BenchmarkScores
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def opencompass_settings() -> SimpleNamespace:
    # FTBUS_OPENCOMPASS_BIN, else the `opencompass_bin` setting once Settings has it, else the repo's env.
    configured = os.environ.get("FTBUS_OPENCOMPASS_BIN") or getattr(Settings(), "opencompass_bin", None)
    settings = SimpleNamespace(opencompass_bin=Path(configured) if configured else None)
    bin_dir = backends.opencompass_bin(settings)
    if bin_dir is None or not (bin_dir / "opencompass").exists():
        where = bin_dir or backends.REPO_OPENCOMPASS_BIN
        pytest.skip(f"the OpenCompass env is not installed ({where}/opencompass is missing): run "
                    "deploy/opencompass/install.sh (~2 min, not part of make test) or set FTBUS_OPENCOMPASS_BIN")
    return SimpleNamespace(opencompass_bin=bin_dir)


@pytest.fixture(scope="module")
def lora_adapter(tmp_path_factory: pytest.TempPathFactory, real_assets: Path, toolchain_bin: Path) -> Path:
    """examples/lora trained for real (15 steps, ~10 s), as the data and train stages would run it."""
    workspace = tmp_path_factory.mktemp("lora")
    shutil.copytree(REPO / "examples" / "lora", workspace, dirs_exist_ok=True)
    env = {**os.environ, **OFFLINE, "FT_DATASET_PATH": str(real_assets / "datasets")}
    subprocess.run([sys.executable, "process_data.py"], cwd=workspace, env=env, check=True, capture_output=True)
    train = workspace / "train.yaml"
    # An absolute base path, as the trainer stage writes it: adapter_config.json records it.
    model = real_assets / "models" / "tiny-llama"
    train.write_text(re.sub(r"(?m)^model_name_or_path: .*$", f"model_name_or_path: {model}", train.read_text()))
    done = subprocess.run([str(toolchain_bin / "llamafactory-cli"), "train", "train.yaml"], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (workspace / "output" / "adapter_model.safetensors").is_file()
    return workspace / "output"


def _run(
    backend: str,
    real_assets: Path,
    bench: str,
    run_dir: Path,
    model: ModelSelection,
    settings: SimpleNamespace,
    toolchain_bin: Path,
) -> tuple[subprocess.CompletedProcess[str], Path, SplitManifest]:
    spec = load_benchmark(real_assets, bench)
    manifest = make_split(spec, "validation")
    argv, env, output_dir = backends.prepare_run(backend, spec, manifest, run_dir, model=model, device="cpu",
                                                 settings=settings)
    # As the stage runner does: a scrubbed environment, the toolchain first on PATH (lm_eval is found there).
    full_env = {"PATH": f"{toolchain_bin}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": os.environ.get("HOME", "/"),
                **env}
    done = subprocess.run(argv, cwd=run_dir, env=full_env, capture_output=True, text=True, timeout=600)
    (run_dir / backends.LOG_FILES[backend]).write_text(done.stdout + done.stderr)
    return done, output_dir, manifest


def _scores(backend: str, real_assets: Path, bench: str, done: subprocess.CompletedProcess[str], output_dir: Path,
            manifest: SplitManifest) -> BenchmarkScores:
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return backends.parse_run(backend, output_dir, load_benchmark(real_assets, bench), manifest,
                              max_error_samples=1000, seed=0)


def test_lora_generation_matches_lm_eval(
    opencompass_settings: SimpleNamespace, lora_adapter: Path, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    model = select_model(real_assets / "models" / "tiny-llama", lora_adapter)
    assert model.kind == "lora"
    runs = {}
    for backend in backends.BACKENDS:
        run_dir = tmp_path / backend
        run_dir.mkdir()
        done, out, manifest = _run(backend, real_assets, "tiny-arith", run_dir, model, opencompass_settings,
                                   toolchain_bin)
        runs[backend] = _scores(backend, real_assets, "tiny-arith", done, out, manifest)
    oc, lm = runs["opencompass"], runs["lm-eval"]
    assert set(oc.accuracy_summary) == {"addition", "subtraction"}
    assert all(set(m) == {"exact_match"} for m in oc.accuracy_summary.values())
    assert oc.item_ids == lm.item_ids == manifest.item_ids
    assert oc.primary_metric == "exact_match"
    # Greedy decoding through the same chat template, base + adapter: the same answers and scores.
    # (The base model alone says " 555 ..."; the 15-step adapter says "": this also shows it loaded.)
    assert oc.accuracy_summary == lm.accuracy_summary
    assert {(s.question, s.model_output) for s in oc.error_samples} == \
        {(s.question, s.model_output) for s in lm.error_samples}


def test_base_model_multiple_choice(
    opencompass_settings: SimpleNamespace, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    model = select_model(real_assets / "models" / "tiny-llama", None)
    done, out, manifest = _run("opencompass", real_assets, "tiny-arith-mc", tmp_path, model, opencompass_settings,
                               toolchain_bin)
    scores = _scores("opencompass", real_assets, "tiny-arith-mc", done, out, manifest)
    assert set(scores.accuracy_summary) == {"sum_choice", "parity"}
    for metrics in scores.accuracy_summary.values():
        assert set(metrics) == {"acc"} and 0.0 <= metrics["acc"] <= 1.0
    assert scores.item_ids == manifest.item_ids
    spec = load_benchmark(real_assets, "tiny-arith-mc")
    choices = {i.question: i.choices for s in spec.subsets for i in spec.items(s.name)}
    wrong = round(sum((1 - m["acc"]) * len(manifest.item_ids[s]) for s, m in scores.accuracy_summary.items()))
    assert len(scores.error_samples) == wrong
    for sample in scores.error_samples:
        assert sample.model_output in choices[sample.question] and sample.model_output != sample.gold


def test_a_failing_run_fails_the_command(
    opencompass_settings: SimpleNamespace, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    """--debug: a task that raises makes `opencompass` exit non-zero (without it, it logs and exits 0)."""
    missing = tmp_path / "no-such-adapter"
    model = ModelSelection("lora", real_assets / "models" / "tiny-llama", missing)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done, out, manifest = _run("opencompass", real_assets, "tiny-arith", run_dir, model, opencompass_settings,
                               toolchain_bin)
    assert done.returncode != 0
    with pytest.raises(backends.OUTPUT_ERRORS):
        backends.parse_run("opencompass", out, load_benchmark(real_assets, "tiny-arith"), manifest)
