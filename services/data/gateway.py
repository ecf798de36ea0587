"""The LLM gateway: ``process_data.py`` may call an OpenAI-compatible API without ever holding the key.

The data stage starts one gateway per run, listening on a Unix socket in the run's folder. The
sandbox mounts that socket and forwards 127.0.0.1:8080 inside the container to it (the container
has no other network), and the script gets ``OPENAI_BASE_URL=http://127.0.0.1:8080/v1`` and a
random per-run token as ``OPENAI_API_KEY``. The gateway:

- accepts only that token, and only the API's ``/v1/...`` paths;
- forwards each call to the configured upstream with the real key;
- enforces the run's budget (calls, tokens, wall time): past it, a call gets HTTP 429 with an
  OpenAI-style error that says which limit was reached;
- records every call (model, tokens, latency, status) for the data stage's result.

Streaming calls are forwarded as they arrive; the gateway asks the upstream to include usage in
the stream (``stream_options.include_usage``) so that their tokens count too.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from shared import metrics
from shared.events import LlmCall, LlmUsage
from shared.logs import get_logger

log = get_logger("ftbus.data.gateway")

_HOP_HEADERS = {"host", "authorization", "content-length", "transfer-encoding", "connection", "api-key"}
_MAX_BODY = 16 * 2**20


class Budget:
    def __init__(self, max_requests: int, max_tokens: int, wall_s: float) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.deadline = time.monotonic() + wall_s
        self.wall_s = wall_s


class LlmGateway:
    """One run's gateway. ``async with LlmGateway(...) as gw:`` then read ``gw.usage()``."""

    def __init__(self, socket_path: Path, *, upstream: str, api_key: str, budget: Budget) -> None:
        self.socket_path = Path(socket_path)
        self.upstream = upstream.rstrip("/")
        self._api_key = api_key
        self.token = "ftbus-" + secrets.token_urlsafe(24)
        self.budget = budget
        self.calls: list[LlmCall] = []
        self.refused = 0
        self._tokens = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LlmGateway:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        # The sandbox user must be able to connect; the token, not the file mode, is the lock.
        self.socket_path.chmod(0o666)
        self.socket_path.parent.chmod(0o755)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self.socket_path.unlink(missing_ok=True)

    def usage(self) -> LlmUsage:
        return LlmUsage(
            calls=list(self.calls),
            requests=len(self.calls),
            prompt_tokens=sum(c.prompt_tokens for c in self.calls),
            completion_tokens=sum(c.completion_tokens for c in self.calls),
            refused=self.refused,
            budget_requests=self.budget.max_requests,
            budget_tokens=self.budget.max_tokens,
            budget_wall_s=self.budget.wall_s,
        )

    # ------------------------------------------------------------------ one call

    def _refusal(self) -> str | None:
        if len(self.calls) >= self.budget.max_requests:
            return f"the LLM call budget of this run is spent ({self.budget.max_requests} calls)"
        if self._tokens >= self.budget.max_tokens:
            return f"the LLM token budget of this run is spent ({self.budget.max_tokens} tokens)"
        if time.monotonic() >= self.budget.deadline:
            return f"the LLM time budget of this run is spent ({self.budget.wall_s:g} s)"
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization", "") != f"Bearer {self.token}":
            return _error(401, "invalid API key for the ftbus LLM gateway", "invalid_api_key")
        tail = request.match_info["tail"]
        if not tail.startswith("v1/"):
            return _error(404, f"unknown path /{tail}: the gateway serves the OpenAI API under /v1", "not_found")
        refusal = self._refusal()
        if refusal is not None:
            self.refused += 1
            log.info("LLM call refused", reason=refusal)
            return _error(429, refusal, "budget_exceeded")
        body = await request.read()
        payload: Any = None
        if body:
            try:
                payload = json.loads(body)
            except ValueError:
                return _error(400, "the request body is not JSON", "invalid_request")
        model = payload.get("model", "") if isinstance(payload, dict) else ""
        streaming = isinstance(payload, dict) and bool(payload.get("stream"))
        if streaming:
            payload.setdefault("stream_options", {})["include_usage"] = True
            body = json.dumps(payload).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers["Authorization"] = f"Bearer {self._api_key}"
        url = f"{self.upstream}/{tail.removeprefix('v1/')}"
        if request.query_string:
            url += f"?{request.query_string}"
        started = time.monotonic()
        call = LlmCall(model=str(model), path=f"/{tail}", status=0)
        self.calls.append(call)  # counted at once: parallel calls cannot overrun the budget
        metrics.llm_call("data_gateway")
        assert self._session is not None
        try:
            async with self._session.request(request.method, url, data=body or None, headers=headers) as upstream:
                call.status = upstream.status
                if streaming and upstream.status == 200:
                    return await self._relay_stream(request, upstream, call, started)
                data = await upstream.read()
                self._count(call, _usage_of(data))
                call.latency_s = round(time.monotonic() - started, 3)
                return web.Response(body=data, status=upstream.status,
                                    content_type=upstream.content_type or "application/json")
        except (TimeoutError, aiohttp.ClientError) as exc:
            call.status = 502
            call.latency_s = round(time.monotonic() - started, 3)
            log.warning("LLM upstream unreachable", error=str(exc))
            return _error(502, f"the LLM upstream could not be reached: {type(exc).__name__}", "upstream_error")

    async def _relay_stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, call: LlmCall, started: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        buffer = b""
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b"data:") and b'"usage"' in line:
                    self._count(call, _usage_of(line[5:]))
        call.latency_s = round(time.monotonic() - started, 3)
        await response.write_eof()
        return response

    def _count(self, call: LlmCall, usage: tuple[int, int] | None) -> None:
        if usage is None:
            return
        call.prompt_tokens, call.completion_tokens = usage
        self._tokens += sum(usage)
        metrics.llm_tokens("data_gateway", *usage)


def _usage_of(data: bytes) -> tuple[int, int] | None:
    try:
        usage = json.loads(data).get("usage")
    except (ValueError, AttributeError):
        return None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (int(prompt) if isinstance(prompt, int) else 0, int(completion) if isinstance(completion, int) else 0)


def _error(status: int, message: str, code: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": code, "code": code}}, status=status)
