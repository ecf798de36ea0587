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


def known_assets(root: Path) -> Path:
    """An assets folder that knows model "m" and benchmark "b" (the task of ``ctx``)."""
    (root / "models" / "m").mkdir(parents=True, exist_ok=True)
    (root / "benchmarks" / "b").mkdir(parents=True, exist_ok=True)
    (root / "benchmarks" / "b" / "benchmark.yaml").write_text("name: b\n")
    return root


def test_a_complete_workspace_passes(tmp_path: Path) -> None:
    known_assets(tmp_path)
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
    known_assets(tmp_path)
    (tmp_path / "datasets" / "tiny-qa").mkdir(parents=True)
    problem = precheck(ctx("train.yaml", "process_data.py", datasets=["nope"]), tmp_path, **LIMITS)
    assert problem is not None and "nope" in problem and "tiny-qa" in problem
    assert precheck(ctx("train.yaml", "process_data.py", datasets=["tiny-qa"]), tmp_path, **LIMITS) is None


def test_an_unknown_benchmark_or_model_is_refused_before_any_run_with_the_known_names(tmp_path: Path) -> None:
    known_assets(tmp_path)
    files = ("train.yaml", "process_data.py")
    typo = ctx(*files)
    typo.task.benchmark = "tiny-arithh"
    problem = precheck(typo, tmp_path, **LIMITS)
    assert problem is not None and "unknown benchmark 'tiny-arithh'" in problem and "available benchmarks: b" in problem
    typo = ctx(*files)
    typo.task.base_model = "nope"
    problem = precheck(typo, tmp_path, **LIMITS)
    assert problem is not None and "unknown base model 'nope'" in problem and "available models: m" in problem
    for bad in ("../m", ".", "a/b"):
        typo = ctx(*files)
        typo.task.base_model = bad
        problem = precheck(typo, tmp_path, **LIMITS)
        assert problem is not None and "not a plain name" in problem, bad
    # A model given as an absolute path is the trainer's to find (GPU hosts may hold it alone).
    absolute = ctx(*files)
    absolute.task.base_model = "/models/elsewhere"
    assert precheck(absolute, tmp_path, **LIMITS) is None
