"""`ftbus compare` and `Client.compare` on requests that really ran: real nats-server and services, the
stand-in toolchain (whose model answers every k-th validation item right), the real `ftbus` executable."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from ftbus import Client
from ftbus.compare import NotComparable
from shared.events import TaskSpec
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace
from tests.integration.test_delivery import run_ftbus

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")


async def test_compare_two_requests_in_words_and_json_and_refuse_what_cannot_be_paired(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    assert pipeline.client is not None
    strong, weak = [await pipeline.client.submit(write_workspace(tmp_path / name, train={"standin_accuracy_every": k}),
                                                 TASK) for name, k in (("strong", 1), ("weak", 3))]
    verdicts = await asyncio.gather(*(pipeline.client.wait(rid, timeout_s=180) for rid in (strong, weak)))
    for verdict in verdicts:
        assert verdict.status == "completed", verdict.execution
    items = sum(len(ids) for ids in verdicts[0].result.benchmark.item_ids.values())
    assert items >= 6

    code, out, err = await run_ftbus(settings, "compare", strong, weak)
    assert code == 0, err[-3000:]
    said = " ".join(out.split())
    assert re.match(rf"{strong} is better than {weak} by \+0\.\d\d \(95% CI \+0\.\d\d to \+\d\.\d\d, "
                    rf"two-sided p = [0-9.e-]+, threshold 0\.05, {items} items\)", said), said
    # tiny-arith's subsets (10 and 6 validation items) weigh the same: the weighted betting test.
    assert "a betting test of the mean difference, each of the 2 subsets weighing the same, with its " \
           "confidence interval" in said and "tiny-arith validation" in said

    code, out, err = await run_ftbus(settings, "compare", weak, strong, "--json", "--level", "0.9")
    assert code == 0, err[-3000:]
    result = json.loads(out)
    assert result["first"] == weak and result["second"] == strong and result["benchmark"] == "tiny-arith"
    paired = result["paired"]
    assert paired["level"] == 0.9 and paired["items"] == items and paired["ci_high"] < 0 < paired["baseline_mean"]
    # The difference of the two requests' headline scores: the mean of the subsets' means, as primary_value.
    strong_mean, weak_mean = (v.result.benchmark.primary_value for v in verdicts)
    assert abs(paired["difference"] - (weak_mean - strong_mean)) < 1e-9
    assert abs(paired["candidate_mean"] - weak_mean) < 1e-9 and abs(paired["baseline_mean"] - strong_mean) < 1e-9
    assert result["summary"].startswith(f"{weak} is worse than {strong} by -")

    # The Python API says the same, async and blocking.
    async with Client(settings=settings) as client:
        same = await client.compare(weak, strong, level=0.9)
    assert same.summary == result["summary"]
    blocking = await asyncio.to_thread(Client(settings=settings).run, lambda c: c.compare(strong, weak))
    assert blocking.paired.difference == -paired["difference"]

    # Refused, saying why: a request with no verdict yet, an unknown one, the same one twice.
    # Its training waits for a gate never opened: it has no verdict until it is cancelled.
    slow = await pipeline.client.submit(write_workspace(tmp_path / "slow", train={
        "standin_gate_file": str(tmp_path / "never-opened")}), TASK)
    try:
        code, out, err = await run_ftbus(settings, "compare", strong, slow)
        assert code == 2 and out == ""
        assert f"{slow} has no verdict yet" in " ".join(err.split())
        async with Client(settings=settings) as client:
            try:
                await client.compare(slow, strong)
            except NotComparable as exc:
                assert f"{slow} has no verdict yet" in str(exc)
            else:
                raise AssertionError("a request without a verdict was compared")
    finally:
        await pipeline.client.cancel(slow, "test over")
    code, _, err = await run_ftbus(settings, "compare", strong, "20990101-000000-00000000")
    assert code == 2 and "unknown request 20990101-000000-00000000" in err
    code, _, err = await run_ftbus(settings, "compare", strong, strong, "--json")
    assert code == 2 and "compare two different requests" in err
