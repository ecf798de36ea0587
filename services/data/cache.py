"""Cache key of the data stage: same key, same ``data.json``, so a cached one may be reused.

What goes in, and why:
- ``process_data.py`` (name + content): it makes the data.
- ``dataset_info.json`` (name + content, or an "absent" marker distinct from an empty file): it
  tells LlamaFactory how to read data.json, and scripts often read it too.
- The workspace's other Python files (``*.py`` below the workspace, name + content): the script
  runs with ``PYTHONPATH=./`` and may import them, so a changed helper module must miss the cache.
  The reference hashed process_data.py alone and would serve stale data then.
- Each declared dataset folder's content: its name, then every file's relative path and sha256
  (sorted, streamed in chunks), so a changed raw dataset misses the cache. The reference ignored
  the datasets; its key was the script text only.
- A format version tag, bumped whenever this recipe changes, so old keys never alias new ones.

What stays out:
- ``train.yaml``: it does not change the data (as in the reference, editing it keeps the data).
- Environment variables and API keys: they do not change *which* data the script is meant to
  produce, and keeping secrets out of a key that is logged and stored is safer. This is the
  reference's behaviour; an LLM-generating script is non-deterministic anyway, and reusing its
  first successful output is what the cache is for.
- Absolute locations (workspace or assets paths): keys must match across workers whose assets
  directories differ.

Every item is framed with its kind and length before hashing, so no two different inputs can
produce the same byte stream.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

CACHE_FORMAT_VERSION = "ftbus-data-cache-v1"
DATA_SCRIPT = "process_data.py"
DATASET_INFO = "dataset_info.json"

_CHUNK = 1 << 20
# Folders of a workspace that hold run outputs or tool state, never inputs of process_data.py.
_SKIPPED_WORKSPACE_DIRS = frozenset({"output", "__pycache__", "benchmark_results", "merged_model", "logs"})

# Files of big datasets are re-hashed only when they change: (path, size, mtime_ns, ctime_ns, inode)
# identifies a file version well enough for a process that lives as long as a worker. Only big
# files that have not been touched for a while are memoised: file times have a granularity of a
# few milliseconds, so a file rewritten twice within it would keep its stat identity (git's
# "racy clean" problem); small files cost nothing to hash again.
_digest_memo: dict[tuple[str, int, int, int, int], str] = {}
_MEMO_MAX = 100_000
_MEMO_MIN_BYTES = 1 << 20
_MEMO_MIN_AGE_S = 5.0


def _frame(h: hashlib._Hash, kind: str, payload: bytes) -> None:
    h.update(f"{kind}:{len(payload)}:".encode())
    h.update(payload)


def file_sha256(path: Path) -> str:
    """sha256 of a file, streamed, memoised by its stat identity."""
    st = path.stat()
    memo_key = (str(path.absolute()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    cached = _digest_memo.get(memo_key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    if st.st_size >= _MEMO_MIN_BYTES and time.time() - st.st_mtime > _MEMO_MIN_AGE_S:
        if len(_digest_memo) >= _MEMO_MAX:
            _digest_memo.clear()
        _digest_memo[memo_key] = digest
    return digest


def _walk_files(root: Path, skip_dirs: frozenset[str] = frozenset()) -> Iterator[Path]:
    """Regular files below ``root`` (links followed, each real folder visited once), any order."""
    seen_dirs: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen_dirs:  # a link cycle, or two links to one folder
            dirnames[:] = []
            continue
        seen_dirs.add(real)
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file():
                yield path


def _hash_optional_file(h: hashlib._Hash, kind: str, path: Path) -> None:
    if path.is_file():
        _frame(h, kind, path.name.encode())
        _frame(h, f"{kind}-sha256", file_sha256(path).encode())
    else:
        _frame(h, f"{kind}-absent", path.name.encode())


def data_cache_key(workspace_dir: Path, dataset_dirs: Sequence[Path]) -> str:
    """sha256 hex of everything that determines data.json (see the module docstring)."""
    h = hashlib.sha256()
    _frame(h, "version", CACHE_FORMAT_VERSION.encode())
    _hash_optional_file(h, "script", workspace_dir / DATA_SCRIPT)
    _hash_optional_file(h, "dataset-info", workspace_dir / DATASET_INFO)

    modules = sorted(
        p.relative_to(workspace_dir).as_posix()
        for p in _walk_files(workspace_dir, _SKIPPED_WORKSPACE_DIRS)
        if p.suffix == ".py"
    )
    for rel in modules:
        if rel == DATA_SCRIPT:
            continue
        _frame(h, "module", rel.encode())
        _frame(h, "module-sha256", file_sha256(workspace_dir / rel).encode())

    # The set of datasets matters, not the order they were declared in.
    for folder in sorted({Path(d) for d in dataset_dirs}, key=lambda p: (p.name, str(p))):
        _frame(h, "dataset", folder.name.encode())
        if folder.is_file():  # a dataset that is a single file
            _frame(h, "dataset-single-file-sha256", file_sha256(folder).encode())
            continue
        if not folder.is_dir():
            _frame(h, "dataset-absent", folder.name.encode())
            continue
        files = sorted(p.relative_to(folder).as_posix() for p in _walk_files(folder))
        for rel in files:
            _frame(h, "dataset-file", rel.encode())
            _frame(h, "dataset-file-sha256", file_sha256(folder / rel).encode())
    return h.hexdigest()
