"""Integration fixtures: one real nats-server per test session, a fresh subject prefix per test.

Each test gets its own prefix (so its own streams, consumers and buckets) on the shared server,
which keeps tests independent without paying for a server start each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftbus.client import Client
from ftbus.embedded import EmbeddedServer
from shared.bus import Bus
from shared.events import Stage
from shared.settings import Settings

HERE = Path(__file__).resolve().parent
STANDIN = HERE.parent / "standin"


@pytest.fixture(scope="session")
def standin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in toolchain executables, run by this interpreter (it has pyyaml)."""
    bin_dir = tmp_path_factory.mktemp("standin-bin")
    for script in STANDIN.iterdir():
        if script.is_file() and not script.name.endswith((".md", ".py")):
            body = script.read_text().split("\n", 1)[1]
            target = bin_dir / script.name
            target.write_text(f"#!{sys.executable}\n{body}")
            target.chmod(0o755)
    return bin_dir


@pytest.fixture(scope="session")
def assets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.standin.assets import build_standin_assets

    root = tmp_path_factory.mktemp("assets")
    build_standin_assets(root)
    return root


@pytest.fixture
def settings(tmp_path: Path, nats_server: EmbeddedServer, standin_bin: Path, assets_dir: Path) -> Settings:
    return Settings(
        home=tmp_path / "home",
        assets_dir=assets_dir,
        nats_url=nats_server.url,
        subject_prefix="t" + secrets.token_hex(4),
        toolchain_bin=standin_bin,
        ack_wait_s=4.0,
        heartbeat_s=1.0,
        max_deliver=3,
        retry_backoff_s=[0.2, 0.5],
        sweep_interval_s=1.0,
        log_format="console",
        log_level="WARNING",
    )


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    """A connection to this test's topology (streams, buckets, consumers of its prefix)."""
    bus = await Bus.connect(settings, name="integration-test")
    await bus.ensure_topology()
    yield bus
    await bus.close()


class Pipeline:
    """Services running in this process (each stage its own task), plus a client."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.client: Client | None = None
        self._stops: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, stages: list[Stage] | None = None, concurrency: int | None = None) -> None:
        """``concurrency`` None: each stage at its own default (light stages many messages at once)."""
        from ftbus.cli import run_services

        if self.bus is None:
            self.bus = await Bus.connect(self.settings)
            await self.bus.ensure_topology()
            self.client = Client.on_bus(self.bus)
        stop = asyncio.Event()
        self._stops.append(stop)
        self._tasks.append(asyncio.create_task(run_services(self.bus, stages or list(Stage), concurrency, stop)))
        await asyncio.sleep(0.3)  # consumers are created when the workers start

    async def stop(self) -> None:
        for stop in self._stops:
            stop.set()
        for task in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=15)
        if self.bus is not None:
            await self.bus.close()


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    p = Pipeline(settings)
    yield p
    await p.stop()


def write_workspace(root: Path, *, script: str | None = None, train: dict | None = None,
                    drop: tuple[str, ...] = ()) -> Path:
    """A small candidate workspace: process_data.py, dataset_info.json, train.yaml."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    files = {
        "process_data.py": script
        or (
            "import json\n"
            "records = [{'instruction': f'add {i} and {i}', 'input': '', 'output': str(2 * i)} for i in range(40)]\n"
            "json.dump(records, open('data.json', 'w'))\n"
            "print('wrote', len(records), 'records')\n"
        ),
        "dataset_info.json": json.dumps(
            {"processed_data": {"file_name": "data.json", "formatting": "alpaca",
                                "columns": {"prompt": "instruction", "query": "input", "response": "output"}}}
        ),
        "train.yaml": yaml.safe_dump(
            {
                "model_name_or_path": "tiny-standin",
                "stage": "sft",
                "do_train": True,
                "finetuning_type": "lora",
                "dataset": "processed_data",
                "template": "default",
                "max_steps": 5,
                **(train or {}),
            }
        ),
    }
    for name, text in files.items():
        if name not in drop:
            (root / name).write_text(text)
    return root


async def wait_for_file(path: Path, timeout_s: float = 60.0) -> None:
    """Poll for a file another process writes (a stand-in's pid file, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not path.is_file() and loop.time() < deadline:
        await asyncio.sleep(0.1)
    assert path.is_file(), f"{path} did not appear within {timeout_s:.0f} s"
