"""Validation of paths that come from outside: workspace files, artifact names, stage outputs.

A candidate's workspace is untrusted input. Its file paths travel inside events as plain strings
(see ``WorkspaceFile``) and are turned into files on a worker's disk, so every one of them must be
proven to stay inside the folder it is written to: no ``..``, no absolute or Windows-style paths,
no control characters that could forge log lines, and no symlinked directory on the way out.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path, PurePosixPath

# `C:`, `c:foo`: a drive-relative or drive-absolute Windows path. Harmless on POSIX, but a workspace
# path that means something else on another OS is a sign of a confused or hostile client.
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


# Generous for any real workspace; far below what breaks object names, subjects and PATH_MAX.
MAX_PATH_BYTES = 1024
MAX_PATH_DEPTH = 64


class UnsafePath(ValueError):
    """A path that could escape its folder, or that cannot be represented safely."""


def _unsafe(path: object, problem: str, advice: str) -> UnsafePath:
    return UnsafePath(f"unsafe path {path!r}: {problem}. {advice}")


def validate_relative_path(path: str) -> PurePosixPath:
    """Check that ``path`` is a plain relative POSIX path and return it normalised.

    ``./a//b/`` becomes ``a/b``. Anything that could point outside the folder it is joined to,
    or that would be read differently on another OS, raises :class:`UnsafePath`.
    """
    advice = "Use a path relative to the workspace folder, with '/' separators, e.g. 'data/train.json'"
    if not isinstance(path, str):
        raise _unsafe(path, f"expected a string, got {type(path).__name__}", advice)
    if path == "":
        raise _unsafe(path, "it is empty", advice)
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        # os.fsdecode() of a name in another encoding: it cannot travel in an event or an object name.
        raise _unsafe(path, "it is not valid UTF-8 (a name in another encoding)", "Rename the file") from None
    if size > MAX_PATH_BYTES:
        raise _unsafe(path[:60] + "...", f"it is {size} bytes long, over {MAX_PATH_BYTES}", "Use a shorter path")
    for ch in path:
        # Cc covers NUL, the C0 controls, DEL and the C1 controls: newlines or escape sequences
        # in a file name can forge log lines and confuse every tool that prints it.
        if unicodedata.category(ch) == "Cc":
            raise _unsafe(path, f"it contains the control character {ch!r}", "Rename the file")
    if "\\" in path:
        raise _unsafe(
            path,
            "it contains a backslash, which is a separator on Windows and part of a name on POSIX",
            advice,
        )
    if path.startswith("/"):
        raise _unsafe(path, "it is absolute", advice)
    if _DRIVE_RE.match(path):
        raise _unsafe(path, "it starts with a Windows drive letter", advice)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _unsafe(path, "it has a '..' component, which could leave the workspace", advice)
    if not parts:
        raise _unsafe(path, "it names the folder itself, not a file in it", advice)
    if len(parts) > MAX_PATH_DEPTH:
        raise _unsafe(path[:60] + "...", f"it is {len(parts)} folders deep, over {MAX_PATH_DEPTH}",
                      "Flatten the workspace")
    return PurePosixPath(*parts)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def safe_join(root: Path, rel: str) -> Path:
    """Join a validated relative path to ``root`` and prove that the result stays inside it.

    The check resolves symlinks on the way (existing parents and the final component, if it
    exists), so a symlinked directory inside ``root`` that points elsewhere is caught, and so is
    a final symlink that points out: the result is safe both to write (we replace, not follow)
    and to read. The returned path is ``root / rel`` as given, not the resolved path, so callers
    see the names they expect.
    """
    relative = validate_relative_path(rel)
    joined = Path(root) / relative
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(joined))
    if not _inside(real, real_root) or real == real_root:
        raise UnsafePath(
            f"unsafe path {rel!r}: inside {root} it resolves to {real}, outside the folder "
            f"(a symlink on the way points out). Replace the symlink with a regular file or folder"
        )
    return joined


def regular_file_in(root: Path, rel: str) -> Path:
    """``root/rel`` when it is a regular file inside ``root``, reached without any symlink.

    For files that sandboxed candidate code wrote: the worker reads them on the host, where a
    symlink could point at what the sandbox never saw (the hidden test split, the server's store).
    A FIFO or device would block or lie. Raises :class:`UnsafePath` or ``FileNotFoundError``.
    """
    relative = validate_relative_path(rel)
    path = Path(root)
    for part in relative.parts:
        path = path / part
        if path.is_symlink():
            raise UnsafePath(
                f"{rel!r} is (or passes through) a symlink, {path.name} -> {os.readlink(path)}; write a regular file"
            )
    if not path.exists():
        raise FileNotFoundError(f"{rel} was not written")
    if not path.is_file():
        raise UnsafePath(f"{rel!r} is not a regular file (a folder, FIFO or device); write a regular file")
    return path
