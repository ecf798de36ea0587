"""Data cache key: changes exactly when the data could change."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from services.data import cache
from services.data.cache import data_cache_key
from services.data.env import data_processing_env
from shared.settings import Settings


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "process_data.py").write_text("import json\njson.dump([{'instruction': 'a'}], open('data.json', 'w'))\n")
    (ws / "dataset_info.json").write_text('{"processed_data": {"file_name": "data.json"}}')
    (ws / "train.yaml").write_text("model_name_or_path: tiny\nlearning_rate: 1.0e-4\n")
    return ws


@pytest.fixture
def datasets(tmp_path: Path) -> list[Path]:
    root = tmp_path / "assets" / "datasets"
    gsm = root / "gsm8k"
    (gsm / "train").mkdir(parents=True)
    (gsm / "train" / "part-0.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    (gsm / "README.md").write_text("gsm8k\n")
    alpaca = root / "alpaca"
    alpaca.mkdir()
    (alpaca / "data.json").write_text("[]")
    return [gsm, alpaca]


def test_key_is_stable_sha256_hex(workspace: Path, datasets: list[Path]) -> None:
    key = data_cache_key(workspace, datasets)
    assert len(key) == 64 and int(key, 16) >= 0
    assert data_cache_key(workspace, datasets) == key
    # Declared order does not matter; the set of datasets does.
    assert data_cache_key(workspace, list(reversed(datasets))) == key


def test_train_yaml_does_not_change_key(workspace: Path, datasets: list[Path]) -> None:
    before = data_cache_key(workspace, datasets)
    (workspace / "train.yaml").write_text("model_name_or_path: other\nnum_train_epochs: 3\n")
    assert data_cache_key(workspace, datasets) == before


def test_outputs_of_earlier_runs_do_not_change_key(workspace: Path, datasets: list[Path]) -> None:
    before = data_cache_key(workspace, datasets)
    (workspace / "data.json").write_text("[{}]")
    (workspace / "output").mkdir()
    (workspace / "output" / "generated.py").write_text("x = 1\n")
    (workspace / "__pycache__").mkdir()
    (workspace / "__pycache__" / "helpers.cpython-311.pyc").write_bytes(b"\0")
    assert data_cache_key(workspace, datasets) == before


def test_process_data_change_changes_key(workspace: Path, datasets: list[Path]) -> None:
    before = data_cache_key(workspace, datasets)
    (workspace / "process_data.py").write_text("print('different')\n")
    assert data_cache_key(workspace, datasets) != before


def test_helper_module_change_changes_key(workspace: Path, datasets: list[Path]) -> None:
    (workspace / "helpers.py").write_text("N = 10\n")
    before = data_cache_key(workspace, datasets)
    (workspace / "helpers.py").write_text("N = 20\n")
    assert data_cache_key(workspace, datasets) != before


def test_dataset_info_change_and_absent_vs_empty(workspace: Path, datasets: list[Path]) -> None:
    keys = {data_cache_key(workspace, datasets)}
    (workspace / "dataset_info.json").write_text('{"processed_data": {"file_name": "other.json"}}')
    keys.add(data_cache_key(workspace, datasets))
    (workspace / "dataset_info.json").write_text("")
    keys.add(data_cache_key(workspace, datasets))
    (workspace / "dataset_info.json").unlink()
    keys.add(data_cache_key(workspace, datasets))
    assert len(keys) == 4  # original, edited, empty, absent: all different


def test_dataset_file_changes_change_key(workspace: Path, datasets: list[Path]) -> None:
    gsm = datasets[0]
    keys = {data_cache_key(workspace, datasets)}
    (gsm / "train" / "part-0.jsonl").write_text('{"q": "1+1", "a": "3"}\n')  # content
    keys.add(data_cache_key(workspace, datasets))
    (gsm / "train" / "part-1.jsonl").write_text("")  # a new file
    keys.add(data_cache_key(workspace, datasets))
    (gsm / "train" / "part-1.jsonl").rename(gsm / "train" / "part-2.jsonl")  # a rename
    keys.add(data_cache_key(workspace, datasets))
    assert len(keys) == 4


def test_dataset_set_and_missing_folder(workspace: Path, datasets: list[Path], tmp_path: Path) -> None:
    both = data_cache_key(workspace, datasets)
    only_gsm = data_cache_key(workspace, datasets[:1])
    missing = data_cache_key(workspace, [*datasets, tmp_path / "assets" / "datasets" / "absent"])
    assert len({both, only_gsm, missing}) == 3


def test_single_file_dataset_content_counts(workspace: Path, tmp_path: Path) -> None:
    single = tmp_path / "assets" / "datasets" / "qa.jsonl"
    single.parent.mkdir(parents=True)
    single.write_text('{"q": 1}\n')
    before = data_cache_key(workspace, [single])
    single.write_text('{"q": 2}\n')
    assert data_cache_key(workspace, [single]) != before


def test_key_does_not_depend_on_absolute_locations(tmp_path: Path) -> None:
    def build(root: Path) -> str:
        ws = root / "ws"
        ds = root / "assets" / "datasets" / "d"
        ds.mkdir(parents=True)
        ws.mkdir()
        (ws / "process_data.py").write_text("print(1)\n")
        (ds / "f.txt").write_text("abc")
        return data_cache_key(ws, [ds])

    assert build(tmp_path / "worker-a") == build(tmp_path / "somewhere" / "worker-b")


def test_memoised_digest_is_refreshed_when_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    old = time.time() - 3600
    path.write_bytes(b"a" * (3 << 20))  # big enough to be memoised, and more than one read chunk
    os.utime(path, (old, old))
    first = cache.file_sha256(path)
    assert cache.file_sha256(path) == first == hashlib.sha256(b"a" * (3 << 20)).hexdigest()
    path.write_bytes(b"b" * (3 << 20))  # same size
    os.utime(path, (old + 1, old + 1))
    assert cache.file_sha256(path) == hashlib.sha256(b"b" * (3 << 20)).hexdigest()


def test_rewrites_in_quick_succession_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    digests = set()
    for i in range(20):  # same size each time, within the file system's timestamp granularity
        path.write_text(f'{{"n": {i % 10}}}')
        digests.add(cache.file_sha256(path))
    assert len(digests) == 10


# ---------------------------------------------------------------- the run's environment
# Not part of the key (see services/data/cache.py); checked here beside it.


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("FTBUS_", "OPENAI_")):
            monkeypatch.delenv(name)


def test_process_data_env_gives_reference_variables(clean_env: None, tmp_path: Path) -> None:
    settings = Settings(
        openai_api_key="sk-test", openai_base_url="http://llm:8000/v1", strong_models=["big"], weak_models=[]
    )
    env = data_processing_env(settings, tmp_path / "assets")
    assets = (tmp_path / "assets").absolute()
    assert env["PYTHONPATH"] == "./"
    assert env["OPENAI_API_KEY"] == "sk-test"
    assert env["OPENAI_BASE_URL"] == "http://llm:8000/v1"
    assert json.loads(env["STRONG_MODEL_POOL"]) == ["big"]
    assert json.loads(env["WEAK_MODEL_POOL"]) == []
    assert (env["PYTHONUNBUFFERED"], env["PYTHONWARNINGS"], env["TOKENIZERS_PARALLELISM"]) == (
        "1", "ignore", "false"
    )
    assert env["FTBUS_ASSETS_DIR"] == str(assets)
    assert env["FT_MODEL_PATH"] == str(assets / "models")
    assert env["FT_DATASET_PATH"] == str(assets / "datasets")


def test_process_data_env_omits_unset_and_reads_openai_api_base(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = data_processing_env(Settings(), tmp_path)
    assert "OPENAI_API_KEY" not in env and "OPENAI_BASE_URL" not in env
    assert all(value != "" for value in env.values())

    monkeypatch.setenv("OPENAI_API_BASE", "http://legacy/v1")  # the reference's variable name
    assert data_processing_env(Settings(), tmp_path)["OPENAI_BASE_URL"] == "http://legacy/v1"
