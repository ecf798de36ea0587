"""Every ftbus process runs on the configured event loop (shared/loop.py): uvloop by default, the
standard loop on request, and candidate processes start the same on both (their own session,
their limits set in the child)."""

from __future__ import annotations

import asyncio
import os
import resource

import pytest

from shared.loop import run
from shared.settings import Settings


async def _loop_module_and_child() -> tuple[str, str]:
    def in_child() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # as runners/base.py's children do

    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", "echo $$ $(ps -o sid= -p $$) $(ulimit -f)", start_new_session=True, preexec_fn=in_child,
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return type(asyncio.get_running_loop()).__module__, out.decode()


@pytest.mark.parametrize(("name", "module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_the_configured_loop_runs_and_starts_children_as_the_runner_needs(name: str, module: str) -> None:
    loop_module, child = run(_loop_module_and_child(), name)  # type: ignore[arg-type]
    assert loop_module.split(".")[0] == module
    pid, sid, blocks = child.split()
    assert pid == sid != str(os.getsid(0)), "the child leads a session of its own"
    assert blocks == "8", "the limit set in the child holds (4096 bytes: 8 blocks of 512)"


def test_uvloop_is_the_default_and_the_standard_loop_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FTBUS_EVENT_LOOP", raising=False)  # the default, whatever the caller's environment
    assert Settings().event_loop == "uvloop"
    monkeypatch.setenv("FTBUS_EVENT_LOOP", "asyncio")
    assert Settings().event_loop == "asyncio"


async def _loop_kind() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_run_runs_the_coroutine_on_the_chosen_loop(name: str) -> None:
    assert run(_loop_kind(), name).split(".")[0] == name  # type: ignore[arg-type]
