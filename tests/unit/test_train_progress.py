"""Following LlamaFactory's trainer_log.jsonl while training runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from services.trainer.progress import TrainerLogFollower, TrainProgress, parse_duration


def line(step: int, total: int = 100, **extra: Any) -> str:
    """One line as LlamaFactory's LogCallback writes it."""
    record: dict[str, Any] = {
        "current_steps": step,
        "total_steps": total,
        "loss": round(3.0 - step / 100, 4),
        "lr": 1e-4,
        "epoch": step / 50,
        "percentage": round(step / total * 100, 2),
        "elapsed_time": "0:00:10",
        "remaining_time": "0:01:30",
    }
    record.update(extra)
    return json.dumps(record) + "\n"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:00:09", 9.0),
        ("1:02:03", 3723.0),
        ("12:00:00", 43200.0),
        ("0:00:01.500000", 1.5),
        ("1 day, 2:00:00", 93600.0),
        ("3 days, 0:00:01", 259201.0),
        ("soon", None),
        ("", None),
        (90, None),
        (None, None),
    ],
)
def test_parse_duration(text: Any, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_poll_reads_new_lines_and_waits_for_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "output" / "trainer_log.jsonl"
    follower = TrainerLogFollower(path)
    assert follower.poll() == []  # not created yet: model still loading

    path.parent.mkdir()
    path.write_text(line(10) + line(20))
    points = follower.poll()
    assert [(p.step, p.total, p.loss, p.eta_s, p.percentage) for p in points] == [
        (10, 100, 2.9, 90.0, 10.0),
        (20, 100, 2.8, 90.0, 20.0),
    ]
    assert follower.poll() == []  # nothing new

    whole = line(30)
    with path.open("a") as f:
        f.write(whole[:25])  # the logger is mid-write
    assert follower.poll() == []
    with path.open("a") as f:
        f.write(whole[25:])
    assert [p.step for p in follower.poll()] == [30]


def test_eval_lines_and_junk(tmp_path: Path) -> None:
    path = tmp_path / "trainer_log.jsonl"
    eval_line = json.dumps({"current_steps": 50, "total_steps": 100, "eval_loss": 1.5, "epoch": 1.0}) + "\n"
    path.write_text("not json\n" + '{"no_steps": 1}\n' + eval_line + "\n")
    (point,) = TrainerLogFollower(path).poll()
    assert point == TrainProgress(step=50, total=100, eval_loss=1.5, epoch=1.0)


def test_recreated_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "trainer_log.jsonl"
    path.write_text(line(10) + line(20) + line(30))
    follower = TrainerLogFollower(path)
    assert len(follower.poll()) == 3
    path.unlink()  # LlamaFactory removes an old log when a run starts over output_dir
    path.write_text(line(5))
    assert [p.step for p in follower.poll()] == [5]


HANG_S = 60  # hang guard only: every wait below ends in milliseconds unless the follower is broken


class WatchedStop(asyncio.Event):
    """The follower's stop event, telling the test each time the follower waits on it between polls:
    the order of polls and writes is then the test's, not the clock's."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.waiting.set()
        return await super().wait()

    async def next_wait(self) -> None:
        """Until the follower waits again: it has polled (and yielded) since this was called."""
        self.waiting.clear()
        await asyncio.wait_for(self.waiting.wait(), HANG_S)  # hang guard


async def test_follow_yields_each_line_until_stopped(tmp_path: Path) -> None:
    path = tmp_path / "output" / "trainer_log.jsonl"
    stop = WatchedStop()
    seen: list[TrainProgress] = []

    async def consume() -> None:
        async for point in TrainerLogFollower(path).follow(stop, poll_s=0.01):
            seen.append(point)

    consumer = asyncio.create_task(consume())
    await stop.next_wait()  # it polled a file that does not exist yet
    assert seen == []
    path.parent.mkdir()
    for step in (1, 2, 3):
        with path.open("a") as f:
            f.write(line(step, total=4))
        await stop.next_wait()  # a poll after the write
        assert [p.step for p in seen] == list(range(1, step + 1))
    with path.open("a") as f:
        f.write(line(4, total=4, remaining_time="0:00:00"))  # written just before the run ends
    stop.set()
    await asyncio.wait_for(consumer, timeout=HANG_S)  # hang guard
    assert [p.step for p in seen] == [1, 2, 3, 4]
    assert seen[-1].eta_s == 0.0 and seen[-1].percentage == 100.0


async def test_follow_ends_promptly_when_stopped(tmp_path: Path) -> None:
    stop = WatchedStop()

    async def consume() -> list[TrainProgress]:
        # An hour between polls: a follower that waited out its poll would run into the hang guard.
        return [p async for p in TrainerLogFollower(tmp_path / "never.jsonl").follow(stop, poll_s=3600)]

    task = asyncio.create_task(consume())
    await stop.next_wait()  # it waits for its next poll
    stop.set()
    assert await asyncio.wait_for(task, timeout=HANG_S) == []  # hang guard, far below the poll's hour
