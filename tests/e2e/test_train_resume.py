"""Issue 37's resume, shown with the real toolchain: a LlamaFactory training on a plain nats-server,
its `ftbus worker train` killed with SIGKILL half way and replaced by a new worker, finishes resumed
from its latest checkpoint with a continuous loss history. Here 80 steps, a checkpoint every 6,
killed past step 36 once the checkpoint of step 24 or later is uploaded (a tiny model's step takes
less time than an upload on a loaded machine, so the kill waits for one), and resumed from it, so
that `make test` stays short; the issue's 400-step run, killed after step 200, and its time against an
uninterrupted one are bench/train_resume.py's (`make bench`), through the same code."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.train_resume import resume_settings, run_training, workspace
from ftbus.embedded import EmbeddedServer
from shared.settings import Settings

pytestmark = pytest.mark.e2e

STEPS, EVERY, KILL_AFTER, UPLOADED = 80, 6, 36, 24


@pytest.mark.timeout(1800)  # real training steps on 2 loaded cores, twice started: minutes
async def test_a_training_killed_half_way_resumes_from_its_checkpoint(
    nats_server: EmbeddedServer, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    base = Settings(home=tmp_path / "home", assets_dir=real_assets, toolchain_bin=toolchain_bin,
                    log_format="json", log_level="WARNING")
    run = await run_training(resume_settings(base, nats_server, EVERY), workspace(tmp_path / "ws", STEPS),
                             KILL_AFTER, uploaded=UPLOADED)
    assert run.verdict is not None and run.verdict.status == "completed", run.verdict
    assert run.resumed_from_step is not None and run.resumed_from_step >= UPLOADED, run.resumed_from_step
    assert f"resumed from step {run.resumed_from_step}" in run.verdict.execution
    assert run.loss_steps == list(range(1, STEPS + 1))  # no gap, no repeated step
