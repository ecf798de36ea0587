"""A TCP link between one client and the nats-server that a test can cut and heal.

Cut: its connections are dropped and new ones refused, so the client's heartbeats, acks and KV
writes stop reaching the server while the client itself goes on (what a partition does to a
worker); healed, the client reconnects by itself (nats-py's reconnect) and carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


class Link:
    def __init__(self, server_url: str) -> None:
        target = urlsplit(server_url)
        self.host, self.port = target.hostname or "127.0.0.1", target.port or 4222
        self.is_cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> str:
        """Listen; the URL a client connects to instead of the server's."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"nats://127.0.0.1:{port}"
        return self.url

    def cut(self) -> None:
        self.is_cut = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def heal(self) -> None:
        self.is_cut = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.is_cut:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, server_w}
        try:
            await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))
        finally:
            for writer in (client_w, server_w):
                self._writers.discard(writer)
                writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
