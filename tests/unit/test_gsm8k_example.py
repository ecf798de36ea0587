"""examples/gsm8k: its training data is held out of gsm8k-synth, and it trains on the benchmark's own prompt.

The example teaches the tiny model grade-school-arith and is scored on gsm8k-synth; both come from
one generator (ftbus/toolchain/build_assets.py). Its claim, that the candidate beats the base model
on problems it never saw, holds only if no benchmark problem is in the training data.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from ftbus.toolchain.asset_items import ARITH_NAMES, ARITH_OBJECTS, GSM8K_SYNTH, grade_school_items
from services.trainer.config import prepare_train_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gsm8k"
WORDS = re.compile(r"[A-Za-z]+")


def _process_data() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gsm8k_process_data", EXAMPLE / "process_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _normalise(question: str) -> str:
    return " ".join(question.lower().split())


def test_no_benchmark_question_is_in_the_training_data() -> None:
    bench, train = grade_school_items()
    items = [item for subset in bench.values() for item in subset]
    assert len(items) == 40 and len(train) == 600
    train_questions = {_normalise(r["question"]) for r in train}
    assert not [i["id"] for i in items if _normalise(i["question"]) in train_questions]
    # The benchmark's names and objects never occur in a training question: a benchmark problem is
    # not a training problem with its numbers changed, whatever the story.
    train_words = {w for r in train for w in WORDS.findall(r["question"])}
    bench_words = {w for i in items for w in WORDS.findall(i["question"])}
    held = bench_words & set(ARITH_NAMES + ARITH_OBJECTS)
    assert held, "the benchmark uses none of the generator's names or objects"
    assert not held & train_words, sorted(held & train_words)
    # Both splits (first and last 20 items of the subset) are held out, not only the validation one.
    for subset in bench.values():
        assert len(subset) == 40
        assert not {_normalise(i["question"]) for i in subset[20:]} & train_questions


def test_answers_are_gsm8k_worked_solutions() -> None:
    bench, train = grade_school_items()
    for row in [*train, *(item for subset in bench.values() for item in subset)]:
        working, _, final = row["answer"].rpartition("\n#### ")
        assert working and re.fullmatch(r"-?[0-9]+", final), row
        assert "\n\n" not in row["answer"] and "Question:" not in row["answer"], row  # the stop strings


def test_process_data_writes_the_benchmark_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, train = grade_school_items()
    raw = tmp_path / "assets" / "datasets" / "grade-school-arith"
    raw.mkdir(parents=True)
    (raw / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("FT_DATASET_PATH", raising=False)
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    monkeypatch.setattr("sys.argv", ["process_data.py"])
    _process_data().main()

    data = json.loads((work / "data.json").read_text(encoding="utf-8"))
    assert len(data) == len(train)
    # What lm-eval sends as the user's turn (benchmark.yaml's prompt, a Jinja template) is what the
    # example trains on as the instruction; the response is the worked answer, `#### n` included.
    prompt = GSM8K_SYNTH["prompt"]
    for record, row in zip(data, train, strict=True):
        assert record["instruction"] == prompt.replace("{{question}}", row["question"])
        assert record["input"] == "" and record["output"] == row["answer"]

    info = json.loads((EXAMPLE / "dataset_info.json").read_text())
    assert info["processed_data"]["file_name"] == "data.json"
    assert info["processed_data"]["formatting"] == "alpaca"


def test_train_yaml_is_accepted_and_cuts_no_record(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    (assets / "models" / "tiny-llama").mkdir(parents=True)
    (assets / "models" / "tiny-llama" / "config.json").write_text("{}")
    workspace = tmp_path / "ws"
    shutil.copytree(EXAMPLE, workspace)
    text = (EXAMPLE / "train.yaml").read_text()
    prepare_train_yaml(text, assets_dir=assets, workspace_dir=workspace)

    config = yaml.safe_load(text)
    assert config["model_name_or_path"] == "tiny-llama" and config["template"] == "default"
    # The longest training record is 134 tokens of tiny-llama's tokenizer once the chat template
    # wraps it (measured with the toolchain: the services' environment has no tokenizer): a shorter
    # cutoff_len would cut some answers before their `#### n`.
    assert config["cutoff_len"] >= 134
