"""A train worker killed with SIGKILL mid-run: the next worker resumes from the latest complete
checkpoint in the checkpoints store, and the status, the verdict and the loss history say so.

Stand-in llamafactory-cli (HF-like checkpoints, resume_from_checkpoint honoured); the real
toolchain's run is tests/e2e/test_train_resume.py's."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgpack

from bench.train_resume import worker_env
from services.trainer.checkpoints import read_manifest, read_manifest_quietly
from shared.codec import decode
from shared.events import Stage, TaskSpec, TrainResult
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
REPO = Path(__file__).resolve().parents[2]
EVERY = 5


async def test_a_killed_trainer_is_resumed_from_its_latest_checkpoint(tmp_path: Path, settings: Settings) -> None:
    settings = settings.model_copy(update={"train_checkpoint_every_steps": EVERY})
    pipeline = Pipeline(settings)
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ftbus.cli", "worker", "train", cwd=REPO, env=worker_env(settings),
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await pipeline.start([Stage.data, Stage.bench, Stage.judge, Stage.aggregate])
        assert pipeline.bus is not None and pipeline.client is not None
        # The first training stops before step 11 until the gate opens: its checkpoint of step 10 is
        # certainly its latest when it is killed, however slow or fast the machine.
        gate = tmp_path / "gate"
        ws = write_workspace(tmp_path / "ws", train={"max_steps": 40, "standin_gate_file": str(gate),
                                                     "standin_gate_step": 2 * EVERY + 1})
        rid = await pipeline.client.submit(ws, TASK)

        store = await pipeline.bus.checkpoint_artifacts()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180  # hang guard
        while (manifest := await read_manifest_quietly(store, rid)) is None or manifest.step < 2 * EVERY:
            assert worker.returncode is None, "the train worker exited by itself"
            assert loop.time() < deadline, "no checkpoint of step 10 was uploaded"
            await asyncio.sleep(0.2)
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and its training, as a lost node would
        await asyncio.wait_for(worker.wait(), timeout=30)  # hang guard: SIGKILL is at once
        saved = await read_manifest(store, rid)
        assert saved is not None and saved.step == 2 * EVERY

        gate.touch()
        await pipeline.start([Stage.train])  # the replacement worker
        verdict = await pipeline.client.wait(rid, timeout_s=240)
        assert verdict.status == "completed", verdict.execution
        view = await pipeline.client.status(rid)
        assert view is not None
        resumed = view.stages["train"].resumed_from_step
        assert resumed is not None and resumed >= saved.step
        assert f"resumed from step {resumed}" in verdict.execution

        bucket = await pipeline.bus.kv(pipeline.bus.subjects.kv_stage_results("train"))
        stored = msgpack.unpackb((await bucket.get(f"{rid}.train")).value, raw=False)
        result = decode(stored[0][2], TrainResult)
        steps = [p.step for p in result.train.training_metrics.loss_history.train]
        assert steps == list(range(1, 41)), steps  # no gap, no repeat
        # Training ended: its checkpoints are gone.
        assert await read_manifest_quietly(store, rid) is None
    finally:
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await asyncio.wait_for(worker.wait(), timeout=30)
        await pipeline.stop()
