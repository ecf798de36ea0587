"""Hostile workspaces: each gets a clear verdict (or a clear refusal at submit) while the services
stay up and the run's disk stays within its quota (runners/quota.py).

Client side (refused before upload): a huge file, 100k small files, symlinks, FIFOs, names that
are not UTF-8, folders nested past the path limit. Server side (a verdict): a YAML alias bomb, a
binary train.yaml, a 10 MB train.yaml, a process_data.py that writes a multi-GB data.json, one
that never ends, one that fills the disk with files, and one that leaves links, FIFOs, hard links
and odd names behind.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from runners.quota import measure
from shared.artifacts import WorkspaceTooLarge
from shared.events import Stage, TaskSpec, Timeouts
from shared.paths import UnsafePath
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
MB = 2**20
QUOTA = 48 * MB


@pytest.fixture
def hostile_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={
        "data_disk_quota_bytes": QUOTA, "train_disk_quota_bytes": QUOTA, "run_max_files": 3000,
        "quota_poll_s": 0.2, "max_data_json_bytes": 8 * MB, "max_workspace_bytes": 16 * MB,
        "max_workspace_files": 500,
    })


async def test_the_client_refuses_hostile_trees_before_uploading(
    hostile_settings: Settings, tmp_path: Path
) -> None:
    pipeline = Pipeline(hostile_settings)
    await pipeline.start([Stage.aggregate])
    client = pipeline.client
    assert client is not None
    try:
        cases: list[tuple[str, Path, type[Exception], str]] = []
        huge = write_workspace(tmp_path / "huge")
        with (huge / "weights.bin").open("wb") as fh:
            fh.truncate(20 * MB)  # sparse: the size is what counts
        cases.append(("huge file", huge, WorkspaceTooLarge, "over the limit of"))
        many = write_workspace(tmp_path / "many")
        (many / "small").mkdir()
        for i in range(100_000):
            (many / "small" / str(i)).touch()
        cases.append(("100k small files", many, WorkspaceTooLarge, "100003 files"))
        link = write_workspace(tmp_path / "link")
        (link / "secrets").symlink_to("/etc/passwd")
        cases.append(("symlink", link, UnsafePath, "symlink"))
        fifo = write_workspace(tmp_path / "fifo")
        os.mkfifo(fifo / "pipe")
        cases.append(("FIFO", fifo, UnsafePath, "not a regular file"))
        odd = write_workspace(tmp_path / "odd")
        (odd / os.fsdecode(b"bad-\xff-name.txt")).write_text("x")
        cases.append(("non-UTF-8 name", odd, UnsafePath, "not valid UTF-8"))
        deep = write_workspace(tmp_path / "deep")
        folder = deep
        for _ in range(400):
            folder = folder / "d"
            folder.mkdir()
        (folder / "bottom.txt").write_text("x")
        cases.append(("deep folders", deep, UnsafePath, "folders deep"))

        for name, ws, error, needle in cases:
            with pytest.raises(error) as caught:
                # A hang guard (a FIFO read, a walk that never ends): the refusal itself is not timed.
                await asyncio.wait_for(client.submit(ws, TASK), 60)
            assert needle in str(caught.value), (name, str(caught.value))
        # A hard link is a regular file: its content is uploaded, nothing outside is reachable.
        hard = write_workspace(tmp_path / "hard")
        os.link(hard / "train.yaml", hard / "copy.yaml")
        assert await client.submit(hard, TASK)
    finally:
        await pipeline.stop()


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9)
) + "model_name_or_path: tiny-standin\nstage: sft\ndataset: processed_data\n"

SCRIPTS: dict[str, str] = {
    "multi-GB data.json": (
        "with open('data.json', 'wb') as f:\n"
        "    f.write(b'[')\n"
        "    for _ in range(4 * 1024):\n"
        "        f.write(b'\"' + b'x' * 2**20 + b'\",')\n"
    ),
    "never ends": "import time\nwhile True:\n    time.sleep(1)\n",
    "fills the disk with files": (
        "import os\nos.makedirs('junk', exist_ok=True)\n"
        "for i in range(10**6):\n    open(f'junk/{i}', 'wb').write(b'x' * 4096)\n"
    ),
    "data.json over the size limit": (
        "import json\njson.dump([{'instruction': 'x' * 1000, 'input': '', 'output': 'y'}] * 12000,"
        " open('data.json', 'w'))\n"
    ),
    "links, FIFOs and odd names left behind": (
        "import json, os\n"
        "os.symlink('/etc/passwd', 'data.json')\n"
        "os.mkfifo('fifo')\nos.link('process_data.py', 'hard')\n"
        "open(os.fsdecode(b'odd-\\xff'), 'w').write('x')\n"
        "d = '.'\n"
        "for _ in range(50):\n    d = os.path.join(d, 'deep')\n    os.mkdir(d)\n"
    ),
}

TRAIN_YAMLS: dict[str, bytes] = {
    "YAML alias bomb": ALIAS_BOMB.encode(),
    "binary train.yaml": bytes(range(256)) * 64,
    "10 MB train.yaml": (b"model_name_or_path: tiny-standin\nstage: sft\ndataset: processed_data\n"
                         + b"".join(b"k%d: %s\n" % (i, b"v" * 90) for i in range(100_000))),
}


async def test_hostile_runs_get_clear_verdicts_and_the_services_stay_up(
    hostile_settings: Settings, tmp_path: Path
) -> None:
    pipeline = Pipeline(hostile_settings)
    await pipeline.start()
    client = pipeline.client
    assert client is not None
    try:
        submitted: dict[str, str] = {}
        for name, script in SCRIPTS.items():
            ws = write_workspace(tmp_path / name.replace(" ", "_"), script=script)
            timeouts = Timeouts(data_processing=8.0) if name == "never ends" else Timeouts()
            submitted[name] = await client.submit(ws, TASK, timeouts)
        for name, text in TRAIN_YAMLS.items():
            ws = write_workspace(tmp_path / name.replace(" ", "_"))
            (ws / "train.yaml").write_bytes(text)
            submitted[name] = await client.submit(ws, TASK)

        peak = 0
        verdicts: dict[str, Any] = {}

        async def watch_disk() -> None:
            nonlocal peak
            while True:
                peak = max(peak, (await asyncio.to_thread(measure, hostile_settings.work)).bytes)
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch_disk())
        try:
            results = await asyncio.gather(*(client.wait(rid, timeout_s=240) for rid in submitted.values()))
        finally:
            watcher.cancel()
        verdicts = dict(zip(submitted, results, strict=True))

        def text(v: Any) -> str:
            return f"{v.execution}\n{v.return_checking}\n{v.raw_execution}"

        for name, verdict in verdicts.items():
            assert verdict.status == "completed", f"{name}: {verdict.status}: {verdict.execution}"
            assert verdict.final_decision is False, name
        expect = {
            "multi-GB data.json": ("data_processing", "disk quota exceeded"),
            "never ends": ("data_processing", "timed out"),
            "fills the disk with files": ("data_processing", "quota exceeded"),
            "data.json over the size limit": ("data_processing", "max_data_json_bytes"),
            "links, FIFOs and odd names left behind": ("data_processing", "data.json refused"),
            "YAML alias bomb": ("training", "train.yaml"),
            "binary train.yaml": ("training", "train.yaml"),
            "10 MB train.yaml": ("precheck", "max_train_yaml_bytes"),
        }
        for name, (stage, needle) in expect.items():
            verdict = verdicts[name]
            assert verdict.failed_stage == stage, f"{name}: {verdict.failed_stage}: {verdict.execution}"
            assert needle in text(verdict), f"{name}: {needle!r} not in {text(verdict)[:2000]}"
        # Several runs at once, each within its quota (plus what the stage itself keeps there).
        assert peak < 4 * QUOTA, f"the work folder reached {peak / MB:.0f} MiB"

        # Every service is still up, and a plain request still passes.
        assert all(not task.done() for task in pipeline._tasks)
        rid = await client.submit(write_workspace(tmp_path / "plain"), TASK)
        verdict = await client.wait(rid, timeout_s=180)
        assert verdict.status == "completed" and verdict.final_decision is True, verdict.execution
    finally:
        await pipeline.stop()
