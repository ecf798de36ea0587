"""A worker's peak memory while it moves a 1 GB artifact through the artifact store.

A fresh Python process (the worker) connects to a real nats-server (the embedded one), opens the
artifact store exactly as a stage does (shared/artifacts.py), and then, one step at a time:

- ``put_file`` of a 1 GB file (sparse: it takes no disk, reads as zeros);
- ``get_to_file`` of it into a new file (``materialise`` calls this for each workspace file).

Before each step the process's peak RSS is reset (``/proc/self/clear_refs``) and its RSS noted
(idle); after it, ``VmHWM`` is the step's peak. A sampling thread (psutil, every 5 ms) reads the
same figure a second way. The measure is the peak above idle; the target, under 100 MB: the store
streams in chunks, never holding the artifact. The Object Store (the default) and the filesystem
store (``FTBUS_ARTIFACT_STORE=filesystem``) are both measured. It needs about 2 GB free in the
temporary folder (the server's copy and the downloaded copy) and removes everything it wrote.

    .venv/bin/python bench/artifact_memory.py [--size-mb 1024] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_MB = 100.0
MB = 2**20


# ---------------------------------------------------------------------------- in the worker process


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class _Sampler:
    """Samples this process's RSS every few milliseconds in a thread; keeps the maximum."""

    def __init__(self, every_s: float = 0.005) -> None:
        import psutil

        self._proc = psutil.Process()
        self._every_s = every_s
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(self._every_s)

    def __enter__(self) -> _Sampler:
        self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


async def _measure(step: str, action: Callable[[], Awaitable[None]]) -> dict[str, float | str | bool]:
    import gc

    gc.collect()
    exact = _reset_peak()
    idle_kb = _status_kb("VmRSS")
    start = time.perf_counter()
    with _Sampler() as sampler:
        await action()
    elapsed = time.perf_counter() - start
    hwm_kb = _status_kb("VmHWM") if exact else 0
    peak = max(hwm_kb * 1024, sampler.peak)
    return {"step": step, "idle_mb": idle_kb * 1024 / MB, "peak_mb": peak / MB,
            "above_mb": (peak - idle_kb * 1024) / MB, "seconds": elapsed, "exact": exact}


async def _child(nats_url: str, store_kind: str, root: Path, size: int) -> list[dict[str, float | str | bool]]:
    import nats

    from shared.events import ArtifactRef
    from shared.fs_artifacts import FilesystemArtifacts
    from shared.object_artifacts import ObjectStoreArtifacts
    from shared.subjects import Subjects

    source, dest = root / "source.bin", root / "dest.bin"
    with source.open("wb") as fh:  # sparse: no disk, reads as zeros
        fh.truncate(size)
    nc = await nats.connect(nats_url)
    try:
        if store_kind == "object store":
            store = await ObjectStoreArtifacts.open(nc.jetstream(), Subjects().object_store)
        else:
            store = FilesystemArtifacts(root / "artifacts")
        refs: list[ArtifactRef] = []

        async def put() -> None:
            refs.append(await store.put_file("bench/one-gigabyte.bin", source))

        async def get() -> None:
            await store.get_to_file(refs[0], dest)

        rows = [await _measure("put_file", put)]
        source.unlink()
        rows.append(await _measure("get_to_file", get))
        if dest.stat().st_size != size:
            raise RuntimeError(f"downloaded {dest.stat().st_size} bytes, expected {size}")
        dest.unlink()
        await store.delete(refs[0].name)
        return rows
    finally:
        await nc.close()


# ---------------------------------------------------------------------------- the bench


def _run_child(nats_url: str, store_kind: str, root: Path, size: int) -> list[dict[str, float | str | bool]]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", store_kind, "--nats-url", nats_url, "--root", str(root),
         "--size-mb", str(size // MB)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the worker process failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def measure(size_mb: int) -> list[dict[str, float | str | bool]]:
    from ftbus.embedded import EmbeddedServer

    size = size_mb * MB
    tmp = Path(tempfile.mkdtemp(prefix="ftbus-bench-artifact-memory-"))
    try:
        free = shutil.disk_usage(tmp).free
        if free < 2 * size + 512 * MB:
            raise RuntimeError(f"{tmp} has {free // MB} MB free; this bench needs {2 * size_mb + 512} MB")
        rows: list[dict[str, float | str | bool]] = []
        with EmbeddedServer(tmp / "nats") as server:
            for kind in ("object store", "filesystem"):
                work = tmp / kind.replace(" ", "-")
                work.mkdir()
                for row in _run_child(server.url, kind, work, size):
                    rows.append({"store": kind, **row})
                shutil.rmtree(work, ignore_errors=True)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def json_rows(rows: list[dict[str, float | str | bool]], size_mb: int) -> list[dict[str, object]]:
    worst = max(rows, key=lambda r: float(r["above_mb"]))
    out: list[dict[str, object]] = [{
        "measure": f"worker peak memory moving {size_mb} MB (worst step)",
        "value": f"{float(worst['above_mb']):.1f} MB above idle ({worst['store']}, {worst['step']})",
        "target": f"< {TARGET_MB:g} MB above idle",
        "met": float(worst["above_mb"]) < TARGET_MB,
    }]
    for row in rows:
        out.append({
            "measure": f"worker peak memory, {row['store']} {row['step']} of {size_mb} MB",
            "value": (f"{float(row['above_mb']):.1f} MB above idle (idle {float(row['idle_mb']):.0f} MB, "
                      f"peak {float(row['peak_mb']):.0f} MB, {float(row['seconds']):.1f} s)"),
            "target": f"< {TARGET_MB:g} MB above idle",
            "met": float(row["above_mb"]) < TARGET_MB,
        })
    return out


def print_table(rows: list[dict[str, float | str | bool]], size_mb: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"A worker's peak memory while it moves a {size_mb} MB artifact (target: "
                        f"< {TARGET_MB:g} MB above idle)")
    for column in ("store", "step", "idle MB", "peak MB", "above idle MB", "seconds", "met"):
        table.add_column(column, justify="left" if column in ("store", "step") else "right")
    for row in rows:
        met = float(row["above_mb"]) < TARGET_MB
        table.add_row(str(row["store"]), str(row["step"]), f"{float(row['idle_mb']):.0f}",
                      f"{float(row['peak_mb']):.0f}", f"{float(row['above_mb']):.1f}", f"{float(row['seconds']):.1f}",
                      "[green]yes[/]" if met else "[red]no[/]")
    Console().print(table)
    if not all(bool(r["exact"]) for r in rows):
        Console(stderr=True).print("the kernel refused to reset VmHWM: peaks are the sampler's (every 5 ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="the artifact's size (default 1024: 1 GB)")
    parser.add_argument("--json", action="store_true", help="print only JSON rows for bench/table.py")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--nats-url", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        rows = asyncio.run(_child(args.nats_url, args.child, Path(args.root), args.size_mb * MB))
        print(json.dumps(rows))
        return 0
    print(f"moving a {args.size_mb} MB artifact through each store...", file=sys.stderr)
    try:
        rows = measure(args.size_mb)
    except RuntimeError as exc:
        print(f"artifact memory: not measured ({exc})", file=sys.stderr)
        if args.json:
            print(json.dumps([{"measure": f"worker peak memory moving {args.size_mb} MB",
                               "value": f"not measured: {exc}", "target": f"< {TARGET_MB:g} MB above idle",
                               "met": None}]))
        return 0 if args.json else 1
    if args.json:
        print(json.dumps(json_rows(rows, args.size_mb)))
    else:
        print_table(rows, args.size_mb)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
