"""The benchmark stage's decision (services/benchmark/confirm.py): the pool drawn on demand in jobs that
double, the base model scored on the pool once, the owner's state written by compare-and-set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.registry import BenchmarkSpec, load_benchmark
from evaluation.splits import SplitManifest, make_split, pool_order
from services.benchmark.confirm import REFERENCE, PoolRunFailed, Reference, Scored, decide_on_pool
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
    """What the stage would run: the candidate right on every second item, the base model every fourth,
    a campaign's incumbent every third."""

    def __init__(self, fail: str | None = None) -> None:
        #: (label, whose run: "candidate", "base" or "incumbent", items)
        self.jobs: list[tuple[str, str, int]] = []
        #: Whose pool runs fail: "base", "candidate" or nobody's.
        self.fail = fail

    async def __call__(self, manifest: SplitManifest, who: Scored, label: str) -> BenchmarkScores | None:
        whose = who if isinstance(who, str) else "incumbent"
        self.jobs.append((label, whose, sum(len(v) for v in manifest.item_ids.values())))
        if self.fail == whose:
            return None
        every = {"base": 4, "candidate": 2, "incumbent": 3}[whose]
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
    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate,
                                reference=Reference(REFERENCE, base), owner="alice", score_items=runs, private_put=keep)
    assert view.answer == "better" and view.owner == "alice" and view.screened
    assert view.estimate is not None and view.estimate_low is not None and view.estimate_high is not None
    assert view.estimate_low < 0.25 < view.estimate_high
    pool_size = len(pool_order(spec, 100))
    assert pool_size == 400
    # The base model once, on the whole pool; the candidate in jobs that double from 64 items.
    assert runs.jobs[0] == ("baseline-pool", "base", pool_size)
    sizes = [n for _, whose, n in runs.jobs[1:] if whose == "candidate"]
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
    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate,
                                reference=Reference(REFERENCE, base), owner="bob", score_items=runs, private_put=keep)
    monkeypatch.undo()
    state, _ = await OwnerStore(bus).get("bob")
    # Decided again at the 4th confirmation's level, after the 3 recorded in between; the pool ran once.
    assert reads == 2 and state.confirmations == 4
    assert view.level == pytest.approx(OwnerState(owner="bob", confirmations=3).next_level())
    assert [label for label, whose, _ in runs.jobs if whose == "base"] == ["baseline-pool"]


async def test_the_base_models_failed_pool_run_is_an_infrastructure_error_and_spends_nothing(
        tmp_path: Path, bus: MemoryBus) -> None:
    spec, candidate, base = _validation_pair(tmp_path)

    async def keep(data: bytes) -> None:
        return None

    with pytest.raises(PoolRunFailed):
        await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate,
                             reference=Reference(REFERENCE, base), owner="carol", score_items=Runs(fail="base"),
                             private_put=keep)
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

    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate,
                                reference=Reference(REFERENCE, base), owner="carol",
                                score_items=Runs(fail="candidate"), private_put=keep)
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
        view = await decide_on_pool(bus=NoKV(), spec=spec, max_items=100, candidate=candidate,
                                    reference=Reference(REFERENCE, same), owner="dave", score_items=runs,
                                    private_put=keep)
        assert view.answer == answer and not view.screened and view.level is None
    assert runs.jobs == []


async def test_in_a_campaign_the_candidate_is_confirmed_against_its_incumbent_run_on_the_same_pool_items(
        tmp_path: Path, bus: MemoryBus) -> None:
    """The reference is the incumbent: its validation scores (the record's) for the screen, and its model
    run on exactly the pool items the candidate runs on. A later candidate from the same cursor finds the
    incumbent's pool runs in the private cache and runs only itself."""
    spec, candidate, _ = _validation_pair(tmp_path)
    incumbent = _scores(make_split(spec, "validation"), lambda s, i: _number(i) % 3 == 0)
    reference = Reference("the incumbent r1", incumbent, "r1", [])
    cache = await bus.private_artifacts()

    async def keep(data: bytes) -> None:
        return None

    first = Runs()
    view = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate, reference=reference,
                                owner="alice", score_items=first, private_put=keep, cache=cache, run_key="k")
    assert view.answer == "better" and view.reference == "the incumbent r1" and view.incumbent == "r1"
    assert view.summary.startswith("better than the incumbent r1: confirmed on ")
    # Every pool job of the candidate's has the incumbent's beside it, on the same items; no base-model run.
    candidate_jobs = [(label, n) for label, whose, n in first.jobs if whose == "candidate"]
    incumbent_jobs = [(label.removeprefix("incumbent-"), n) for label, whose, n in first.jobs if whose == "incumbent"]
    assert candidate_jobs and incumbent_jobs == candidate_jobs
    assert not [job for job in first.jobs if job[1] == "base"]
    # True gain on the pool: every 2nd item minus every 3rd, about +1/6.
    assert view.estimate_low is not None and view.estimate_high is not None
    assert view.estimate_low < 1 / 6 < view.estimate_high

    later = Runs()
    again = await decide_on_pool(bus=bus, spec=spec, max_items=100, candidate=candidate, reference=reference,
                                 owner="bob", score_items=later, private_put=keep, cache=cache, run_key="k")
    assert again.answer == "better" and later.jobs and {whose for _, whose, _ in later.jobs} == {"candidate"}
