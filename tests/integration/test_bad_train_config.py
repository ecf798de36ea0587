"""Each bad train.yaml ends with a verdict that names the problem, and no worker dies."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.events import TaskSpec
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")


@pytest.mark.parametrize(
    ("train_yaml", "expected"),
    [
        ("model_name_or_path: tiny-standin\nstage: sft\n  dataset: [unclosed\n", "line"),
        ("model_name_or_path: no-such-model\nstage: sft\ndataset: processed_data\n", "no-such-model"),
        ("model_name_or_path: tiny-standin\nstage: sft\ndataset: undeclared_set\n", "undeclared_set"),
    ],
    ids=["unparsable", "unknown-model", "undeclared-dataset"],
)
async def test_bad_train_yaml_gets_a_verdict_naming_the_problem(
    pipeline: Pipeline, tmp_path: Path, train_yaml: str, expected: str
) -> None:
    await pipeline.start()
    bad = write_workspace(tmp_path / "bad")
    (bad / "train.yaml").write_text(train_yaml)
    rid = await pipeline.client.submit(bad, TASK)
    verdict = await pipeline.client.wait(rid, timeout_s=60)
    assert verdict.final_decision is False
    assert verdict.failed_stage == "training"
    text = verdict.execution + verdict.return_checking + verdict.code
    assert expected in text, text
    assert "train.yaml" in text

    # The same workers go on serving: a good request right after passes.
    good = write_workspace(tmp_path / "good")
    rid = await pipeline.client.submit(good, TASK)
    assert (await pipeline.client.wait(rid, timeout_s=60)).final_decision is True
