"""The default decision on the real pipeline (real nats-server, stand-in tools): screened on validation,
confirmed on the hidden pool, the owner's budget spent and recorded; a worse candidate refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from shared.decision import OwnerState
from shared.events import TaskSpec
from shared.owners import SHARED_OWNER
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace
from tests.integration.test_delivery import run_ftbus
from tests.standin.assets import POOLED_BENCHMARK, add_pooled_benchmark

TASK = TaskSpec(base_model="tiny-standin", benchmark=POOLED_BENCHMARK, description="triple numbers")
#: Per subset of 160 items: 40 validation, 40 test, 80 in the pool; 160 pool items in all.
POOL_ITEMS = 160


async def test_better_is_confirmed_on_the_pool_and_worse_is_refused_by_default(settings: Settings,
                                                                              tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    shutil.copytree(settings.assets, assets)
    add_pooled_benchmark(assets)
    settings = settings.model_copy(update={"judge_policy": "better", "bench_max_items": 40, "assets_dir": assets})
    assert Settings.model_fields["judge_policy"].default == "better"
    pipeline = Pipeline(settings)
    try:
        await pipeline.start()
        assert pipeline.client is not None and pipeline.bus is not None
        public, private = await pipeline.bus.artifacts(), await pipeline.bus.private_artifacts()
        owners = await pipeline.bus.kv(pipeline.bus.subjects.kv_owners)

        # A candidate that answers every second item right, its base model every fourth: better.
        good = await pipeline.client.submit(write_workspace(tmp_path / "good"), TASK)
        verdict = await pipeline.client.wait(good, timeout_s=120)
        assert verdict.status == "completed", verdict.execution
        decision = verdict.result.decision
        assert decision is not None and decision.answer == "better", decision
        assert verdict.final_decision is True, verdict.return_checking
        assert verdict.judge is not None and verdict.judge.policy == "better"
        assert decision.validation_items == 80 and decision.screened and decision.owner == SHARED_OWNER
        # Its gain from fresh pool items (the true one is +0.25), and the pool items it cost.
        assert decision.estimate is not None and decision.estimate_low is not None and decision.estimate_high
        assert decision.estimate_low < 0.25 < decision.estimate_high, decision
        assert decision.pool_items is not None and 0 < decision.pool_items <= POOL_ITEMS
        assert f"[ftbus] Decision: better. {decision.summary}." in verdict.return_checking
        # The owner's budget: one confirmation, accepted, its pool cursor past every item it used.
        state = OwnerState.model_validate_json((await owners.get(SHARED_OWNER)).value)
        assert (state.confirmations, state.accepted) == (1, 1)
        assert state.cursors == {POOLED_BENCHMARK: decision.pool_items}
        # The pool's runs and the full decision are private: no agent or judge store holds them.
        record = json.loads(await private.get_bytes(await private.stat(f"{good}/decision.json")))
        assert record["answer"] == "better" and record["confirmation"]["items"] > 0
        pool_logs = [n for n, _ in await private.list_objects() if n.startswith(f"{good}/logs/") and "pool" in n]
        assert f"{good}/logs/benchmark-pool-00000-00064.log" in pool_logs, pool_logs
        assert not [n for n, _ in await public.list_objects() if n.startswith(f"{good}/") and "pool" in n]

        # Answering every eighth item right: worse than the base model on validation, beyond noise.
        worse = await pipeline.client.submit(
            write_workspace(tmp_path / "worse", train={"standin_accuracy_every": 8}), TASK)
        verdict = await pipeline.client.wait(worse, timeout_s=120)
        assert verdict.status == "completed", verdict.execution
        assert verdict.judge is not None and verdict.judge.rules_decision is True  # everything ran
        decision = verdict.result.decision
        assert decision is not None and decision.answer == "worse", decision
        assert verdict.final_decision is False
        assert decision.pool_items is None and decision.level is None and not decision.screened
        assert verdict.judge.reason is not None and "accepts only a candidate better than the base model: worse" \
            in verdict.judge.reason
        # No budget spent on it: the screen refused it before the pool.
        assert OwnerState.model_validate_json((await owners.get(SHARED_OWNER)).value) == state
        # The exit code says what the verdict says: 1, final_decision false.
        code, out, err = await run_ftbus(settings, "get", worse)
        assert code == 1, (out, err)

        # A second good candidate: the first used the whole pool (its confirmation and its estimate),
        # and later confirmations never reuse an accepted candidate's items. Nothing is left to confirm
        # it on, and the verdict says so rather than calling it better.
        again = await pipeline.client.submit(write_workspace(tmp_path / "again"), TASK)
        verdict = await pipeline.client.wait(again, timeout_s=120)
        decision = verdict.result.decision
        assert decision is not None and decision.answer == "indistinguishable" and decision.screened, decision
        assert verdict.final_decision is False
        assert decision.pool_note is not None and "too few to reach the level" in decision.pool_note
        assert decision.pool_items is None and decision.estimate is None
    finally:
        await pipeline.stop()


async def test_in_a_campaign_a_candidate_is_confirmed_on_the_pool_against_its_incumbent(settings: Settings,
                                                                                       tmp_path: Path) -> None:
    """The campaign's first candidate is confirmed against the base model and becomes the incumbent; the
    next is screened against the incumbent's validation scores and confirmed against the incumbent's
    own model, run on the same pool items; a copy of the first is then worse than the new incumbent."""
    assets = tmp_path / "assets"
    shutil.copytree(settings.assets, assets)
    add_pooled_benchmark(assets, items=400)  # 640 pool items: room for two confirmations and their estimates
    settings = settings.model_copy(update={"judge_policy": "better", "bench_max_items": 40, "assets_dir": assets})
    task = TASK.model_copy(update={"campaign": "tripling"})
    pipeline = Pipeline(settings)
    try:
        await pipeline.start()
        assert pipeline.client is not None and pipeline.bus is not None
        private = await pipeline.bus.private_artifacts()

        # Right on every second item (the base model: every fourth).
        first = await pipeline.client.submit(write_workspace(tmp_path / "first"), task)
        verdict = await pipeline.client.wait(first, timeout_s=120)
        decision = verdict.result.decision
        assert decision is not None and decision.answer == "better" and decision.incumbent is None, decision
        assert verdict.final_decision is True, verdict.return_checking
        assert verdict.result.campaign is not None and verdict.result.campaign.accepted

        # Right on every item: better than the incumbent, confirmed against the incumbent's own runs.
        second = await pipeline.client.submit(
            write_workspace(tmp_path / "second", train={"standin_accuracy_every": 1}), task)
        verdict = await pipeline.client.wait(second, timeout_s=120)
        decision = verdict.result.decision
        assert decision is not None and decision.answer == "better", decision
        assert (decision.reference, decision.incumbent) == (f"the incumbent {first}", first)
        assert decision.summary.startswith(f"better than the incumbent {first}: confirmed on "), decision.summary
        # The true gain over the incumbent on the pool is +0.5 (every item against every second one).
        assert decision.estimate_low is not None and decision.estimate_high is not None
        assert decision.estimate_low < 0.5 < decision.estimate_high, decision
        assert verdict.final_decision is True, verdict.return_checking
        assert verdict.result.campaign is not None and verdict.result.campaign.incumbent == first
        names = [n for n, _ in await private.list_objects()]
        # The incumbent ran on the candidate's pool jobs (its logs private), and those runs are cached.
        assert any(n.startswith(f"{second}/logs/benchmark-incumbent-pool-") for n in names), names
        assert any(n.startswith(f"cache/incumbent/{first}/") for n in names), names

        # A copy of the first: worse than the new incumbent on validation, refused, no pool item spent.
        copy = await pipeline.client.submit(write_workspace(tmp_path / "copy"), task)
        verdict = await pipeline.client.wait(copy, timeout_s=120)
        decision = verdict.result.decision
        assert decision is not None and decision.answer == "worse" and decision.incumbent == second, decision
        assert verdict.final_decision is False
        assert f"worse than the incumbent {second} on validation" in decision.summary
    finally:
        await pipeline.stop()
