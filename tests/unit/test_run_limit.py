"""A stage's run limit (runners/limit.py): at most ``limit`` candidate programs run at once on a
worker, whatever the number of messages it handles; the others wait their turn and still run."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from runners.base import LocalRunner
from runners.limit import LimitedRunner

# Each run marks itself running in a shared folder, notes how many runs are marked, and unmarks itself
# before it exits: a run the limiter starts after another ended cannot see that one's mark. The
# sleep only gives runs a chance to overlap; nothing is timed.
SPAN = (
    "import os, sys, time\n"
    "running, me = sys.argv[1], sys.argv[2]\n"
    "mark = os.path.join(running, me)\n"
    "open(mark, 'w').close()\n"
    "seen = len(os.listdir(running))\n"
    "time.sleep(0.4)\n"
    "seen = max(seen, len(os.listdir(running)))\n"
    "os.remove(mark)\n"
    "open(sys.argv[3], 'w').write(str(seen))\n"
)


async def test_at_most_limit_runs_at_once_and_every_run_runs(tmp_path: Path) -> None:
    runner = LimitedRunner(LocalRunner([]), 2)
    script = tmp_path / "span.py"
    script.write_text(SPAN)
    running = tmp_path / "running"
    running.mkdir()

    async def one(i: int) -> int:
        result = await runner.run([sys.executable, str(script), str(running), str(i), str(tmp_path / f"seen-{i}")],
                                  cwd=tmp_path, timeout_s=600, log_path=tmp_path / f"log-{i}.txt")  # hang guard
        return result.exit_code

    codes = await asyncio.gather(*(one(i) for i in range(5)))
    assert codes == [0] * 5
    seen = [int((tmp_path / f"seen-{i}").read_text()) for i in range(5)]
    assert max(seen) <= 2, seen
    assert list(running.iterdir()) == []


def test_the_runner_passes_on_what_it_wraps() -> None:
    inner = LocalRunner([])
    assert LimitedRunner(inner, 3).name == inner.name


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LimitedRunner(LocalRunner([]), 0)
