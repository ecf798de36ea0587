"""Issue 37's resume, shown with the real toolchain: a 400-step LlamaFactory training on a plain
nats-server, its `ftbus worker train` killed with SIGKILL after step 200 and replaced by a new
worker, finishes resumed from step >= 160 with a continuous loss history. The run and its
comparison with an uninterrupted one are bench/train_resume.py's (`make bench`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.train_resume import KILL_AFTER, STEPS, resume_settings, run_training, workspace
from ftbus.embedded import EmbeddedServer
from shared.settings import Settings

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1800)  # 400 real training steps on 2 loaded cores, twice started: minutes
async def test_a_training_killed_after_step_200_resumes_from_its_checkpoint(
    nats_server: EmbeddedServer, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    base = Settings(home=tmp_path / "home", assets_dir=real_assets, toolchain_bin=toolchain_bin,
                    log_format="json", log_level="WARNING")
    run = await run_training(resume_settings(base, nats_server), workspace(tmp_path / "ws"), KILL_AFTER)
    assert run.verdict is not None and run.verdict.status == "completed", run.verdict
    assert run.resumed_from_step is not None and run.resumed_from_step >= 160, run.resumed_from_step
    assert f"resumed from step {run.resumed_from_step}" in run.verdict.execution
    assert run.loss_steps == list(range(1, STEPS + 1))  # no gap, no repeated step
