"""The disk quota watchdog (runners/quota.py) around a real LocalRunner run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runners.base import LocalRunner
from runners.quota import EXIT_QUOTA, QuotaWatchdog, measure, with_quota

MB = 2**20


def runner(max_bytes: int = 50 * MB, max_files: int = 1000) -> object:
    return with_quota(LocalRunner(["PATH"]), max_bytes=max_bytes, max_files=max_files, poll_s=0.1)


def test_measure_counts_allocated_bytes_and_entries_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 100_000)
    (tmp_path / "link").symlink_to("/usr")  # a link to a big tree counts as one entry
    os.mkfifo(tmp_path / "fifo")
    usage = measure(tmp_path)
    assert usage.files == 4 and usage.complete
    assert 100_000 <= usage.bytes < 200_000
    assert not measure(tmp_path, max_files=2).complete


async def test_a_run_writing_past_the_disk_quota_is_stopped_with_a_clear_error(tmp_path: Path) -> None:
    script = ("import time\nwith open('data.json', 'wb') as f:\n"
              "    for _ in range(100000):\n        f.write(b'x' * 2**20); f.flush(); time.sleep(0.002)\n")
    log = tmp_path / "run.log"
    work = tmp_path / "ws"
    work.mkdir()
    run = await runner(max_bytes=20 * MB).run([sys.executable, "-c", script], cwd=work, timeout_s=120, log_path=log)
    assert run.exit_code == EXIT_QUOTA and not run.timed_out
    assert "disk quota exceeded" in run.output_tail and "20.0 MiB" in run.output_tail
    assert "disk quota exceeded" in log.read_text()
    assert run.duration_s < 60


async def test_a_run_creating_too_many_files_is_stopped(tmp_path: Path) -> None:
    script = "import os, time\nfor i in range(10**6):\n    open(f'f{i}', 'w').close()\n    time.sleep(0.0005)\n"
    work = tmp_path / "ws"
    work.mkdir()
    run = await runner(max_files=500).run([sys.executable, "-c", script], cwd=work, timeout_s=120,
                                          log_path=tmp_path / "log")
    assert run.exit_code == EXIT_QUOTA and "file quota exceeded" in run.output_tail


async def test_a_run_within_quota_is_untouched(tmp_path: Path) -> None:
    work = tmp_path / "ws"
    work.mkdir()
    run = await runner().run([sys.executable, "-c", "open('small', 'w').write('hi'); raise SystemExit(3)"],
                             cwd=work, timeout_s=60, log_path=tmp_path / "log")
    assert run.exit_code == 3 and "quota" not in run.output_tail


async def test_a_burst_between_two_polls_is_caught_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * (3 * MB))
    async with QuotaWatchdog(tmp_path, max_bytes=MB, max_files=10, poll_s=3600) as quota:
        pass
    assert quota.exceeded is not None and "disk quota exceeded" in quota.exceeded


async def test_no_single_file_outgrows_the_quota_whatever_the_poll(tmp_path: Path) -> None:
    # An hour between polls: only the runner's cap on file sizes stands between this writer and
    # a multi-GB file. The write past the cap fails, and the run is reported over its quota.
    script = ("with open('data.json', 'wb') as f:\n"
              "    for _ in range(4096):\n        f.write(b'x' * 2**20)\n")
    work = tmp_path / "ws"
    work.mkdir()
    (work / "process_data.py").write_text(script)
    slow = with_quota(LocalRunner(["PATH"]), max_bytes=8 * MB, max_files=100, poll_s=3600)
    run = await slow.run([sys.executable, "process_data.py"], cwd=work, timeout_s=120, log_path=tmp_path / "log")
    assert run.exit_code == EXIT_QUOTA
    assert "disk quota exceeded" in run.output_tail
    assert (work / "data.json").stat().st_size <= 8 * MB
    assert measure(work).bytes < 9 * MB


async def test_the_watchdog_looks_closer_past_half_of_a_limit(tmp_path: Path) -> None:
    watchdog = QuotaWatchdog(tmp_path, max_bytes=4 * MB, max_files=1000, poll_s=2.0)
    watchdog.check()
    assert watchdog.next_poll_s() == 2.0
    (tmp_path / "half").write_bytes(b"x" * (3 * MB))
    watchdog.check()
    assert watchdog.next_poll_s() == 0.05
