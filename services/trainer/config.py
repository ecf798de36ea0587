"""Checks and rewrites the candidate's ``train.yaml`` before ``llamafactory-cli train`` sees it.

A config LlamaFactory would reject after loading a model for a minute is rejected here at once,
with a message that says what to change. Then the system-managed parameters are set (the
reference's ``SYSTEM_MANAGED_PARAMS`` plus what a worker needs): outputs go to ``output/`` in the
workspace, old outputs and dataset caches are overwritten, only model weights are saved (no
optimizer state) unless resumable checkpoints are on (`_checkpointing`: then every save holds the
optimizer, scheduler and RNG state, and a resumed run names its checkpoint), evaluation uses
batch 1, nothing reports to an online tracker, and datasets are looked up in the workspace
(``dataset_dir: .``) unless the candidate chose a folder.

``model_name_or_path`` becomes the absolute model path: LlamaFactory writes it into
``adapter_config.json`` as ``base_model_name_or_path``, and the benchmark stage, on another
worker, loads the adapter's base model from there. The reference's ``/assets/...`` constants are
mapped onto this worker's assets directory.

YAML is read the way LlamaFactory reads it (OmegaConf's loader): ``1e-4`` is a float, dates stay
strings, a key given twice is an error. The rewritten text is dumped so that it loads back to the
same values there. Comments and formatting of the original are not kept; every value is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import ExplainedError
from shared.train_yaml import TrainYamlError, dump_yaml, load_yaml

#: Values the evaluator owns; a candidate's own value for these is replaced.
SYSTEM_MANAGED_PARAMS: dict[str, Any] = {
    "output_dir": "output",
    "overwrite_output_dir": True,
    "overwrite_cache": True,
    "save_only_model": True,
    "per_device_eval_batch_size": 1,
    "report_to": "none",
}
DEFAULT_DATASET_DIR = "."
DATASET_INFO = "dataset_info.json"
#: The asset root of the evaluator ftbus replaces, as it may appear in a candidate's config.
REFERENCE_ASSETS = PurePosixPath("/assets")
#: LlamaFactory's training stages (``FinetuningArguments.stage``).
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
_MAX_LISTED = 30


class TrainConfigError(ExplainedError):
    """train.yaml cannot be used; ``message`` says what to change."""


class PreparedTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    yaml_text: str
    model_path: Path
    #: Where LlamaFactory reads dataset_info.json and the data files: the workspace or an installed dataset.
    dataset_dir: Path
    finetuning_type: str
    datasets: list[str]
    #: System-managed keys whose value the candidate had set differently (they were replaced).
    overridden: list[str] = Field(default_factory=list)
    #: Steps between resumable checkpoints (the candidate's save_steps, else the setting); None: none.
    save_steps: int | None = None


# ---------------------------------------------------------------- YAML as LlamaFactory reads it


def _load_yaml(text: str, what: str) -> Any:
    """The config as LlamaFactory reads it (shared/train_yaml.py, also the judge's reader)."""
    try:
        return load_yaml(text, what)
    except TrainYamlError as exc:
        raise TrainConfigError(exc.message) from None


# ---------------------------------------------------------------- model


def available_models(models_dir: Path) -> list[str]:
    """Model folder names under ``models_dir``: ``name`` or ``org/name`` (one level of nesting)."""
    if not models_dir.is_dir():
        return []
    names: list[str] = []
    for entry in sorted(models_dir.iterdir()):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        if (entry / "config.json").is_file():
            names.append(entry.name)
            continue
        nested = [s.name for s in sorted(entry.iterdir()) if s.is_dir() and not s.name.startswith(".")]
        if nested:
            names.extend(f"{entry.name}/{name}" for name in nested)
        else:
            names.append(entry.name)
    return names


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _MAX_LISTED else "")


def _map_reference_path(path: Path, assets_dir: Path) -> Path | None:
    """``/assets/x`` (the reference's constant) as this worker's ``<assets>/x``, if it differs."""
    try:
        rest = PurePosixPath(path.as_posix()).relative_to(REFERENCE_ASSETS)
    except ValueError:
        return None
    return assets_dir / rest


