"""A split's journal from the worker's side: kept in an artifact store while the engine writes it,
so that a worker lost in the middle of a benchmark costs the batches it had not finished, not the
run (docs/benchmarks.md, "Resuming an interrupted run"; the engine's side: engine/journal.py).

The engine appends a line per finished model request to the split's journal file. While the split
runs, the worker ships the complete lines it has not shipped yet to the store, each shipment one
object: ``<prefix>/<n>.jsonl``, n = 0, 1, 2, ... . A redelivered message's worker restores the
journal (the shipments in order, until the first missing one) into the new run folder before the
engine reads it. A shipment is written whole or not at all, and holds whole lines only, so a
restored journal never holds half an answer. The stage deletes the shipments when it has finished
the request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from evaluation.inference import InferenceConfig
from evaluation.splits import SplitManifest
from shared.artifacts import ArtifactStore

#: Raise it when the journal's lines change meaning: older journals are then not read.
JOURNAL_FORMAT = "ftbus-journal-v1"


def journal_prefix(request_id: str, label: str, manifest: SplitManifest, device: str, seed: int,
                   inference: InferenceConfig | None, backend: str = "lm-eval") -> str:
    """Where a request's split keeps its journal. The name holds what the answers depend on besides
    the prompts (the device, the seed, the sampling settings, the items): an attempt on a worker
    with another device never takes an answer from one that ran elsewhere."""
    parts = [JOURNAL_FORMAT, label, manifest.model_dump(mode="json"), device, seed, backend,
             (inference or InferenceConfig(greedy=True)).model_dump(mode="json")]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return f"resume/{request_id}/{label}-{digest}"


class SplitJournal:
    """One split's journal in ``store`` under ``prefix`` (see the module docstring)."""

    def __init__(self, store: ArtifactStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        #: Shipments in the store (restored or written by this worker).
        self.shipments = 0
        #: Bytes of the local journal file that are in the store.
        self.shipped = 0

    def _name(self, n: int) -> str:
        return f"{self.prefix}/{n:06d}.jsonl"

    async def restore(self, dest: Path) -> int:
        """Write what earlier attempts shipped into ``dest`` (the engine's journal file); return the
        number of recorded answers."""
        parts: list[bytes] = []
        while (ref := await self.store.stat(self._name(len(parts)))) is not None:
            parts.append(await self.store.get_bytes(ref))
        data = b"".join(parts)
        await asyncio.to_thread(_write, dest, data)
        self.shipments, self.shipped = len(parts), len(data)
        return data.count(b"\n")

    async def ship(self, path: Path) -> int:
        """Put the complete lines of ``path`` not shipped yet in the store, as the next shipment;
        return how many lines that was (0: nothing new)."""
        fresh = await asyncio.to_thread(_complete_lines_after, path, self.shipped)
        if not fresh:
            return 0
        await self.store.put_bytes(self._name(self.shipments), fresh)
        self.shipments += 1
        self.shipped += len(fresh)
        return fresh.count(b"\n")

    async def clear(self) -> None:
        """Delete every shipment (the request's benchmark is over), the last first: a clear cut
        short leaves shipments 0..k, which a later attempt still reads as one journal."""
        n = 0
        while await self.store.stat(self._name(n)) is not None:
            n += 1
        for i in reversed(range(n)):
            await self.store.delete(self._name(i))
        self.shipments = self.shipped = 0


def _write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)


def _complete_lines_after(path: Path, offset: int) -> bytes:
    """The bytes of ``path`` after ``offset`` up to its last newline (a line still being written
    waits for the next shipment)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return b""
    return data[: data.rfind(b"\n") + 1]
