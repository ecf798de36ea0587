"""A training killed with SIGKILL half way and resumed by a new worker, against the same training
uninterrupted (real toolchain: LlamaFactory on the tiny model, on a plain nats-server, one worker
per stage).

The training: LoRA SFT of tiny-llama, 400 steps of 64 reviews (batch 8, eight accumulation steps), a
checkpoint every 40 steps (``train_checkpoint_every_steps``). A real step takes seconds; the tiny
model's a fraction of one, and at batch 1 (30 ms a step) the whole training is shorter than the
fixed cost of a takeover, so a row states that cost in seconds as well.

The killed run's train worker is a `ftbus worker train` process: once the request's status shows
a step past 200, its process group gets SIGKILL (the worker and its LlamaFactory, as a lost
node), and a new train worker starts. Its message comes back after ``ack_wait_s`` (10 s here),
and it resumes from the latest uploaded checkpoint.

Training time is the train stage's, from its first start to its result (the record's timing): the
killed run's includes the lost steps since the checkpoint, the wait for the redelivery and the
second model load. Target: at most 1.3x the uninterrupted run. The takeover's fixed cost is the
killed run's time less the uninterrupted run's and less the steps trained twice (since the
checkpoint): the redelivery wait (``ack_wait_s``) and the second start of the training. The same
training with checkpoints off says what the checkpoints themselves cost.

    python bench/train_resume.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import yaml
from pydantic import BaseModel
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ftbus.client import Client  # noqa: E402
from ftbus.embedded import EmbeddedServer  # noqa: E402
from shared.codec import decode  # noqa: E402
from shared.events import Stage, TaskSpec, TrainResult, Verdict  # noqa: E402
from shared.settings import Settings  # noqa: E402

console = Console(stderr=True)
TASK = TaskSpec(base_model="tiny-llama", benchmark="tiny-sentiment", involving_datasets=["tiny-reviews"])
STEPS = 400
KILL_AFTER = 200
EVERY = 40
#: Reviews a step: a batch of 8, accumulated 8 times.
BATCH, ACCUMULATION = 8, 8
TARGET = 1.3


class TrainingRun(BaseModel):
    #: None when only training was run (``verdict=False``).
    verdict: Verdict | None
    train_s: float
    resumed_from_step: int | None
    loss_steps: list[int]
    #: The step the status showed when the first worker was killed (None: not killed).
    killed_at_step: int | None = None


def workspace(dest: Path, steps: int = STEPS, batch: int = 1, accumulation: int = 1) -> Path:
    """The LoRA example, ``steps`` steps of ``batch`` x ``accumulation`` reviews, its own save_steps left
    out (the setting's apply)."""
    shutil.copytree(REPO / "examples" / "lora", dest)
    config = yaml.safe_load((dest / "train.yaml").read_text())
    config.pop("save_steps", None)
    config.update(max_steps=steps, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                  learning_rate=1.0e-3, plot_loss=False)
    (dest / "train.yaml").write_text(yaml.safe_dump(config))
    with (dest / "process_data.py").open("a") as fh:
        fh.write(f"\n# run {secrets.token_hex(4)}: defeats the data cache\n")
    return dest


def resume_settings(base: Settings, server: EmbeddedServer, every: int = EVERY) -> Settings:
    return base.model_copy(update={
        "nats_url": server.url, "subject_prefix": "r" + secrets.token_hex(4), "sandbox": "local",
        "bench_engine": "cold", "train_checkpoint_every_steps": every, "ack_wait_s": 10.0, "heartbeat_s": 2.0,
    })


def worker_env(settings: Settings) -> dict[str, str]:
    """A `ftbus worker` subprocess's environment: these settings, nothing inherited of FTBUS_*."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FTBUS_")},
        "PYTHONPATH": str(REPO),
        "FTBUS_HOME": str(settings.home),
        "FTBUS_NATS_URL": settings.nats_url,
        "FTBUS_SUBJECT_PREFIX": settings.subject_prefix,
        "FTBUS_ASSETS_DIR": str(settings.assets),
        "FTBUS_TOOLCHAIN_BIN": str(settings.toolchain_path()),
        "FTBUS_SANDBOX": settings.sandbox,
        "FTBUS_ACK_WAIT_S": str(settings.ack_wait_s),
        "FTBUS_HEARTBEAT_S": str(settings.heartbeat_s),
        "FTBUS_TRAIN_CHECKPOINT_EVERY_STEPS": str(settings.train_checkpoint_every_steps),
        "FTBUS_LOG_FORMAT": "json",
        "FTBUS_LOG_LEVEL": "WARNING",
    }


async def _train_result(bus: Any, client: Client, rid: str, timeout_s: float) -> TrainResult:
    """The request's stored training result, once the status shows training finished."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (view := await client.status(rid)) is None or "train" not in view.stages \
            or view.stages["train"].finished_at is None:
        if loop.time() > deadline:
            raise TimeoutError(f"{rid}: training did not finish within {timeout_s:.0f} s")
        await asyncio.sleep(0.5)
    bucket = await bus.kv(bus.subjects.kv_stage_results("train"))
    stored = msgpack.unpackb((await bucket.get(f"{rid}.train")).value, raw=False)
    return decode(stored[0][2], TrainResult)


async def run_training(settings: Settings, ws: Path, kill_after: int | None, timeout_s: float = 1500,
                       verdict: bool = True, uploaded: int = 0) -> TrainingRun:
    """One request through the pipeline (``verdict`` False: up to its training result only);
    with ``kill_after``, its first train worker is killed once the status shows a training step
    past it (and, with ``uploaded``, a checkpoint of at least that step uploaded), and a second one
    takes over."""
    from ftbus.cli import run_services
    from services.trainer.checkpoints import read_manifest_quietly
    from shared.bus import Bus

    bus = await Bus.connect(settings)
    await bus.ensure_topology()
    client = Client.on_bus(bus)
    stop = asyncio.Event()
    stages = [Stage.data, Stage.bench, Stage.judge, Stage.aggregate] if verdict else [Stage.data, Stage.aggregate]
    killed_at: int | None = None
    services = asyncio.create_task(run_services(bus, stages, None, stop))
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ftbus.cli", "worker", "train", cwd=REPO, env=worker_env(settings),
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rid = await client.submit(ws, TASK)
        if kill_after is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while True:
                view = await client.status(rid)
                progress = view.progress if view is not None else None
                if progress is not None and progress.stage == "train" and (progress.step or 0) > kill_after:
                    manifest = await read_manifest_quietly(await bus.checkpoint_artifacts(), rid) if uploaded else None
                    if not uploaded or (manifest is not None and manifest.step >= uploaded):
                        break
                if worker.returncode is not None or loop.time() > deadline:
                    raise RuntimeError(f"training never passed step {kill_after} (worker exit {worker.returncode})")
                await asyncio.sleep(0.2)
            os.killpg(worker.pid, signal.SIGKILL)  # the worker and its training: a lost node
            await worker.wait()
            killed_at = progress.step
            console.print(f"killed the train worker at step {killed_at}")
            worker = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ftbus.cli", "worker", "train", cwd=REPO, env=worker_env(settings),
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        result = await _train_result(bus, client, rid, timeout_s)
        final = await client.wait(rid, timeout_s=timeout_s) if verdict else None
        view = await client.status(rid)
        assert view is not None
        train = view.stages["train"]
        return TrainingRun(
            verdict=final, train_s=train.duration_s or 0.0, resumed_from_step=train.resumed_from_step,
            loss_steps=[p.step for p in result.train.training_metrics.loss_history.train],
            killed_at_step=killed_at,
        )
    finally:
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()
        stop.set()
        await asyncio.wait_for(services, timeout=60)
        await bus.close()


async def main() -> list[dict[str, object]]:
    from bench.real_tools import real_tool_settings

    scratch = Path(tempfile.mkdtemp(prefix="ftbus-resume-"))
    server = EmbeddedServer(scratch / "nats")
    server.start()
    try:
        base = real_tool_settings(scratch, console)
        # Training time only: the benchmark stage is left out (the e2e test runs the whole request).
        def ws(name: str) -> Path:
            return workspace(scratch / name, STEPS, BATCH, ACCUMULATION)

        bare = await run_training(resume_settings(base, server, every=0), ws("bare"), None, verdict=False)
        plain = await run_training(resume_settings(base, server), ws("plain"), None, verdict=False)
        killed = await run_training(resume_settings(base, server), ws("killed"), KILL_AFTER, verdict=False)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    ratio = killed.train_s / plain.train_s if plain.train_s else float("inf")
    continuous = killed.loss_steps == list(range(1, STEPS + 1))
    # Steps trained twice: from the checkpoint resumed to the step the first worker had reached.
    repeated = max(0, (killed.killed_at_step or 0) - (killed.resumed_from_step or 0))
    step_s = plain.train_s / STEPS
    takeover_s = killed.train_s - plain.train_s - repeated * step_s
    return [
        {"measure": f"training of {STEPS} steps of {BATCH * ACCUMULATION} reviews, checkpoints off",
         "value": f"{bare.train_s:.1f} s", "target": None, "met": None},
        {"measure": f"the same, a checkpoint every {EVERY} steps uploaded, uninterrupted",
         "value": f"{plain.train_s:.1f} s ({plain.train_s / bare.train_s:.2f}x: "
                  f"{(plain.train_s - bare.train_s) / (STEPS // EVERY):.2f} s a checkpoint)",
         "target": None, "met": None},
        {"measure": f"the same, SIGKILL after step {KILL_AFTER}, resumed by a new worker",
         "value": f"{killed.train_s:.1f} s ({ratio:.2f}x), killed at step {killed.killed_at_step}, resumed from "
                  f"step {killed.resumed_from_step}, loss history {'continuous' if continuous else 'NOT continuous'}",
         "target": f"<= {TARGET}x, resumed from step >= 160",
         "met": ratio <= TARGET and (killed.resumed_from_step or 0) >= 160 and continuous},
        {"measure": "a takeover's fixed cost (redelivery wait and second start; steps trained twice left out)",
         "value": f"{takeover_s:.1f} s ({repeated} steps trained twice, {repeated * step_s:.1f} s)",
         "target": None, "met": None},
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    args = parser.parse_args()
    rows = asyncio.run(main())
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            console.print(f"{row['measure']}: {row['value']} (target {row['target']}, met {row['met']})")
