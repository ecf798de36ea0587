"""Fixtures shared by integration and e2e tests: one real nats-server per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats")
    server = EmbeddedServer(store, log_file=store / "server.log")
    server.start()
    yield server
    server.stop()
