"""Benchmark registry and validation/test splits (evaluation/registry.py, splits.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evaluation.registry import (
    BenchmarkError,
    BenchmarkNotFoundError,
    available_benchmarks,
    load_benchmark,
)
from evaluation.splits import make_split, pool_batch, pool_order, split_bounds, split_items, write_split_data

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lmeval"
ASSETS = FIXTURES / "assets"


@pytest.fixture
def assets_copy(tmp_path: Path) -> Path:
    shutil.copytree(ASSETS, tmp_path / "assets")
    return tmp_path / "assets"


def _write_bench(assets: Path, name: str, descriptor: str, files: dict[str, list[dict]]) -> None:
    folder = assets / "benchmarks" / name
    folder.mkdir(parents=True)
    (folder / "benchmark.yaml").write_text(descriptor)
    for fname, rows in files.items():
        (folder / fname).write_text("".join(json.dumps(r) + "\n" for r in rows))


# ------------------------------------------------------------------ split arithmetic


@pytest.mark.parametrize(
    ("n", "max_items", "validation", "test"),
    [
        (40, 100, (0, 20), (20, 40)),
        (15, 100, (0, 7), (8, 15)),  # AIME25-like: 7 + 7, the middle item unused
        (40, 5, (0, 5), (35, 40)),
        (1000, 100, (0, 100), (900, 1000)),
        (1, 100, (0, 0), (1, 1)),
        (0, 100, (0, 0), (0, 0)),
    ],
)
def test_split_bounds(n: int, max_items: int, validation: tuple[int, int], test: tuple[int, int]) -> None:
    assert split_bounds(n, "validation", max_items) == validation
    assert split_bounds(n, "test", max_items) == test


def test_splits_never_overlap_and_respect_max() -> None:
    for n in range(0, 260):
        for max_items in (1, 3, 100):
            v0, v1 = split_bounds(n, "validation", max_items)
            t0, t1 = split_bounds(n, "test", max_items)
            assert v1 <= t0
            assert v1 - v0 == t1 - t0 == min(max_items, n // 2)


def test_the_pool_is_every_item_between_validation_and_test() -> None:
    for n in range(0, 260):
        for max_items in (1, 3, 100):
            v0, v1 = split_bounds(n, "validation", max_items)
            p0, p1 = split_bounds(n, "pool", max_items)
            t0, t1 = split_bounds(n, "test", max_items)
            assert (v1, t0) == (p0, p1) and (v1 - v0) + (p1 - p0) + (t1 - t0) == n


def test_pool_order_mixes_subsets_the_same_way_every_time_and_batches_score_exactly_its_items() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith-mc")
    order = pool_order(spec, max_items=5)  # 40 items a subset: 5 validation, 5 test, 30 in the pool
    assert len(order) == 60 and order == pool_order(spec, max_items=5)
    assert {s for s, _ in order[:20]} == {"sum_choice", "parity"}  # shuffled together, not subset by subset
    validation, test = make_split(spec, "validation", 5), make_split(spec, "test", 5)
    for subset, item in order:
        assert item.id not in validation.item_ids[subset] and item.id not in test.item_ids[subset]
    batch = pool_batch(spec, 10, 25, max_items=5)
    assert batch.split == "pool"
    assert sorted((s, i) for s, ids in batch.item_ids.items() for i in ids) == sorted(
        (s, item.id) for s, item in order[10:25])
    assert split_items(spec, batch)  # its hash holds: a run of it is checked as any split's
    assert pool_batch(spec, 55, 80, max_items=5).item_ids != {} and \
        sum(map(len, pool_batch(spec, 55, 80, max_items=5).item_ids.values())) == 5
    assert pool_order(spec) == []  # 100 a split: 20 + 20 of 40, nothing left for a pool


def test_split_bounds_rejects_non_positive_max() -> None:
    with pytest.raises(ValueError):
        split_bounds(10, "validation", 0)


# ------------------------------------------------------------------ manifests


def test_make_split_matches_the_manifest_of_the_real_run() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    recorded = json.loads((FIXTURES / "tiny-arith-validation-lora" / "data" / "manifest.json").read_text())
    manifest = make_split(spec, "validation")
    assert manifest.model_dump(mode="json") == recorded
    assert manifest.item_ids["addition"][:2] == ["add-000", "add-001"]
    assert {k: len(v) for k, v in manifest.item_ids.items()} == {"addition": 20, "subtraction": 20}


def test_validation_and_test_are_disjoint_halves() -> None:
    spec = load_benchmark(ASSETS, "tiny-arith-mc")
    val, test = make_split(spec, "validation"), make_split(spec, "test")
    for subset in ("sum_choice", "parity"):
        all_ids = [i.id for i in spec.items(subset)]
        assert val.item_ids[subset] == all_ids[:20]
        assert test.item_ids[subset] == all_ids[20:]
    assert val.sha256 != test.sha256
    small = make_split(spec, "test", max_items=3)
    assert small.item_ids["parity"] == [i.id for i in spec.items("parity")][-3:]


def test_write_split_data(tmp_path: Path) -> None:
    spec = load_benchmark(ASSETS, "tiny-arith-mc")
    manifest = make_split(spec, "test", max_items=4)
    files = write_split_data(spec, manifest, tmp_path / "data")
    assert set(files) == {"sum_choice", "parity"}
    rows = [json.loads(line) for line in files["parity"].read_text().splitlines()]
    assert [r["id"] for r in rows] == manifest.item_ids["parity"]
    assert set(rows[0]) == {"id", "question", "answer", "choices"}
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["sha256"] == manifest.sha256


def test_generate_until_items_have_no_choices_key(tmp_path: Path) -> None:
    spec = load_benchmark(ASSETS, "tiny-arith")
    files = write_split_data(spec, make_split(spec, "validation", 2), tmp_path)
    assert set(json.loads(files["addition"].read_text().splitlines()[0])) == {"id", "question", "answer"}


def test_manifest_detects_changed_items(assets_copy: Path) -> None:
    spec = load_benchmark(assets_copy, "tiny-arith")
    manifest = make_split(spec, "validation")
    data = assets_copy / "benchmarks" / "tiny-arith" / "addition.jsonl"
    lines = data.read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "answer": "wrong"})
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchmarkError, match="changed"):
        split_items(load_benchmark(assets_copy, "tiny-arith"), manifest)


def test_manifest_of_another_benchmark_is_refused() -> None:
    manifest = make_split(load_benchmark(ASSETS, "tiny-arith"), "validation")
    with pytest.raises(BenchmarkError, match="not tiny-arith-mc"):
        split_items(load_benchmark(ASSETS, "tiny-arith-mc"), manifest)


def test_subset_too_small_for_a_split_writes_no_file(tmp_path: Path) -> None:
    _write_bench(tmp_path, "one", (
        "name: one\nkind: generate_until\nprimary_metric: exact_match\n"
        "subsets: [{name: a, file: a.jsonl}, {name: b, file: b.jsonl}]\n"
    ), {"a.jsonl": [{"id": "1", "question": "q", "answer": "a"}],
        "b.jsonl": [{"id": str(i), "question": f"q{i}", "answer": "a"} for i in range(4)]})
    spec = load_benchmark(tmp_path, "one")
    manifest = make_split(spec, "validation")
    assert manifest.item_ids == {"a": [], "b": ["0", "1"]}
    assert set(write_split_data(spec, manifest, tmp_path / "out")) == {"b"}


# ------------------------------------------------------------------ registry


def test_registry_lists_and_loads() -> None:
    assert available_benchmarks(ASSETS) == ["tiny-arith", "tiny-arith-mc"]
    spec = load_benchmark(ASSETS, "tiny-arith")
    assert (spec.kind, spec.primary_metric, spec.higher_is_better, spec.version) == (
        "generate_until", "exact_match", True, 1)
    assert [s.name for s in spec.subsets] == ["addition", "subtraction"]
    assert spec.generation.max_gen_toks == 16
    assert spec.root == (ASSETS / "benchmarks" / "tiny-arith").resolve()
    mc = load_benchmark(ASSETS, "tiny-arith-mc")
    assert mc.metrics == ("acc", "acc_norm")
    assert all(i.answer in (i.choices or []) for i in mc.items("sum_choice"))


def test_unknown_benchmark_lists_the_available_ones() -> None:
    with pytest.raises(BenchmarkNotFoundError, match=r"available benchmarks: tiny-arith, tiny-arith-mc"):
        load_benchmark(ASSETS, "gsm8k")


def test_unknown_benchmark_without_assets(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkNotFoundError, match="ftbus assets init"):
        load_benchmark(tmp_path, "tiny-arith")


@pytest.mark.parametrize("name", ["../tiny-arith", "a/b", "", ".hidden"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(BenchmarkError, match="invalid benchmark name"):
        load_benchmark(ASSETS, name)


@pytest.mark.parametrize(
    ("descriptor", "rows", "message"),
    [
        ("name: b\nkind: generate_until\nprimary_metric: acc\nsubsets: [{name: s, file: s.jsonl}]\n",
         [{"id": "1", "question": "q", "answer": "a"}], "not computed by scorer exact"),
        ("name: other\nkind: generate_until\nprimary_metric: exact_match\nsubsets: [{name: s, file: s.jsonl}]\n",
         [{"id": "1", "question": "q", "answer": "a"}], "holds a descriptor named 'other'"),
        ("name: b\nkind: generate_until\nprimary_metric: exact_match\nsubsets: [{name: s, file: s.jsonl}]\n",
         [{"id": "1", "question": "q", "answer": "a"}, {"id": "1", "question": "r", "answer": "b"}],
         "duplicate id"),
        ("name: b\nkind: multiple_choice\nprimary_metric: acc\nsubsets: [{name: s, file: s.jsonl}]\n",
         [{"id": "1", "question": "q", "answer": "c", "choices": ["a", "b"]}], "choices that contain the answer"),
        ("name: b\nkind: generate_until\nprimary_metric: exact_match\nsubsets: [{name: s, file: ../s.jsonl}]\n",
         [], "relative path inside"),
        ("name: b\nkind: generate_until\nprimary_metric: exact_match\nsubsets: [{name: s, file: missing.jsonl}]\n",
         [], "missing"),
        ("name: b\nkind: generate_until\nprimary_metric: exact_match\nsubsets: [{name: s, file: s.jsonl}]\n",
         [{"id": "1", "question": "q"}], "s.jsonl line 1"),
        ("name: b\nkind: ranking\nprimary_metric: exact_match\nsubsets: [{name: s, file: s.jsonl}]\n",
         [], "invalid"),
        ("- just\n- a list\n", [], "must be a mapping"),
        ("name: b\nkind: generate_until\nprimary_metric: exact_match\nsubsets: [{name: s, file: s.jsonl}]\n",
         [], "has no items"),
    ],
)
def test_malformed_benchmarks_are_explained(tmp_path: Path, descriptor: str, rows: list[dict],
                                            message: str) -> None:
    _write_bench(tmp_path, "b", descriptor, {"s.jsonl": rows})
    with pytest.raises(BenchmarkError, match=message):
        load_benchmark(tmp_path, "b")
