"""Live training progress from LlamaFactory's ``output/trainer_log.jsonl``.

LlamaFactory's LogCallback appends one JSON object per logging step (``current_steps``,
``total_steps``, ``loss`` or ``eval_loss``, ``epoch``, ``lr``, ``percentage``, ``elapsed_time``,
``remaining_time`` ...). Following that file needs no hook into the training process, which runs
in another environment or container. The file may not exist yet (model loading), its last line
may be half written, and LlamaFactory deletes it when a run starts over an old output folder: all
three are normal here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

# str(datetime.timedelta): "H:MM:SS", "1 day, H:MM:SS", "3 days, H:MM:SS", with optional fraction.
_DURATION = re.compile(r"^\s*(?:(?P<days>-?\d+) days?, )?(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2}(?:\.\d+)?)\s*$")


class TrainProgress(BaseModel):
    """One logging step of a running training."""

    model_config = ConfigDict(extra="forbid")

    step: int
    total: int | None = None
    loss: float | None = None
    eta_s: float | None = None
    percentage: float | None = None
    eval_loss: float | None = None
    epoch: float | None = None
    elapsed_s: float | None = None


def parse_duration(text: Any) -> float | None:
    """Seconds of an ``H:MM:SS`` string as LlamaFactory writes it (``str(timedelta)``); None if not one."""
    if not isinstance(text, str):
        return None
    match = _DURATION.match(text)
    if match is None:
        return None
    days = int(match["days"] or 0)
    return days * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def progress_from_line(entry: Any) -> TrainProgress | None:
    """A TrainProgress for one parsed log line, or None when it is not a step record."""
    if not isinstance(entry, dict):
        return None
    step = entry.get("current_steps")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    total = entry.get("total_steps")
    return TrainProgress(
        step=step,
        total=total if isinstance(total, int) and not isinstance(total, bool) else None,
        loss=_float(entry.get("loss")),
        eta_s=parse_duration(entry.get("remaining_time")),
        percentage=_float(entry.get("percentage")),
        eval_loss=_float(entry.get("eval_loss")),
        epoch=_float(entry.get("epoch")),
        elapsed_s=parse_duration(entry.get("elapsed_time")),
    )


class TrainerLogFollower:
    """Tails one trainer_log.jsonl. ``poll()`` returns what was appended since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._inode: int | None = None
        self._partial = b""

    def poll(self) -> list[TrainProgress]:
        """Read the complete lines appended since the last call (a half-written one waits)."""
        # The sandbox writes this file and the worker reads it on the host: a symlink on the way
        # could make it read a host file, and a FIFO would block. Only the regular file in place.
        workspace = self.path.parent.parent
        expected = Path(os.path.realpath(workspace)) / self.path.relative_to(workspace)
        if Path(os.path.realpath(self.path)) != expected:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (FileNotFoundError, OSError):
            return []
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return []
                if st.st_ino != self._inode or st.st_size < self._offset:
                    # First sight, or deleted and recreated (a new run): start from its beginning.
                    self._inode, self._offset, self._partial = st.st_ino, 0, b""
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        points: list[TrainProgress] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue  # not a record of LogCallback's: skip rather than stop following
            point = progress_from_line(entry)
            if point is not None:
                points.append(point)
        return points

    async def follow(self, stop: asyncio.Event, poll_s: float = 1.0) -> AsyncIterator[TrainProgress]:
        """Yield each new step until ``stop`` is set, then what the last lines added, and end."""
        while True:
            stopping = stop.is_set()
            # Off the event loop: the output folder may be on a slow or network filesystem.
            for point in await asyncio.to_thread(self.poll):
                yield point
            if stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=poll_s)
