"""A stage's run limit (runners/limit.py): at most ``limit`` candidate programs run at once on a
worker, whatever the number of messages it handles; the others wait their turn and still run."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from runners.base import LocalRunner
from runners.limit import LimitedRunner

SPAN = (
    "import json, sys, time\n"
    "start = time.monotonic()\n"
    "time.sleep(0.4)\n"
    "open(sys.argv[1], 'w').write(json.dumps([start, time.monotonic()]))\n"
)


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


async def test_at_most_limit_runs_at_once_and_every_run_runs(tmp_path: Path) -> None:
    runner = LimitedRunner(LocalRunner([]), 2)
    script = tmp_path / "span.py"
    script.write_text(SPAN)

    async def one(i: int) -> int:
        result = await runner.run([sys.executable, str(script), str(tmp_path / f"span-{i}.json")], cwd=tmp_path,
                                  timeout_s=60, log_path=tmp_path / f"log-{i}.txt")
        return result.exit_code

    codes = await asyncio.gather(*(one(i) for i in range(5)))
    assert codes == [0] * 5
    spans = [tuple(json.loads((tmp_path / f"span-{i}.json").read_text())) for i in range(5)]
    assert _most_at_once(spans) <= 2  # type: ignore[arg-type]


def test_the_runner_passes_on_what_it_wraps() -> None:
    inner = LocalRunner([])
    assert LimitedRunner(inner, 3).name == inner.name


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LimitedRunner(LocalRunner([]), 0)
