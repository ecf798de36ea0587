"""A real, local OpenAI-compatible HTTP server for tests: scripted answers, recorded requests.

It serves ``POST /v1/chat/completions`` from the stdlib's ThreadingHTTPServer on a free loopback
port, so the real ``openai`` client (and its HTTP stack) is what the tests exercise. Each request
takes the next scripted reply; when the script runs out, ``respond`` (a function of the request,
when given) answers, else the ``default`` reply is used.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted reply. ``content`` builds a chat completion; ``body`` is sent verbatim."""

    status: int = 200
    content: str | None = None
    body: Any = None
    delay_s: float = 0.0  # math.inf: never answers (the server's stop ends the wait)
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str = "stop"


def answer(content: str | dict[str, Any], **kwargs: Any) -> Reply:
    """A 200 reply whose message content is ``content`` (a dict is JSON-encoded)."""
    text = content if isinstance(content, str) else json.dumps(content)
    return Reply(content=text, **kwargs)


def error(status: int, message: str = "scripted failure", **kwargs: Any) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "server_error"}}, **kwargs)


def completion_body(content: str, model: str, finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def user_prompt(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "user")

    @property
    def system_prompt(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "system")


class FakeOpenAIServer:
    def __init__(self, default: Reply | None = None, respond: Callable[[Received], Reply] | None = None) -> None:
        self.default = default or error(500, "script exhausted")
        #: Answers each request the script does not (a model that reads its prompt), else ``default``.
        self.respond = respond
        self.requests: list[Received] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown() quick between tests.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )

    # ------------------------------------------------------------ control

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script = list(replies)
            self.requests.clear()

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes replies that are sleeping out a scripted delay
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ serving

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            if self._script:
                return self._script.pop(0)
        return self.respond(received) if self.respond is not None else self.default

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "request body is not JSON"}})
                    return
                reply = server._next(
                    Received(
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                        at=time.monotonic(),
                    )
                )
                # delay_s=math.inf: a reply that never comes (until the server stops), for a test
                # of a timeout that must not hinge on a delay "long enough".
                if reply.delay_s and server._stopping.wait(None if math.isinf(reply.delay_s) else reply.delay_s):
                    return
                if reply.content is not None:
                    payload: Any = completion_body(reply.content, body.get("model", "fake"), reply.finish_reason)
                else:
                    payload = reply.body
                self._send(reply.status, payload, reply.headers)

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to tell it

        return Handler