def _under(path: Path, folder: Path) -> bool:
    """``path`` lies inside ``folder`` once every link is followed."""
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real == root or real.is_relative_to(root)


def _resolve_model(raw: str, assets_dir: Path) -> Path:
    models_dir = assets_dir / "models"
    path = Path(raw)
    if path.is_absolute():
        mapped = _map_reference_path(path, assets_dir)
        for option in (path, mapped):
            # Only installed models: a model folder elsewhere (the workspace included) could carry
            # code that trust_remote_code or a custom architecture would run.
            if option is not None and option.is_dir() and _under(option, models_dir):
                return option
        if path.is_dir():
            raise TrainConfigError(
                f"model_name_or_path {raw!r} is not an installed model: only models under {models_dir} "
                f"can be trained (available: {_listing(available_models(models_dir)) or 'none'})"
            )
    elif ".." not in path.parts and (models_dir / path).is_dir():
        return models_dir / path
    models = available_models(models_dir)
    hint = (
        f"available models: {_listing(models)} (write one of these names, or an absolute path)"
        if models
        else f"no models are installed under {models_dir}"
    )
    raise TrainConfigError(
        f"model_name_or_path {raw!r} is neither a folder under {models_dir} nor an existing absolute "
        f"path; models are not downloaded during evaluation; {hint}"
    )


# ---------------------------------------------------------------- datasets


def _dataset_names(value: Any, key: str) -> list[str]:
    """LlamaFactory accepts ``a,b`` or a YAML list of names."""
    if value is None:
        return []
    items: list[Any] = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise TrainConfigError(
            f"{key} must be a dataset name, a comma-separated string of names or a list of names; "
            f"got {value!r}"
        )
    return [name.strip() for name in items if name.strip()]


def _dataset_dir(value: Any, workspace_dir: Path, assets_dir: Path) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise TrainConfigError(f"dataset_dir must be a folder path; got {value!r} (or leave it out)")
    if value.strip() == "ONLINE":
        raise TrainConfigError(
            "dataset_dir: ONLINE loads datasets from the Hugging Face Hub, which training cannot reach; "
            f"declare the processed data in the workspace's {DATASET_INFO} and leave dataset_dir out"
        )
    path = Path(value.strip())
    if path.is_absolute():
        mapped = _map_reference_path(path, assets_dir)
        for option in (path, mapped):
            if option is not None and option.is_dir() and (
                _under(option, workspace_dir) or _under(option, assets_dir / "datasets")
            ):
                return option
        raise TrainConfigError(
            f"dataset_dir {value!r} is neither inside the workspace nor an installed dataset folder under "
            f"{assets_dir / 'datasets'}; leave dataset_dir out to use the workspace"
        )
    if ".." in path.parts:
        raise TrainConfigError(
            f"dataset_dir {value!r} leaves the workspace; use a folder inside it, or leave dataset_dir out"
        )
    return workspace_dir / path


