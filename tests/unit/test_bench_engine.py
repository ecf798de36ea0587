"""The warm engine's worker side without the toolchain: what of a model the engine gets to see.
(The engine itself, with the real lm-eval: tests/e2e/test_bench_engine.py.)"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from evaluation.warm import ENGINE_SCRIPT, OWNER_FILE, WarmEngine, _link_files, engines_dir, reap_engine_folders
from runners.base import LocalRunner
from runners.sandbox import host_identity
from shared.settings import Settings


def test_candidate_files_are_linked_in_and_symlinks_left_out(tmp_path: Path) -> None:
    source = tmp_path / "output"
    source.mkdir()
    (source / "adapter_model.safetensors").write_bytes(b"weights")
    (source / "adapter_config.json").write_text("{}")
    (source / "checkpoint-10").mkdir()
    secret = tmp_path / "benchmarks" / "test.jsonl"
    secret.parent.mkdir()
    secret.write_text("hidden")
    (source / "tokenizer.json").symlink_to(secret)

    dest = tmp_path / "exchange" / "model-1" / "peft"
    _link_files(source, dest)

    assert sorted(p.name for p in dest.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    # A hard link: no copy of a multi-gigabyte model.
    assert (dest / "adapter_model.safetensors").stat().st_ino == (source / "adapter_model.safetensors").stat().st_ino


def test_base_models_are_seen_in_place_anything_else_through_the_exchange(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", assets_dir=tmp_path / "assets")
    base = settings.assets / "models" / "tiny"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    engine = WarmEngine(LocalRunner([]), settings, tmp_path / "engine")

    assert engine._visible(base, engine.exchange / "m") == base.resolve()
    assert engine._visible(elsewhere, engine.exchange / "m") == engine.exchange / "m"
    assert (engine.exchange / "m" / "config.json").is_file()


def test_the_engine_script_imports_nothing_of_ftbus() -> None:
    text = ENGINE_SCRIPT.read_text()
    for package in ("services", "shared", "evaluation", "runners", "ftbus."):
        assert f"from {package}" not in text and f"import {package}" not in text


def test_a_dead_workers_engine_folder_is_removed_and_no_other(tmp_path: Path) -> None:
    """A bench worker killed without stopping (SIGKILL, OOM) leaves its engine folder, with a
    candidate's weights in its exchange; the next worker to start removes it, and only it."""
    settings = Settings(home=tmp_path / "home")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    folders = {
        "dead": f"{socket.gethostname()}:{dead.stdout.strip()}:12345.00",
        "alive": host_identity(),
        "elsewhere": "another-host:1:1.00",
        "starting": None,  # no owner file yet
    }
    for name, owner in folders.items():
        exchange = engines_dir(settings) / name / "exchange" / "model-1"
        exchange.mkdir(parents=True)
        (exchange / "adapter_model.safetensors").write_bytes(b"weights")
        if owner is not None:
            (engines_dir(settings) / name / OWNER_FILE).write_text(owner)
    removed = reap_engine_folders(settings)
    assert [p.name for p in removed] == ["dead"]
    assert sorted(p.name for p in engines_dir(settings).iterdir()) == ["alive", "elsewhere", "starting"]
    assert reap_engine_folders(Settings(home=tmp_path / "empty")) == []


def test_the_engine_loads_each_model_with_the_gpu_settings_of_its_job(tmp_path: Path) -> None:
    """The vLLM settings (vllm_gpu_memory_utilization, vllm_max_model_len, vllm_enforce_eager) and
    the request's seed reach the model the engine loads, through the job the worker writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ftbus_engine_under_test", ENGINE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen: dict[str, object] = {}

    def lm_eval_model(pretrained: str, peft: str | None, **kwargs: object) -> tuple[str, dict[str, object]]:
        seen.update(kwargs, pretrained=pretrained, peft=peft)
        return "vllm", {"pretrained": pretrained, "trust_remote_code": False}

    class Registry:
        @staticmethod
        def get_model(name: str) -> object:
            class Model:
                @staticmethod
                def create_from_arg_obj(args: dict[str, object], extra: dict[str, object]) -> tuple[str, dict]:
                    return name, {**args, **extra}

            return Model

    engine = module.Engine.__new__(module.Engine)  # without importing the harness
    engine.exchange, engine.lm_eval_model, engine.registry = tmp_path, lm_eval_model, Registry
    settings = Settings(home=tmp_path, vllm_gpu_memory_utilization=0.5, vllm_max_model_len=2048,
                        vllm_enforce_eager=False)
    job = {"model": {"pretrained": "/m", "peft": "/a"}, "device": "cuda", "gpus": 2, "dtype": None, "seed": 7,
           "vllm": {"gpu_memory_utilization": settings.vllm_gpu_memory_utilization,
                    "max_model_len": settings.vllm_max_model_len, "enforce_eager": settings.vllm_enforce_eager,
                    "trust_remote_code": True}}
    (name, loaded), _ = engine._load(3, job)
    assert seen == {"pretrained": "/m", "peft": "/a", "device": "cuda", "gpus": 2, "dtype": None,
                    "scratch": str(tmp_path / "scratch-3"), "seed": 7, "gpu_memory_utilization": 0.5,
                    "max_model_len": 2048, "enforce_eager": False}
    assert name == "vllm" and "trust_remote_code" not in loaded


def test_removing_a_dead_workers_engine_folder_never_follows_a_link_out_of_it(tmp_path: Path) -> None:
    """The exchange folder was the engine container's to write: a link left there to something
    outside (the benchmarks folder, say) is removed as a link, never followed."""
    settings = Settings(home=tmp_path / "home")
    outside = tmp_path / "benchmarks"
    (outside / "test").mkdir(parents=True)
    (outside / "test" / "items.jsonl").write_text("secret")
    folder = engines_dir(settings) / "dead"
    (folder / "exchange").mkdir(parents=True)
    (folder / "exchange" / "link").symlink_to(outside, target_is_directory=True)
    (folder / "exchange" / "file-link").symlink_to(outside / "test" / "items.jsonl")
    (folder / OWNER_FILE).write_text(f"{socket.gethostname()}:999999999:1.00")
    assert [p.name for p in reap_engine_folders(settings)] == ["dead"]
    assert not folder.exists()
    assert (outside / "test" / "items.jsonl").read_text() == "secret"
