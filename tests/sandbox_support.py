"""The Docker engine and sandbox image for tests: found, or the test is skipped saying why.

`make test` starts the engine and builds the image first (deploy/sandbox/); a machine where no
engine can run skips these tests with the reason, never passes them silently.
"""

from __future__ import annotations

import functools

import pytest

from runners.docker import DockerRunner, engine_client
from runners.sandbox import SandboxUnavailable
from shared.settings import Settings


@functools.cache
def _unavailable(image: str) -> str | None:
    try:
        # Hang guard, not a limit: a busy engine that answers slowly is there, and must not skip the tests.
        runner = DockerRunner(image, stage="test", client=engine_client(timeout_s=60))
        runner.check()
    except SandboxUnavailable as exc:
        return str(exc)
    return None


def require_sandbox(image: str | None = None) -> str:
    """The sandbox image's name; skips the calling test when it cannot run here."""
    image = image or Settings().sandbox_image
    reason = _unavailable(image)
    if reason is not None:
        pytest.skip(f"no Docker sandbox here (run `make sandbox`): {reason}")
    return image
