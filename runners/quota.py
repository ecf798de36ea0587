"""Disk quota of a run: a watchdog that measures a folder while candidate code runs in it.

A ``process_data.py`` that writes a multi-GB ``data.json``, a training that checkpoints without
end, a script that creates a hundred thousand files: each would fill the worker's disk, and with
it every other request's. The watchdog polls the run's folder (bytes allocated and entries, never
following symlinks) every ``poll_s`` seconds; over the quota it stops the run, through the
runner's ``cancel`` event, and the run ends with exit code :data:`EXIT_QUOTA` and a last log line
that says which limit it crossed. The stage turns that into the candidate's failure, as for any
other non-zero exit.

    runner = with_quota(ctx.runner, max_bytes=..., max_files=..., poll_s=...)
    run = await runner.run([...], cwd=workspace, ...)   # the same call, now under a quota

Between two polls a fast writer could overshoot; so no single file may outgrow the quota at all:
the runner caps every file the run writes at ``max_bytes`` (RLIMIT_FSIZE; a write past it fails
with "File too large"), and the last look after the run then finds the folder over its quota.

The walk itself is bounded: it stops counting once the file limit is passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_QUOTA = 125  # like docker's "the run could not go on" (not a code the candidate chose)


@dataclass(frozen=True)
class Usage:
    bytes: int
    files: int
    complete: bool = True  # False: the walk stopped early at the file limit


def measure(root: Path, max_files: int | None = None) -> Usage:
    """Bytes allocated on disk (st_blocks: sparse files count what they really take) and entries
    (files, folders, links, FIFOs) under ``root``, without following symlinks. Stops counting
    once ``max_files`` is passed."""
    total = 0
    count = 0
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    count += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed meanwhile
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    if max_files is not None and count > max_files:
                        return Usage(total, count, complete=False)
        except OSError:
            continue  # unreadable or removed meanwhile
    return Usage(total, count)


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"


class QuotaWatchdog:
    """Polls ``root`` while a run goes on; sets ``cancel`` and records why when over the quota.

    Use as an async context manager around the run: ``async with QuotaWatchdog(...) as quota:``;
    pass ``quota.cancel`` to the runner, then read ``quota.exceeded`` (None when within quota).
    """

    def __init__(self, root: Path, *, max_bytes: int, max_files: int, poll_s: float = 2.0,
                 cancel: asyncio.Event | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.poll_s = poll_s
        self.cancel = cancel or asyncio.Event()
        self.exceeded: str | None = None
        self.peak = Usage(0, 0)
        self.last = Usage(0, 0)
        self._task: asyncio.Task[None] | None = None

    def check(self) -> str | None:
        """Measure once; the reason the quota is exceeded, or None."""
        usage = self.last = measure(self.root, self.max_files)
        if usage.bytes > self.peak.bytes or usage.files > self.peak.files:
            self.peak = Usage(max(usage.bytes, self.peak.bytes), max(usage.files, self.peak.files))
        # Reaching the quota counts: that is where the runner's cap on file sizes stops a writer.
        if usage.bytes >= self.max_bytes:
            return (f"disk quota exceeded: the run's folder holds {_human(usage.bytes)}, at or over its quota of "
                    f"{_human(self.max_bytes)}; the run was stopped")
        if usage.files > self.max_files:
            return (f"file quota exceeded: the run's folder holds more than {self.max_files} files and folders; "
                    f"the run was stopped")
        return None

    async def _watch(self) -> None:
        while not self.cancel.is_set():
            reason = await asyncio.to_thread(self.check)
            if reason is not None:
                self.exceeded = reason
                self.cancel.set()
                return
            await asyncio.sleep(self.next_poll_s())

    def next_poll_s(self) -> float:
        """``poll_s``, or a twentieth of a second once past half of either limit: near the quota a
        fast writer overshoots it by what it writes between two looks. (No single file can pass
        the quota at all: the runner caps file sizes, ``max_file_bytes``.)"""
        if self.last.bytes * 2 > self.max_bytes or self.last.files * 2 > self.max_files:
            return min(self.poll_s, 0.05)
        return self.poll_s

    async def __aenter__(self) -> QuotaWatchdog:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.exceeded is None and exc[0] is None:
            # A last look: a run that filled the disk between two polls and then exited.
            self.exceeded = await asyncio.to_thread(self.check)


class QuotaRunner:
    """A runner whose every run is watched by a :class:`QuotaWatchdog` on its working folder."""

    def __init__(self, inner: Any, *, max_bytes: int, max_files: int, poll_s: float = 2.0) -> None:
        self.inner = inner
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.poll_s = poll_s

    def __getattr__(self, name: str) -> Any:  # name, child_env, ...: the inner runner's
        return getattr(self.inner, name)

    async def run(self, argv: Sequence[str], *, cwd: Path, log_path: Path, **kwargs: Any) -> Any:
        user_cancel: asyncio.Event | None = kwargs.pop("cancel", None)
        async with QuotaWatchdog(Path(cwd), max_bytes=self.max_bytes, max_files=self.max_files,
                                 poll_s=self.poll_s) as quota:
            relay = None
            if user_cancel is not None:  # a user's cancel still stops the run, as without a quota
                async def _relay() -> None:
                    await user_cancel.wait()
                    quota.cancel.set()

                relay = asyncio.create_task(_relay())
            try:
                result = await self.inner.run(argv, cwd=cwd, log_path=log_path, cancel=quota.cancel,
                                              max_file_bytes=self.max_bytes, **kwargs)
            finally:
                if relay is not None:
                    relay.cancel()
        if quota.exceeded is None:
            return result
        note = f"[ftbus] {quota.exceeded}"
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_append, Path(log_path), f"\n{note}\n")
        tail = f"{result.output_tail}\n{note}\n"
        return result.model_copy(update={"exit_code": EXIT_QUOTA, "cancelled": False, "timed_out": False,
                                         "output_tail": tail[-max(len(note) + 1, len(result.output_tail)):]})


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def with_quota(runner: Any, *, max_bytes: int, max_files: int, poll_s: float = 2.0) -> QuotaRunner:
    return QuotaRunner(runner, max_bytes=max_bytes, max_files=max_files, poll_s=poll_s)
