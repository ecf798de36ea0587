"""The benchmark stage's decision (services/benchmark/confirm.py): the pool drawn on demand in jobs that
double, the base model scored on the pool once, the owner's state written by compare-and-set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.registry import BenchmarkSpec, load_benchmark
from evaluation.splits import SplitManifest, make_split, pool_order
from services.benchmark.confirm import PoolRunFailed, decide_on_pool
from shared.decision import OwnerState
from shared.events import BenchmarkScores
from shared.owners import OwnerStore
from tests.memory_bus import MemoryBus, memory_settings


def _benchmark(root: Path, n: int = 400) -> Path:
    folder = root / "benchmarks" / "pooled"
    folder.mkdir(parents=True)
    (folder / "benchmark.yaml").write_text(
        "name: pooled\nversion: 1\nkind: generate_until\nprimary_metric: exact_match\nhigher_is_better: true\n"
        "subsets:\n- name: a\n  file: a.jsonl\n- name: b\n  file: b.jsonl\n")
    for subset in ("a", "b"):
        (folder / f"{subset}.jsonl").write_text("".join(
            json.dumps({"id": f"{subset}{i}", "question": f"q {i}", "answer": str(i)}) + "\n" for i in range(n)))
    return root


def _scores(manifest: SplitManifest, right: object) -> BenchmarkScores:
    """Each item right where ``right(subset, item id)`` says so."""
    items = {s: {i: [1.0 if right(s, i) else 0.0] for i in ids} for s, ids in manifest.item_ids.items()}  # type: ignore[operator]
    return BenchmarkScores(accuracy_summary={s: {"exact_match": 0.5} for s in items}, primary_metric="exact_match",
                           item_scores=items)


def _number(item: str) -> int:
    return int(item[1:])


class Runs:
    """What the stage would run: the candidate right on every second item, the base model every fourth."""

    def __init__(self, fail: str | None = None) -> None:
        self.jobs: list[tuple[str, bool, int]] = []
        #: Whose pool runs fail: "base", "candidate" or nobody's.
        self.fail = fail

    async def __call__(self, manifest: SplitManifest, base: bool, label: str) -> BenchmarkScores | None:
        self.jobs.append((label, base, sum(len(v) for v in manifest.item_ids.values())))
        if self.fail == ("base" if base else "candidate"):
            return None
        every = 4 if base else 2
        return _scores(manifest, lambda s, i: _number(i) % every == 0)


def _validation_pair(root: Path) -> tuple[BenchmarkSpec, BenchmarkScores, BenchmarkScores]:
    """The pooled benchmark, and validation scores: the candidate right on every second item, the base every fourth."""
    spec = load_benchmark(_benchmark(root), "pooled")
    validation = make_split(spec, "validation")
    return (spec, _scores(validation, lambda s, i: _number(i) % 2 == 0),
            _scores(validation, lambda s, i: _number(i) % 4 == 0))


@pytest.fixture
def bus(tmp_path: Path) -> MemoryBus:
    return MemoryBus(memory_settings(tmp_path))


async def test_a_better_candidate_is_confirmed_with_few_jobs_and_its_owner_state_recorded(
        tmp_path: Path, bus: MemoryBus) -> None:
    spec, candidate, base = _validation_pair(tmp_path)
    kept: list[bytes] = []

    async def keep(data: bytes) -> None:
        kept.append(data)

    runs = Runs()
    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate, baseline=base,
                                owner="alice", score_items=runs, private_put=keep)
    assert view.answer == "better" and view.owner == "alice" and view.screened
    assert view.estimate is not None and view.estimate_low is not None and view.estimate_high is not None
    assert view.estimate_low < 0.25 < view.estimate_high
    pool_size = len(pool_order(spec, 100))
    assert pool_size == 400
    # The base model once, on the whole pool; the candidate in jobs that double from 64 items.
    assert runs.jobs[0] == ("baseline-pool", True, pool_size)
    sizes = [n for _, base_job, n in runs.jobs[1:] if not base_job]
    # The candidate: a first job of 64 items, then one per further look or estimate, each at least twice
    # the one before, and no item scored twice.
    assert sizes[0] == 64 and len(sizes) <= 3, sizes
    assert view.pool_items is not None and view.pool_items <= sum(sizes) <= pool_size
    state, revision = await OwnerStore(bus).get("alice")
    assert revision > 0 and (state.confirmations, state.accepted) == (1, 1)
    assert state.cursors == {"pooled": view.pool_items}
    assert json.loads(kept[0])["answer"] == "better"


async def test_a_lost_compare_and_set_decides_again_at_the_owners_state_as_it_is_now(
        tmp_path: Path, bus: MemoryBus, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, candidate, base = _validation_pair(tmp_path)
    runs = Runs()
    original = OwnerStore.get
    reads = 0

    async def racing_get(self: OwnerStore, owner: str) -> tuple[OwnerState, int]:
        # Another confirmation of the same owner is recorded between this decision's read and its write.
        nonlocal reads
        reads += 1
        read = await original(self, owner)
        if reads == 1:
            await self.put(OwnerState(owner=owner, confirmations=3), read[1])
        return read

    async def keep(data: bytes) -> None:
        return None

    monkeypatch.setattr(OwnerStore, "get", racing_get)
    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate, baseline=base,
                                owner="bob", score_items=runs, private_put=keep)
    monkeypatch.undo()
    state, _ = await OwnerStore(bus).get("bob")
    # Decided again at the 4th confirmation's level, after the 3 recorded in between; the pool ran once.
    assert reads == 2 and state.confirmations == 4
    assert view.level == pytest.approx(OwnerState(owner="bob", confirmations=3).next_level())
    assert [label for label, base_job, _ in runs.jobs if base_job] == ["baseline-pool"]


async def test_the_base_models_failed_pool_run_is_an_infrastructure_error_and_spends_nothing(
        tmp_path: Path, bus: MemoryBus) -> None:
    spec, candidate, base = _validation_pair(tmp_path)

    async def keep(data: bytes) -> None:
        return None

    with pytest.raises(PoolRunFailed):
        await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate, baseline=base,
                             owner="carol", score_items=Runs(fail="base"), private_put=keep)
    state, revision = await OwnerStore(bus).get("carol")
    assert revision == 0 and state.confirmations == 0


async def test_the_candidates_failed_pool_run_reads_not_confirmed_spends_the_level_and_says_why_privately(
        tmp_path: Path, bus: MemoryBus) -> None:
    """A candidate that ran on validation but fails on hidden items (a timeout, a crash) is not confirmed.
    Its owner reads the same words as for any confirmation that did not reach its level (how a model
    fails on hidden items is information about them); the operator's private record says why."""
    spec, candidate, base = _validation_pair(tmp_path)
    kept: list[bytes] = []

    async def keep(data: bytes) -> None:
        kept.append(data)

    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate, baseline=base,
                                owner="carol", score_items=Runs(fail="candidate"), private_put=keep)
    assert view.answer == "indistinguishable" and view.screened
    assert view.summary.startswith("not confirmed on the hidden pool at level ")
    assert view.estimate is None and view.pool_items is None
    assert "fail" not in view.model_dump_json()
    state, revision = await OwnerStore(bus).get("carol")
    assert revision == 1 and state.confirmations == 1 and state.accepted == 0 and state.carried == 0.0
    private = json.loads(kept[-1])
    assert private["pool_failure"].startswith("the candidate's run pool-00000-")
    assert private["confirmation"]["stop"] == "candidate failed"


async def test_a_candidate_the_screen_refuses_costs_no_pool_item_and_no_owner_read(tmp_path: Path) -> None:
    class NoKV:
        """A bus without buckets: reading an owner's state here would fail the test."""

    spec = load_benchmark(_benchmark(tmp_path), "pooled")
    validation = make_split(spec, "validation")
    same = _scores(validation, lambda s, i: _number(i) % 4 == 0)
    worse = _scores(validation, lambda s, i: _number(i) % 8 == 0)

    async def keep(data: bytes) -> None:
        return None

    runs = Runs()
    for candidate, answer in ((same, "indistinguishable"), (worse, "worse")):
        view = await decide_on_pool(bus=NoKV(), spec=spec, max_items=100, candidate=candidate, baseline=same,
                                    owner="dave", score_items=runs, private_put=keep)
        assert view.answer == answer and not view.screened and view.level is None
    assert runs.jobs == []
