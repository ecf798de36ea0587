"""The JetStream context every ftbus connection uses: nats-py's, with a lighter publish.

Every hop of every request is a JetStream publish (a stage's result, the aggregator's record,
view, verdict and report: seven for a pre-check failure), and each waits for the server's ack.
nats-py's ``publish`` goes through ``Client.request``, which draws four bytes from the OS's
random source for a token the NUID already makes unique, waits with ``asyncio.wait_for`` (a
future, a callback and a timer of its own), and reads the ack through a dataclass's ``fields()``.
This one keeps nats-py's reply subscription and its reply routing (``_request_sub_callback``)
and does the rest in fewer steps: about 13 µs less CPU per publish, a sixth of it
(bench/precheck_burst.py, docs/design.md §9). A publish asking for an expected stream or a
message TTL takes nats-py's own path.

It reads three of nats-py's private attributes (``_resp_sub_prefix``, ``_resp_map``, ``_nuid``),
as its own ``request`` does; tests/integration/test_jetstream_publish.py runs it against a real
server, so a nats-py upgrade that moves them fails there, not in production.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api

#: The status header of a request that reached no responder (no stream listens on the subject).
_NO_RESPONDERS = "503"


class LeanJetStream(JetStreamContext):
    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - nats-py's signature, overridden
        stream: str | None = None,
        headers: dict[str, Any] | None = None,
        msg_ttl: float | None = None,
    ) -> api.PubAck:
        if stream is not None or msg_ttl is not None:
            return await super().publish(subject, payload, timeout, stream, headers, msg_ttl)
        nc: Client = self._nc
        if nc.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        if not nc._resp_sub_prefix:
            await nc._init_request_sub()
        token = nc._nuid.next().decode()  # unique on this connection: the reply routes by it
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        nc._resp_map[token] = answer
        try:
            await nc.publish(subject, payload, reply=nc._resp_sub_prefix.decode() + token, headers=headers)
            async with asyncio.timeout(self._timeout if timeout is None else timeout):
                msg = await answer
        except TimeoutError:
            raise nats.errors.TimeoutError from None
        finally:
            nc._resp_map.pop(token, None)
        if msg.headers and msg.headers.get(api.Header.STATUS) == _NO_RESPONDERS:
            raise nats.js.errors.NoStreamResponseError
        resp = json.loads(msg.data)
        if "error" in resp:
            raise nats.js.errors.APIError.from_error(resp["error"])
        if "stream" in resp and "seq" in resp:
            return api.PubAck(stream=resp["stream"], seq=resp["seq"], domain=resp.get("domain"),
                              duplicate=resp.get("duplicate"))
        return api.PubAck.from_response(resp)
