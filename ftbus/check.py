"""What `ftbus check` and `ftbus submit` look at on this machine, before any server is involved.

A candidate workspace is refused here for what needs no code run and no worker: a folder that is
not there, one of the three files missing, a train.yaml that is not YAML or lacks what the trainer
needs, a dataset_info.json that is not JSON or does not declare the dataset train.yaml trains on,
and, where this machine has the assets folder, names of models, benchmarks and datasets that do
not exist. The services check all of this again (a hand-made request must not get past them);
here it costs no upload and no wait.

The rules are the services' own: shared/taskcheck.py (the names, as the data stage's pre-check),
shared/train_yaml.py (train.yaml read as LlamaFactory reads it, and the trainer's first checks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.events import TaskSpec
from shared.taskcheck import assets_visible, benchmark_problem, dataset_problem, model_problem
from shared.train_yaml import TrainYamlError, config_problems, dataset_names, load_yaml

#: The files a workspace holds at its root (docs/candidates.md).
REQUIRED_FILES = ("process_data.py", "train.yaml", "dataset_info.json")
DATASET_INFO = "dataset_info.json"
#: dataset_info.json keys that would download data or run a loading script (the trainer refuses them).
_REMOTE_DATASET_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


@dataclass
class CheckResult:
    """``problems``: each a sentence saying what to change (none: the workspace may be submitted).
    ``notes``: what could not be checked here, and why."""

    workspace: Path
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_workspace(workspace: Path, assets_dir: Path, task: TaskSpec | None = None, *,
                    max_train_yaml_bytes: int = 256 * 1024) -> CheckResult:
    """Check ``workspace`` (and ``task``'s names, where the assets are here) without a server."""
    names = None if task is None else (task.base_model, task.benchmark, task.involving_datasets)
    return check_names(_check_files(workspace, assets_dir, max_train_yaml_bytes), assets_dir, *(names or ()))


def check_names(result: CheckResult, assets_dir: Path, base_model: str | None = None, benchmark: str | None = None,
                datasets: Sequence[str] = ()) -> CheckResult:
    """Add to ``result`` the names (of those given) that the assets folder does not hold."""
    if base_model is None and benchmark is None and not datasets:
        return result
    if not assets_visible(assets_dir):
        result.notes.append(f"no assets folder at {assets_dir}: the names of the base model, benchmark and "
                            "datasets are checked by the server (set FTBUS_ASSETS_DIR to check them here)")
        return result
    found = [model_problem(base_model, assets_dir) if base_model is not None else None,
             benchmark_problem(benchmark, assets_dir) if benchmark is not None else None]
    found += [dataset_problem(name, assets_dir) for name in datasets]
    result.problems.extend(problem for problem in found if problem)
    return result


def _check_files(workspace: Path, assets_dir: Path, max_train_yaml_bytes: int) -> CheckResult:
    result = CheckResult(workspace)
    if not workspace.exists():
        result.problems.append(f"workspace {workspace} is not a folder: it does not exist")
        return result
    if not workspace.is_dir():
        result.problems.append(f"workspace {workspace} is not a folder")
        return result
    visible = assets_visible(assets_dir)
    config = _check_train_yaml(workspace, result, max_train_yaml_bytes)
    if not (workspace / "process_data.py").is_file():
        result.problems.append("process_data.py is missing from the workspace root: add the script that writes "
                               "data.json (docs/candidates.md)")
    _check_dataset_info(workspace, config, result)
    if isinstance(config, dict) and visible:
        model = config.get("model_name_or_path")
        if isinstance(model, str) and model.strip() and not Path(model.strip()).is_absolute():
            name = model.strip()
            if ".." in Path(name).parts or not (assets_dir / "models" / name).is_dir():
                from shared.modelpaths import available_models

                known = ", ".join(available_models(assets_dir)) or "none (run `ftbus assets init`)"
                result.problems.append(f"train.yaml's model_name_or_path {name!r} is not a folder under "
                                       f"{assets_dir / 'models'}; available models: {known}")
    return result


def _check_train_yaml(workspace: Path, result: CheckResult, max_bytes: int) -> Any:
    """The loaded train.yaml (None when it is missing or unreadable), its problems in ``result``."""
    path = workspace / "train.yaml"
    if not path.is_file():
        result.problems.append("train.yaml is missing from the workspace root: add the LlamaFactory training "
                               "config (docs/candidates.md)")
        return None
    size = path.stat().st_size
    if size > max_bytes:
        result.problems.append(f"train.yaml is {size} bytes, over the limit of {max_bytes} bytes "
                               "(max_train_yaml_bytes): a LlamaFactory config is a few hundred bytes")
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        result.problems.append("train.yaml is not UTF-8 text: save it as UTF-8")
        return None
    try:
        config = load_yaml(text, "train.yaml")
    except TrainYamlError as exc:
        result.problems.append(exc.message)
        return None
    result.problems.extend(config_problems(config))
    return config


def _check_dataset_info(workspace: Path, config: Any, result: CheckResult) -> None:
    dataset_dir = config.get("dataset_dir") if isinstance(config, dict) else None
    if isinstance(dataset_dir, str) and dataset_dir.strip() not in ("", "."):
        # An installed dataset folder, or one process_data.py fills: the trainer checks it.
        result.notes.append(f"train.yaml's dataset_dir is {dataset_dir.strip()!r}: its {DATASET_INFO} is checked "
                            "by the trainer")
        return
    path = workspace / DATASET_INFO
    if not path.is_file():
        result.problems.append(
            f"{DATASET_INFO} is missing from the workspace root: LlamaFactory finds data.json through it; add one "
            'such as {"processed_data": {"file_name": "data.json", "formatting": "alpaca"}} (docs/candidates.md)')
        return
    try:
        info = json.loads(path.read_bytes())
    except UnicodeDecodeError:
        result.problems.append(f"{DATASET_INFO} is not UTF-8 text: save it as UTF-8")
        return
    except json.JSONDecodeError as exc:
        result.problems.append(f"{DATASET_INFO} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                               f"{exc.colno}")
        return
    if not isinstance(info, dict):
        result.problems.append(f"{DATASET_INFO} must be a JSON object mapping dataset names to their descriptions; "
                               f"it is a {type(info).__name__}")
        return
    if not isinstance(config, dict):
        return
    for key in ("dataset", "eval_dataset"):
        for name in dataset_names(config.get(key)) or []:
            entry = info.get(name)
            if entry is None:
                declared = ", ".join(sorted(info)) or "none"
                result.problems.append(f"{key} {name!r} in train.yaml is not declared in {DATASET_INFO} "
                                       f"(declared: {declared}); use a declared name or add an entry for it")
            elif not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
                result.problems.append(f"{DATASET_INFO} entry {name!r} must be an object with a file_name "
                                       "(e.g. data.json)")
            else:
                remote = [k for k in _REMOTE_DATASET_KEYS if entry.get(k)]
                if remote:
                    result.problems.append(
                        f"{DATASET_INFO} entry {name!r} uses {', '.join(remote)}: datasets are not downloaded "
                        "during evaluation; write the data to a file in the workspace and give it as file_name")