def _declared_datasets(dataset_dir: Path, shown_dir: str) -> dict[str, Any]:
    info_path = dataset_dir / DATASET_INFO
    where = "the workspace root" if shown_dir == DEFAULT_DATASET_DIR else f"dataset_dir {shown_dir!r}"
    if not info_path.is_file():
        raise TrainConfigError(
            f"no {DATASET_INFO} in {where}: LlamaFactory finds datasets through it; add one such as "
            '{"processed_data": {"file_name": "data.json", "formatting": "alpaca"}} and name that '
            "dataset in train.yaml"
        )
    try:
        info = json.loads(info_path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        pos = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise TrainConfigError(f"{DATASET_INFO} in {where} is not valid JSON: {reason}{pos}") from None
    if not isinstance(info, dict):
        raise TrainConfigError(
            f"{DATASET_INFO} in {where} must be a JSON object mapping dataset names to their "
            f"descriptions; it is a {type(info).__name__}"
        )
    return info


#: dataset_info.json keys that load from a hub or run a loading script instead of reading a file.
_REMOTE_DATASET_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
#: train.yaml keys holding paths that LlamaFactory or transformers read: they must stay in the workspace.
_WORKSPACE_PATH_KEYS = (
    "adapter_name_or_path", "deepspeed", "tokenized_path", "cache_dir", "resume_from_checkpoint",
    "media_dir", "image_dir", "video_dir", "audio_dir", "logging_dir", "ref_model_adapters",
    "reward_model_adapters", "ray_storage_path",
)
#: Keys naming another model to load (preference stages): installed models only, as for the base.
_MODEL_KEYS = ("ref_model", "reward_model")


def _check_sources(names: list[str], declared: dict[str, Any], dataset_dir: Path) -> None:
    """Each used dataset must be a plain file of the dataset folder: no hub, no loading script."""
    for name in names:
        entry = declared.get(name)
        if not isinstance(entry, dict):
            raise TrainConfigError(f"{DATASET_INFO} entry {name!r} must be an object with a file_name")
        remote = [key for key in _REMOTE_DATASET_KEYS if entry.get(key)]
        if remote:
            raise TrainConfigError(
                f"{DATASET_INFO} entry {name!r} uses {', '.join(remote)}: datasets are not downloaded and "
                "loading scripts are not run during evaluation; write the data to a file in the workspace "
                "and give it as file_name"
            )
        file_name = entry.get("file_name")
        if not isinstance(file_name, str) or not file_name.strip():
            raise TrainConfigError(f"{DATASET_INFO} entry {name!r} has no file_name")
        target = dataset_dir / file_name
        if Path(file_name).is_absolute() or ".." in Path(file_name).parts or not _under(target, dataset_dir):
            raise TrainConfigError(
                f"{DATASET_INFO} entry {name!r}: file_name {file_name!r} leaves the dataset folder; "
                "name a file inside it"
            )
        if target.suffix == ".py" or (target.is_dir() and any(target.glob("*.py"))):
            raise TrainConfigError(
                f"{DATASET_INFO} entry {name!r}: {file_name!r} is a loading script; scripts are not run "
                "during evaluation: write the data as JSON, JSONL, CSV or Parquet"
            )


def _check_paths(config: dict[str, Any], workspace_dir: Path, assets_dir: Path) -> None:
    for key in _WORKSPACE_PATH_KEYS:
        value = config.get(key)
        if value is None:
            continue
        values = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
        for item in values:
            text = str(item).strip()
            path = Path(text)
            if not text or path.is_absolute() or ".." in path.parts or not _under(workspace_dir / path, workspace_dir):
                raise TrainConfigError(
                    f"{key} {text!r} must be a path inside the workspace (relative, without '..'): "
                    "files outside it are not part of the candidate"
                )
    for key in _MODEL_KEYS:
        value = config.get(key)
        if isinstance(value, str) and value.strip():
            config[key] = str(_resolve_model(value.strip(), assets_dir))


def _check_declared(names: list[str], key: str, declared: dict[str, Any]) -> None:
    missing = [n for n in names if n not in declared]
    if missing:
        known = _listing(sorted(declared)) if declared else "none"
        raise TrainConfigError(
            f"{key} {', '.join(repr(n) for n in missing)} in train.yaml "
            f"{'is' if len(missing) == 1 else 'are'} not declared in {DATASET_INFO} "
            f"(declared: {known}); use a declared name or add an entry for it"
        )


# ---------------------------------------------------------------- entry point


def _checkpointing(config: dict[str, Any], every_steps: int, resume_from: str | None) -> int | None:
    """Resumable checkpoints every ``save_steps`` (the candidate's when it set a whole number of
    steps, else ``every_steps``; 0: none), with the optimizer, scheduler and RNG state HF Trainer
    needs to resume; and ``resume_from`` (a checkpoint folder in the workspace) to resume from."""
    if every_steps <= 0:
        return None
    own = config.get("save_steps")
    steps = own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else every_steps
    config.update(save_strategy="steps", save_steps=steps, save_only_model=False)
    if resume_from is not None:
        config["resume_from_checkpoint"] = resume_from
    return steps


def prepare_train_yaml(text: str, *, assets_dir: Path, workspace_dir: Path, checkpoint_every_steps: int = 0,
                       resume_from: str | None = None) -> PreparedTrainConfig:
    """Check train.yaml against this worker's assets and the workspace, and set managed values
    (checkpoints every ``checkpoint_every_steps``, resuming from ``resume_from``: `_checkpointing`)."""
    assets_dir = assets_dir.absolute()
    workspace_dir = workspace_dir.absolute()
    config = _load_yaml(text, "train.yaml")
    if config is None:
        raise TrainConfigError(
            "train.yaml is empty: write LlamaFactory training arguments as `key: value` lines"
        )
    if not isinstance(config, dict):
        raise TrainConfigError(
            "train.yaml must be a mapping of LlamaFactory arguments (`key: value` lines); "
            f"it is a YAML {type(config).__name__}"
        )

    raw_model = config.get("model_name_or_path")
    if raw_model is None or (isinstance(raw_model, str) and not raw_model.strip()):
        models = available_models(assets_dir / "models")
        raise TrainConfigError(
            "train.yaml has no model_name_or_path: set it to the base model"
            + (f" (available: {_listing(models)})" if models else "")
        )
    if not isinstance(raw_model, str):
        raise TrainConfigError(f"model_name_or_path must be a string; got {raw_model!r}")
    model_path = _resolve_model(raw_model.strip(), assets_dir)

    stage = config.get("stage")
    if stage is not None and stage not in STAGES:
        raise TrainConfigError(f"stage {stage!r} is not one of LlamaFactory's stages: {', '.join(STAGES)}")
    if config.get("do_train") is False:
        raise TrainConfigError(
            "train.yaml sets do_train: false; this evaluation trains a model: set do_train: true"
        )
    finetuning_type = config.get("finetuning_type", "lora")  # LlamaFactory's default
    if not isinstance(finetuning_type, str) or not finetuning_type.strip():
        raise TrainConfigError(
            f"finetuning_type must be a string such as lora or full; got {finetuning_type!r}"
        )

    dataset_dir_value = config.get("dataset_dir")
    if dataset_dir_value is None:  # left out or `dataset_dir:` with no value: the workspace
        dataset_dir_value = config["dataset_dir"] = DEFAULT_DATASET_DIR
    dataset_dir = _dataset_dir(dataset_dir_value, workspace_dir, assets_dir)
    declared = _declared_datasets(dataset_dir, str(dataset_dir_value).strip())
    datasets = _dataset_names(config.get("dataset"), "dataset")
    if not datasets:
        raise TrainConfigError(
            "train.yaml names no dataset: set `dataset:` to the name(s) declared in "
            f"{DATASET_INFO} (declared: {_listing(sorted(declared)) if declared else 'none'})"
        )
    _check_declared(datasets, "dataset", declared)
    eval_datasets = _dataset_names(config.get("eval_dataset"), "eval_dataset")
    _check_declared(eval_datasets, "eval_dataset", declared)
    _check_sources(datasets + eval_datasets, declared, dataset_dir)
    _check_paths(config, workspace_dir, assets_dir)

    overridden = [k for k, v in SYSTEM_MANAGED_PARAMS.items() if k in config and config[k] != v]
    config.update(SYSTEM_MANAGED_PARAMS)
    config["model_name_or_path"] = str(model_path)
    save_steps = _checkpointing(config, checkpoint_every_steps, resume_from)
    # `llamafactory-cli train` with do_train left out (default false) would exit 0 having trained nothing.
    if config.get("do_train") is None:
        config["do_train"] = True
    if isinstance(dataset_dir_value, str) and Path(dataset_dir_value.strip()).is_absolute():
        config["dataset_dir"] = str(dataset_dir)

    header = "# Rewritten by ftbus: system-managed values set, model_name_or_path made absolute.\n"
    return PreparedTrainConfig(
        yaml_text=header + dump_yaml(config),
        model_path=model_path,
        dataset_dir=dataset_dir,
        finetuning_type=finetuning_type.strip(),
        datasets=datasets,
        overridden=overridden,
        save_steps=save_steps,
    )
