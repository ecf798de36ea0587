"""The benchmark stage resumes a request whose earlier attempt was lost half way (issue 37): the real
lm-eval on the tiny model in the stage's warm engine, the stores in memory (tests/fakes). The
verdict's numbers are those of an uninterrupted run, the result says how much was resumed, the
test split's answers never leave the private store, and the journals go when the request is done."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from evaluation.warm import stop_engine
from runners.base import LocalRunner
from services.benchmark import service as bench
from shared.events import BenchResult, DataSummary, Stage, TrainResult, TrainSummary, WorkspaceFile
from shared.runtime import Outgoing
from shared.settings import Settings
from tests.fakes.stage_context import FakeBus, fake_context, request_context

#: Four splits per attempt (the candidate's and the base model's), three attempts: minutes on 2 loaded cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
ITEMS = 10  # per subset and split: 20 validation items


def _settings(tmp_path: Path, assets: Path, toolchain: Path) -> Settings:
    return Settings(home=tmp_path / "home", assets_dir=assets, toolchain_bin=toolchain, bench_max_items=ITEMS,
                    bench_device="cpu", sandbox="local", bench_engine="warm")


async def _candidate(bus: FakeBus, assets: Path) -> TrainResult:
    """A "fully fine-tuned" candidate: the tiny model's own files as the training's outputs."""
    files = []
    for path in sorted((assets / "models" / "tiny-llama").iterdir()):
        if path.is_file():
            ref = await bus.stores["models"].put_file(f"r1/output/{path.name}", path)
            files.append(WorkspaceFile(path=f"output/{path.name}", ref=ref))
    context = request_context([], base_model="tiny-llama", benchmark="tiny-sentiment")
    return TrainResult(request_id="r1", ok=True, context=context, data=DataSummary(),
                       train=TrainSummary(outputs=files, model_kind="full",
                                          base_model_path=str(assets / "models" / "tiny-llama")))


async def _attempt(settings: Settings, bus: FakeBus, event: TrainResult) -> list[Outgoing]:
    """One delivery on a fresh worker: its own runner (so its own engine) and work folder."""
    runner = LocalRunner(settings.passthrough_env, path_prefix=[settings.toolchain_bin])
    ctx = fake_context(Stage.bench, settings, runner, bus=bus)  # type: ignore[arg-type]
    shutil.rmtree(ctx.workdir, ignore_errors=True)
    try:
        return await bench.handle(event, ctx)
    finally:
        await stop_engine(runner)


def _results(outs: list[Outgoing]) -> dict[str, BenchResult]:
    events = [o if isinstance(o, BenchResult) else o.event for o in outs]  # the handler's results, however routed
    results = {e.split: e for e in events}  # type: ignore[attr-defined]
    for result in results.values():
        assert result.ok, result.error
    return results  # type: ignore[return-value]


def _journals(bus: FakeBus) -> dict[str, list[str]]:
    return {store: sorted(name for name in memory.objects if name.startswith("resume/"))
            for store, memory in bus.stores.items()}


async def test_a_lost_attempt_is_resumed_with_the_verdicts_numbers_unchanged(
    real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, real_assets, toolchain_bin)

    reference_bus = FakeBus(settings)
    reference = _results(await _attempt(settings, reference_bus, await _candidate(reference_bus, real_assets)))
    assert all(r.resumed_items is None for r in reference.values())
    assert _journals(reference_bus) == {store: [] for store in reference_bus.stores}  # cleared at the end

    # The first attempt is lost after the validation split, once some of the test split's batches
    # are recorded.
    bus = FakeBus(settings)
    event = await _candidate(bus, real_assets)
    lost = asyncio.create_task(_attempt(settings, bus, event))
    deadline = time.monotonic() + 900
    while not any(name.endswith("/000001.jsonl") for name in _journals(bus)["private"]):
        assert not lost.done(), _journals(bus)
        assert time.monotonic() < deadline, "nothing recorded in 900 s"
        await asyncio.sleep(0.05)
    lost.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lost
    journals = _journals(bus)
    # The validation split's answers in the workers' cache store, the hidden test split's in the
    # private one; none where agents and the judge read.
    assert journals["cache"] and all(name.startswith("resume/r1/validation-") for name in journals["cache"])
    assert journals["private"] and all(name.startswith("resume/r1/test-") for name in journals["private"])
    assert not journals["artifacts"] and not journals["models"]

    resumed = _results(await _attempt(settings, bus, event))
    assert resumed["validation"].resumed_items == 2 * ITEMS  # all of it: nothing generated again
    test_done = resumed["test"].resumed_items
    assert test_done is not None and 0 < test_done < 2 * ITEMS
    said = [p.message for p in bus.progress if p.message and "resumed the benchmark" in p.message]
    assert said == [f"validation: resumed the benchmark: {2 * ITEMS} of {2 * ITEMS} items already done",
                    f"test: resumed the benchmark: {test_done} of {2 * ITEMS} items already done"]
    for split in ("validation", "test"):
        got, want = resumed[split], reference[split]
        assert got.benchmark is not None and want.benchmark is not None
        assert got.benchmark.item_scores == want.benchmark.item_scores
        assert got.benchmark.accuracy_summary == want.benchmark.accuracy_summary
        assert got.baseline == want.baseline
    assert _journals(bus) == {store: [] for store in bus.stores}
