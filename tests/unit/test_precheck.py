"""The data stage's pre-check: what needs no code run gets its verdict at once."""

from __future__ import annotations

from pathlib import Path

from services.data.precheck import precheck
from shared.events import ArtifactRef, RequestContext, TaskSpec, WorkspaceFile

SHA = "0" * 64
LIMITS = {"max_bytes": 1000, "max_files": 10}


def ctx(*paths: str, size: int = 10, datasets: list[str] | None = None) -> RequestContext:
    files = [WorkspaceFile(path=p, ref=ArtifactRef(name=f"r/workspace/{p}", size=size, sha256=SHA)) for p in paths]
    return RequestContext(task=TaskSpec(base_model="m", benchmark="b", involving_datasets=datasets or []),
                          workspace=files)


def test_a_complete_workspace_passes(tmp_path: Path) -> None:
    assert precheck(ctx("train.yaml", "process_data.py", "dataset_info.json"), tmp_path, **LIMITS) is None


def test_missing_train_yaml(tmp_path: Path) -> None:
    problem = precheck(ctx("process_data.py"), tmp_path, **LIMITS)
    assert problem is not None and "train.yaml is missing" in problem


def test_a_path_escaping_the_workspace(tmp_path: Path) -> None:
    problem = precheck(ctx("train.yaml", "process_data.py", "../etc/passwd"), tmp_path, **LIMITS)
    assert problem is not None and "../etc/passwd" in problem


def test_a_hand_made_request_over_the_size_limit(tmp_path: Path) -> None:
    problem = precheck(ctx("train.yaml", "process_data.py", size=600), tmp_path, **LIMITS)
    assert problem is not None and "too large" in problem and "1000" in problem


def test_an_unknown_dataset_lists_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "datasets" / "tiny-qa").mkdir(parents=True)
    problem = precheck(ctx("train.yaml", "process_data.py", datasets=["nope"]), tmp_path, **LIMITS)
    assert problem is not None and "nope" in problem and "tiny-qa" in problem
    assert precheck(ctx("train.yaml", "process_data.py", datasets=["tiny-qa"]), tmp_path, **LIMITS) is None
