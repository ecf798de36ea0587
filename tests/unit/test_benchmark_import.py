"""`ftbus benchmarks import` from files in the hub datasets' own schemas, and `ls`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ftbus.cli import app
from services.benchmark.importer import BenchmarkImportError, import_benchmark
from services.benchmark.registry import load_benchmark


def _parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GSM8K = [{"question": f"Tom has {i} apples and gets 2 more. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
         for i in range(6)]


def test_gsm8k_from_a_hub_snapshot_folder(tmp_path: Path) -> None:
    snapshot = tmp_path / "gsm8k"
    _parquet(snapshot / "main" / "test-00000-of-00001.parquet", GSM8K)
    _parquet(snapshot / "main" / "train-00000-of-00001.parquet", GSM8K[:2])  # not the test split: not read
    report = import_benchmark(tmp_path / "assets", "gsm8k", snapshot)
    assert report.subsets == {"main": 6} and report.version == 1
    spec = load_benchmark(tmp_path / "assets", "gsm8k")
    assert (spec.scorer_name, spec.primary_metric) == ("gsm8k", "strict_match")
    assert spec.items("main")[3].answer.endswith("#### 5")
    assert "test-00000-of-00001.parquet" in spec.source and "train-" not in spec.source


def test_math_mmlu_aime_mbpp_in_their_schemas(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    math = [{"problem": "What is 1/2 + 0?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1",
             "type": t} for t in ("Algebra", "Number Theory") for _ in range(2)]
    import_benchmark(assets, "math", _jsonl(tmp_path / "math.jsonl", math))
    assert {s.name for s in load_benchmark(assets, "math").subsets} == {"algebra", "number_theory"}

    mmlu = [{"question": f"Q{i}", "subject": subject, "choices": ["w", "x", "y", "z"], "answer": i % 4}
            for subject in ("anatomy", "astronomy", "virology") for i in range(4)]
    import_benchmark(assets, "mmlu", _parquet(tmp_path / "mmlu" / "all" / "test-0.parquet", mmlu))
    spec = load_benchmark(assets, "mmlu")
    assert [s.name for s in spec.subsets] == ["anatomy", "astronomy", "virology"]
    item = spec.items("astronomy")[2]
    assert item.answer == "y" and item.question.endswith("C. y\nD. z\nAnswer:")

    aime = [{"problem": f"Find {i}.", "answer": str(100 + i), "id": i} for i in range(4)]
    import_benchmark(assets, "aime25", _jsonl(tmp_path / "aime25.jsonl", aime))
    spec = load_benchmark(assets, "aime25")
    assert spec.llm_cascade and spec.primary_metric == "math_cascade"

    mbpp = [{"task_id": 11 + i, "text": "Return the sum.", "code": "def f(a, b):\n    return a + b",
             "test_list": ["assert f(1, 2) == 3", "assert f(0, 0) == 0"], "test_setup_code": ""} for i in range(2)]
    import_benchmark(assets, "mbpp", _jsonl(tmp_path / "mbpp.jsonl", mbpp))
    item = load_benchmark(assets, "mbpp").items("mbpp")[0]
    assert item.id == "mbpp-11" and item.test == "assert f(1, 2) == 3\nassert f(0, 0) == 0"
    assert "Your code should pass these tests" in item.question


def test_humaneval_comes_with_the_package(tmp_path: Path) -> None:
    report = import_benchmark(tmp_path / "assets", "humaneval")
    assert report.subsets == {"humaneval": 164}
    item = load_benchmark(tmp_path / "assets", "humaneval").items("humaneval")[0]
    assert item.id == "HumanEval/0" and item.entry_point == "has_close_elements" and "def check" in item.test


@pytest.mark.parametrize(("rows", "message"), [
    ([{"question": "q"}], "missing column(s) answer"),
    ([{"question": "q", "answer": "no number here"}], "row 0: unparsable gold answer"),
])
def test_bad_files_are_refused_naming_file_and_row(tmp_path: Path, rows: list[dict], message: str) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(BenchmarkImportError, match=r"bad\.jsonl") as caught:
        import_benchmark(tmp_path / "assets", "gsm8k", path)
    assert message in str(caught.value)
    assert not (tmp_path / "assets" / "benchmarks" / "gsm8k").exists()


def test_an_empty_split_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(BenchmarkImportError, match="empty"):
        import_benchmark(tmp_path / "assets", "gsm8k", path)


def test_version_goes_up_only_when_the_items_change(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "g.jsonl", GSM8K)
    assert import_benchmark(tmp_path / "assets", "gsm8k", path).version == 1
    again = import_benchmark(tmp_path / "assets", "gsm8k", path)
    assert (again.version, again.changed) == (1, False)
    _jsonl(tmp_path / "g.jsonl", GSM8K[:4])
    assert import_benchmark(tmp_path / "assets", "gsm8k", path).version == 2


def test_cli_import_and_ls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    runner = CliRunner()
    done = runner.invoke(app, ["benchmarks", "import", "gsm8k", "--from", str(_jsonl(tmp_path / "g.jsonl", GSM8K)),
                               "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["subsets"] == {"main": 6}
    listed = runner.invoke(app, ["benchmarks", "ls", "--json"])
    (info,) = json.loads(listed.stdout)
    assert info["name"] == "gsm8k" and info["scorer"] == "gsm8k"
    assert info["subsets"] == {"main": {"items": 6, "validation": 3, "test": 3}}
    refused = runner.invoke(app, ["benchmarks", "import", "nope"])
    assert refused.exit_code == 2 and "no catalogue benchmark" in refused.output
