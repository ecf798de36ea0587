"""``Client``'s argument rules, refused before anything connects."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ftbus import Client, TaskSpec

TASK = TaskSpec(base_model="tiny-llama", benchmark="tiny-arith")


async def test_submit_takes_a_task_spec_or_its_fields_not_both_nor_neither(tmp_path: Path) -> None:
    client = Client(nats_url="nats://127.0.0.1:1")
    with pytest.raises(TypeError, match="not both"):
        await client.submit(tmp_path, TASK, base_model="other")
    with pytest.raises(TypeError, match="base_model= and benchmark="):
        await client.submit(tmp_path, benchmark="tiny-arith")


async def test_an_unconnected_client_says_how_to_connect_and_pickles_its_settings_only() -> None:
    client = Client(nats_url="nats://127.0.0.1:1", client_name="agent-7")
    with pytest.raises(RuntimeError, match="async with Client"):
        await client.status("some-id")
    copy = pickle.loads(pickle.dumps(client))
    assert copy.settings.client_name == "agent-7" and copy.settings.nats_url == "nats://127.0.0.1:1"
    with pytest.raises(TypeError, match="unknown ftbus settings: nats_ulr"):
        Client(nats_ulr="nats://x")
