"""The reference's pre-check, widened: problems that need no code run get their verdict at once."""

from __future__ import annotations

from pathlib import Path

from shared.events import RequestContext
from shared.paths import UnsafePath, validate_relative_path

REQUIRED_FILES = ("train.yaml", "process_data.py")


def precheck(context: RequestContext, assets_dir: Path, *, max_bytes: int, max_files: int) -> str | None:
    """Return what is wrong with the request, or None when the data stage may run."""
    for item in context.workspace:
        try:
            validate_relative_path(item.path)
        except UnsafePath as exc:
            return f"unsafe workspace path {item.path!r}: {exc}"
    # The client checks these limits at upload; a hand-made request must not get past them either.
    total = sum(item.ref.size for item in context.workspace)
    if total > max_bytes or len(context.workspace) > max_files:
        return (
            f"workspace too large: {len(context.workspace)} files, {total} bytes "
            f"(limits {max_files} files, {max_bytes} bytes): keep datasets in the assets, not the workspace"
        )
    present = {item.path for item in context.workspace}
    for required in REQUIRED_FILES:
        if required not in present:
            return f"{required} is missing from the workspace root: add it and resubmit"
    datasets_dir = assets_dir / "datasets"
    for name in context.task.involving_datasets:
        try:
            validate_relative_path(name)
        except UnsafePath as exc:
            return f"declared dataset {name!r} is not a plain name: {exc}"
        if not (datasets_dir / name).is_dir():
            known = sorted(p.name for p in datasets_dir.iterdir()) if datasets_dir.is_dir() else []
            return (
                f"declared dataset {name!r} is not under {datasets_dir}; "
                f"available: {', '.join(known) or 'none'}"
            )
    return None
