"""The reference's pre-check, widened: problems that need no code run get their verdict at once."""

from __future__ import annotations

from pathlib import Path

from shared.events import RequestContext
from shared.paths import UnsafePath, validate_relative_path
from shared.taskcheck import task_problem

REQUIRED_FILES = ("train.yaml", "process_data.py")


def precheck(
    context: RequestContext, assets_dir: Path, *, max_bytes: int, max_files: int, max_config_bytes: int = 256 * 1024
) -> str | None:
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
    # train.yaml travels inside the training result (and the verdict's evidence): a huge one would
    # make an event too large for the bus after hours of training. Refused now, with its size.
    config = context.file("train.yaml")
    if config is not None and config.ref.size > max_config_bytes:
        return (f"train.yaml is {config.ref.size} bytes, over the limit of {max_config_bytes} bytes "
                "(max_train_yaml_bytes): a LlamaFactory config is a few hundred bytes")
    for required in REQUIRED_FILES:
        if required not in present:
            return f"{required} is missing from the workspace root: add it and resubmit"
    # An unknown model, benchmark or dataset: refused now, not after hours of training.
    return task_problem(context.task, assets_dir)
