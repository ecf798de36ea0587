"""The LLM gateway's rules, over its real Unix socket, with a local OpenAI-compatible upstream."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from services.data import gateway as gateway_module
from services.data.gateway import Budget, LlmGateway
from tests.fakes.openai_server import FakeOpenAIServer, answer

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


async def _post(socket: Path, path: str, token: str | None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as session:
        async with session.post(f"http://gateway{path}", json=body or CHAT, headers=headers) as response:
            return response.status, await response.json()


async def test_token_paths_and_budgets() -> None:
    with FakeOpenAIServer(default=answer("ok")) as fake, tempfile.TemporaryDirectory(prefix="gw-") as folder:
        socket = Path(folder) / "llm.sock"
        budget = Budget(max_requests=10, max_tokens=5, wall_s=60)
        async with LlmGateway(socket, upstream=fake.base_url, api_key="sk-real", budget=budget) as gateway:
            status, body = await _post(socket, "/v1/chat/completions", None)
            assert status == 401 and "invalid API key" in body["error"]["message"]
            status, body = await _post(socket, "/v1/chat/completions", "sk-real")  # the real key is not a token
            assert status == 401
            status, body = await _post(socket, "/admin", gateway.token)
            assert status == 404
            assert fake.requests == []  # nothing refused reached the upstream
            for _ in range(3):  # 2 tokens each (the fake's usage): 6 > 5 after the third
                status, body = await _post(socket, "/v1/chat/completions", gateway.token)
                assert status == 200 and body["choices"][0]["message"]["content"] == "ok"
            status, body = await _post(socket, "/v1/chat/completions", gateway.token)
            assert status == 429 and "token budget" in body["error"]["message"]
            usage = gateway.usage()
        assert usage.requests == 3 and usage.refused == 1
        assert usage.prompt_tokens + usage.completion_tokens == 6
        assert all(r.headers["authorization"] == "Bearer sk-real" for r in fake.requests)
        assert not socket.exists()  # removed when the run ends


async def test_wall_time_and_call_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    # The gateway's clock is the test's: the time budget runs out when the test moves it on, never
    # because a loaded machine was slow (the event loop keeps its own, real clock).
    clock = [1000.0]
    monkeypatch.setattr(gateway_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    with FakeOpenAIServer(default=answer("ok")) as fake, tempfile.TemporaryDirectory(prefix="gw-") as folder:
        socket = Path(folder) / "llm.sock"
        async with LlmGateway(socket, upstream=fake.base_url, api_key="k",
                              budget=Budget(max_requests=1, max_tokens=1000, wall_s=60)) as gateway:
            assert (await _post(socket, "/v1/chat/completions", gateway.token))[0] == 200
            status, body = await _post(socket, "/v1/chat/completions", gateway.token)
            assert status == 429 and "call budget" in body["error"]["message"]
        async with LlmGateway(socket, upstream=fake.base_url, api_key="k",
                              budget=Budget(max_requests=10, max_tokens=1000, wall_s=0.2)) as gateway:
            clock[0] = 1000.0 + 0.1  # within the budget: answered
            assert (await _post(socket, "/v1/chat/completions", gateway.token))[0] == 200
            clock[0] = 1000.0 + 0.2  # the budget's end (its start plus wall_s): spent
            status, body = await _post(socket, "/v1/chat/completions", gateway.token)
            assert status == 429 and "time budget" in body["error"]["message"]


async def test_an_unreachable_upstream_is_a_clear_502() -> None:
    with tempfile.TemporaryDirectory(prefix="gw-") as folder:
        socket = Path(folder) / "llm.sock"
        async with LlmGateway(socket, upstream="http://127.0.0.1:9/v1", api_key="k",
                              budget=Budget(10, 1000, 60)) as gateway:
            status, body = await _post(socket, "/v1/chat/completions", gateway.token)
        assert status == 502 and "could not be reached" in body["error"]["message"]
        assert gateway.usage().calls[0].status == 502
