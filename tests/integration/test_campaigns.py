"""A campaign on a real nats-server with real services (the stand-in toolchain, whose model answers
every k-th validation item right; the base model every fourth): `Client.submit(campaign=...)`,
`ftbus submit --campaign`, `campaign` in `--tasks` lines, and `ftbus campaign NAME`, the real executable.

tiny-arith's validation split has 16 items in two subsets (10 and 6): only a model right on every item
beats the base model beyond noise there, so a campaign's incumbent is that one."""

from __future__ import annotations

import json
from pathlib import Path

from ftbus import Client
from shared.online_testing import CAMPAIGN_ALPHA, gamma, two_sided_level
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace
from tests.integration.test_delivery import run_ftbus

TASK = {"base_model": "tiny-standin", "benchmark": "tiny-arith"}


async def test_a_campaign_keeps_its_incumbent_and_refuses_what_does_not_beat_it(
    pipeline: Pipeline, settings: Settings, tmp_path: Path
) -> None:
    await pipeline.start()
    name = "search"

    # 1. Client.submit(campaign=...): half the items right, against the base model (no incumbent yet).
    #    3 items better of 16: not beyond noise, refused; it spends the first level and is no incumbent.
    async with Client(settings=settings) as client:
        half = await client.submit(write_workspace(tmp_path / "half"), **TASK, campaign=name)
        verdict = await client.wait(half, timeout_s=180)
        assert verdict.status == "completed", verdict.execution
        check = verdict.result.campaign
        assert check is not None and (check.campaign, check.index, check.incumbent) == (name, 1, None)
        assert not check.better and not check.accepted and verdict.final_decision is False
        assert check.summary.startswith("not distinguishable from the base model (no incumbent yet)")
        assert "detectable at 80% power" in check.summary  # with 16 items: what it could have found
        assert check.level is not None and abs(check.level - CAMPAIGN_ALPHA * gamma(1)) < 1e-12
        assert f"campaign {name} accepts only a candidate that beats its incumbent" in verdict.return_checking
        record = await client.campaign(name)
        assert record is not None and record.incumbent is None and record.state.tests == 1

    # 2. `ftbus submit --campaign --wait --json`: every item right, tested second (its level alpha * gamma(2)):
    #    beyond noise against the base model, accepted, the incumbent.
    strong = write_workspace(tmp_path / "strong", train={"standin_accuracy_every": 1})
    code, out, err = await run_ftbus(settings, "submit", str(strong), "--base-model", TASK["base_model"],
                                     "--benchmark", TASK["benchmark"], "--campaign", name, "--wait", "--json")
    assert code == 0, err[-3000:]
    accepted = json.loads(out)
    incumbent = accepted["request_id"]
    check = accepted["result"]["campaign"]
    assert (check["index"], check["incumbent"], check["better"], check["accepted"]) == (2, None, True, True)
    assert abs(check["paired"]["level"] - two_sided_level(CAMPAIGN_ALPHA * gamma(2))) < 1e-12
    assert check["summary"].startswith("better than the base model (no incumbent yet) by +")

    # 3. `--tasks`: a copy of the incumbent and a weaker candidate, submitted at once (the judge's
    #    compare-and-set orders them): both refused, each naming the incumbent's request id.
    write_workspace(tmp_path / "copy", train={"standin_accuracy_every": 1})
    write_workspace(tmp_path / "weaker", train={"standin_accuracy_every": 3})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"workspace": "copy", "campaign": name}) + "\n"
                     + json.dumps({"workspace": "weaker"}) + "\n")  # its campaign from --campaign
    code, out, err = await run_ftbus(settings, "submit", "--tasks", str(tasks), "--base-model", TASK["base_model"],
                                     "--benchmark", TASK["benchmark"], "--campaign", name, "--json")
    assert code == 1, err[-3000:]  # a final_decision false in the batch
    copy, weaker = json.loads(out)
    for verdict in (copy, weaker):
        assert verdict["final_decision"] is False and verdict["result"]["campaign"]["incumbent"] == incumbent
        assert sorted([copy["result"]["campaign"]["index"], weaker["result"]["campaign"]["index"]]) == [3, 4]
    assert copy["result"]["campaign"]["summary"].startswith(f"not distinguishable from the incumbent {incumbent}")
    assert f"not distinguishable from the incumbent {incumbent}" in copy["return_checking"]
    # A third of 16 items right against all of them: refused. On 16 items the betting test (valid for any
    # shape of differences) does not reach "worse" at the campaign's small level; it names the incumbent.
    summary = weaker["result"]["campaign"]["summary"]
    assert summary.startswith((f"worse than the incumbent {incumbent} by -",
                               f"not distinguishable from the incumbent {incumbent} (difference -")), summary
    assert not weaker["result"]["campaign"]["accepted"]
    assert f"the incumbent {incumbent}" in weaker["return_checking"]

    # 4. `ftbus campaign NAME`: the incumbent and its history, in words and as JSON.
    code, out, err = await run_ftbus(settings, "campaign", name, "--json")
    assert code == 0, err[-3000:]
    shown = json.loads(out)
    assert shown["incumbent"] == incumbent and shown["incumbents"] == [incumbent]
    assert [e["request_id"] for e in shown["history"]][:2] == [half, incumbent]
    assert {e["request_id"] for e in shown["history"][2:]} == {copy["request_id"], weaker["request_id"]}
    assert [e["accepted"] for e in shown["history"]] == [False, True, False, False]
    assert shown["state"]["tests"] == 4 and shown["state"]["carried"] == 0.0
    assert abs(shown["next_level"] - CAMPAIGN_ALPHA * gamma(5)) < 1e-12
    code, out, err = await run_ftbus(settings, "campaign", name)
    assert code == 0, err[-3000:]
    said = " ".join(out.split())
    assert f"campaign {name}: tiny-arith with base model tiny-standin; 4 candidates tested" in said
    assert f"incumbent: {incumbent}, accepted" in said
    for rid in (half, incumbent, copy["request_id"], weaker["request_id"]):
        assert rid in said
    code, out, err = await run_ftbus(settings, "campaign", "never-used")
    assert code == 2 and out == "" and "no campaign never-used" in " ".join(err.split())
