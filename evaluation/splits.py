"""Validation, hidden-test and confirmation-pool splits, materialised as manifests (no implicit ranges).

As the reference's ``get_benchmark_ranges``: per subset of n items, validation is the first
k = min(max_items, n // 2) items and test the last k, so the two never overlap and each holds at
most ``max_items``. Unlike it, the evaluated item ids are recorded in a ``SplitManifest`` whose
fingerprint (benchmark, version, split and the items' content) can key an evaluation cache.

The items between the two, which the reference never uses, are the benchmark's confirmation pool
(shared/decision.py): hidden as the test split is, drawn in batches in one fixed shuffled order
across subsets (:func:`pool_order`), so that the first m pool items are a random sample of it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from evaluation.registry import BenchmarkError, BenchmarkItem, BenchmarkSpec

Split = Literal["validation", "pool", "test"]
DEFAULT_MAX_ITEMS = 100


class SplitManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str
    version: int
    split: Split
    max_items: int = Field(gt=0)
    item_ids: dict[str, list[str]]
    sha256: str = Field(description="Hash of the selected items' content, per subset in order.")


def split_bounds(n: int, split: Split, max_items: int = DEFAULT_MAX_ITEMS) -> tuple[int, int]:
    """[start, stop) of ``split`` among n items."""
    if max_items <= 0:
        raise ValueError("max_items must be positive")
    k = min(max_items, n // 2)
    if split == "pool":
        return (k, n - k)
    return (0, k) if split == "validation" else (n - k, n)


#: Item fields added after the first manifests were made: left out of the hash while unset, so a
#: benchmark's manifests (and the caches keyed on them) stay what they were.
_LATER_FIELDS = ("test", "entry_point")


def _hashed(item: BenchmarkItem) -> dict[str, object]:
    return item.model_dump(mode="json", exclude={f for f in _LATER_FIELDS if getattr(item, f) is None})


def _items_hash(selected: dict[str, list[BenchmarkItem]]) -> str:
    h = hashlib.sha256()
    for subset, items in selected.items():
        h.update(json.dumps([subset, [_hashed(i) for i in items]], sort_keys=True).encode())
    return h.hexdigest()


def make_split(spec: BenchmarkSpec, split: Split, max_items: int = DEFAULT_MAX_ITEMS) -> SplitManifest:
    selected: dict[str, list[BenchmarkItem]] = {}
    for subset in spec.subsets:
        items = spec.items(subset.name)
        start, stop = split_bounds(len(items), split, max_items)
        selected[subset.name] = items[start:stop]
    return SplitManifest(
        benchmark=spec.name,
        version=spec.version,
        split=split,
        max_items=max_items,
        item_ids={s: [i.id for i in items] for s, items in selected.items()},
        sha256=_items_hash(selected),
    )


def split_items(spec: BenchmarkSpec, manifest: SplitManifest) -> dict[str, list[BenchmarkItem]]:
    """The manifest's items, subset by subset, in manifest order; fails if the benchmark changed."""
    if (manifest.benchmark, manifest.version) != (spec.name, spec.version):
        raise BenchmarkError(
            f"split manifest is for {manifest.benchmark} v{manifest.version}, not {spec.name} v{spec.version}"
        )
    out: dict[str, list[BenchmarkItem]] = {}
    for subset, ids in manifest.item_ids.items():
        by_id = {i.id: i for i in spec.items(subset)}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise BenchmarkError(f"benchmark {spec.name} subset {subset} lacks items {missing[:5]}")
        out[subset] = [by_id[i] for i in ids]
    if _items_hash(out) != manifest.sha256:
        raise BenchmarkError(f"benchmark {spec.name} v{spec.version}: items changed since the manifest was made")
    return out


def write_split_data(spec: BenchmarkSpec, manifest: SplitManifest, dest_dir: Path) -> dict[str, Path]:
    """Write ``<dest_dir>/<subset>.jsonl`` with the split's items (the only benchmark data a run
    sees) and ``manifest.json``; return subset -> data file."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for subset, items in split_items(spec, manifest).items():
        if not items:
            # lm-eval cannot load an empty json dataset: a subset with <2 items has no split.
            continue
        path = dest_dir / f"{subset}.jsonl"
        # A code item's tests stay out: only the code executor sees them, never the engine.
        path.write_text("".join(i.model_dump_json(exclude_none=True, exclude={"test"}) + "\n" for i in items),
                        encoding="utf-8")
        files[subset] = path.resolve()
    (dest_dir / "manifest.json").write_text(manifest.model_dump_json(indent=1), encoding="utf-8")
    return files


def pool_order(spec: BenchmarkSpec, max_items: int = DEFAULT_MAX_ITEMS) -> list[tuple[str, BenchmarkItem]]:
    """The confirmation pool's items, (subset, item), in the order confirmations draw them: every
    subset's pool items, shuffled together with a seed of their content (the same order on every
    worker, changed only when the items change)."""
    pooled: dict[str, list[BenchmarkItem]] = {}
    for subset in spec.subsets:
        items = spec.items(subset.name)
        start, stop = split_bounds(len(items), "pool", max_items)
        pooled[subset.name] = items[start:stop]
    order = [(subset, item) for subset, items in pooled.items() for item in items]
    random.Random(_items_hash(pooled)).shuffle(order)
    return order


def pool_batch(spec: BenchmarkSpec, start: int, stop: int, max_items: int = DEFAULT_MAX_ITEMS,
               order: list[tuple[str, BenchmarkItem]] | None = None) -> SplitManifest:
    """The manifest of pool positions [start, stop) of :func:`pool_order` (fewer at the pool's end),
    each subset's items in pool order: a run of it scores exactly those items."""
    order = pool_order(spec, max_items) if order is None else order
    selected: dict[str, list[BenchmarkItem]] = {}
    for subset, item in order[start:stop]:
        selected.setdefault(subset, []).append(item)
    return SplitManifest(
        benchmark=spec.name,
        version=spec.version,
        split="pool",
        max_items=max_items,
        item_ids={s: [i.id for i in items] for s, items in selected.items()},
        sha256=_items_hash(selected),
    )
