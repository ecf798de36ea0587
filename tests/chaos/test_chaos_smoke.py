"""The chaos smoke (`python -m chaos.run --smoke`): a 3-node cluster, each node with its workers on
its own host (a network namespace), two workers per stage, two aggregators, 24 requests of every
kind, and a few faults (a worker SIGKILLed, the events leader's host cut off from the others for
8 s, a worker SIGSTOPped past ack_wait, the events leader's node SIGKILLed, an aggregator
restarted, every train worker SIGKILLed while a checkpointing training runs: it must resume).
Where namespaces cannot be made, the run stays on loopback without the partition: the
test checks the guarantee, then reports a skip saying why. The full run is `make chaos`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_chaos_smoke_loses_duplicates_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--smoke", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=840, check=False,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert out.is_file(), report
    result = json.loads(out.read_text())
    assert result["lost"] == [] and result["duplicated"] == [] and result["wrong"] == [], report
    assert result["unsubmitted"] == [] and result["leftovers"] == [], report  # namespaces and links too
    assert sum(result["faults"].values()) >= 4, report  # the faults were really injected
    assert result["errors"] == {}, report  # no error verdict: the faults use up no request's attempts
    assert result["ok"] == result["requests"] >= 20, report
    assert all(loss["lost"] == 0 and loss["acked"] > 0 for loss in result["ack_loss"]), report
    # The trainer killed mid-run: its request resumed from the checkpoint uploaded before the kill.
    assert result["faults"].get("kill_trainer") == 1 and result["resumed"] == 1, report
    assert result["not_resumed"] == [], report
    assert proc.returncode == 0, report
    # One test, not two sharing a fixture: `make test` spreads tests over processes, and the smoke
    # must run once. Its partition part, where namespaces could not be made, is reported as a skip.
    if not result["network"].startswith("namespaces"):
        pytest.skip(f"the guarantee held, but without the partition: {result['network']}")
    assert result["faults"].get("partition_leader") == 1, report
    assert any("partition_leader: " in line and "healed" in line for line in result["fault_log"]), report
