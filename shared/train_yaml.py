"""``train.yaml`` read and written the way LlamaFactory reads it, for every service that reads it.

LlamaFactory loads its config with OmegaConf, whose YAML rules differ from PyYAML's ``safe_load``:
``1e-4`` is a float (YAML 1.1 says string), dates stay strings, a key given twice is an error.
The trainer checks and rewrites the config with this reader, and the judge reads the config it
advises on with the same one, so both see the values LlamaFactory will see.

:func:`dump_yaml` writes a config so that it loads back to the same values here and in OmegaConf.
A config that expands to an absurd number of values (a YAML "alias bomb") is refused.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from shared.errors import ExplainedError

# OmegaConf's float pattern: YAML 1.2 style, so ``1e-4`` and ``5e-5`` are floats (YAML 1.1 says str).
_FLOAT = re.compile(
    r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class TrainYamlError(ExplainedError, ValueError):
    """The text cannot be read as a config; ``message`` says why and what to change."""


class TrainYamlLoader(yaml.SafeLoader):
    """A SafeLoader (no arbitrary objects) with OmegaConf's scalar rules and duplicate-key check."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # OmegaConf refuses duplicate keys; PyYAML would silently keep the last one.
        seen: dict[str, yaml.Mark] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                if key_node.value in seen:
                    first = seen[key_node.value]
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key_node.value!r} appears twice (first at line {first.line + 1})",
                        key_node.start_mark,
                    )
                seen[key_node.value] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


class TrainYamlDumper(yaml.SafeDumper):
    """Writes floats so that OmegaConf and :class:`TrainYamlLoader` read them back as floats."""


for _cls in (TrainYamlLoader, TrainYamlDumper):
    _cls.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))
# Dates stay strings when read (as in OmegaConf). The dumper keeps the timestamp rule, so it quotes
# date-like strings and any YAML reader, OmegaConf or not, reads them back as strings.
TrainYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in TrainYamlLoader.yaml_implicit_resolvers.items()
}


# A YAML "alias bomb" (nested anchors, each alias repeating the one before) loads as a small
# shared graph but expands to billions of values in anything that walks it (a dump, a copy, the
# trainer's own parser). No LlamaFactory config comes near this many values.
MAX_VALUES = 100_000


def _count_values(data: Any, limit: int) -> int:
    """Values in ``data`` as it expands (shared parts counted each time), counting stops past ``limit``."""
    count = 0
    stack = [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def load_yaml(text: str, what: str = "train.yaml") -> Any:
    """The values in ``text`` as LlamaFactory reads them; :class:`TrainYamlError` names ``what`` otherwise."""
    try:
        data = yaml.load(text, Loader=TrainYamlLoader)  # a SafeLoader: no arbitrary objects
        if _count_values(data, MAX_VALUES) > MAX_VALUES:
            raise TrainYamlError(
                f"{what} expands to more than {MAX_VALUES} values (YAML anchors and aliases repeated "
                "inside each other, an 'alias bomb'): write the config out plainly"
            )
        return data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise TrainYamlError(
            f"{what} is not valid YAML: {problem}{where}; fix the syntax (indent with spaces, "
            "quote values that contain ': ' or ' #')"
        ) from None


def dump_yaml(config: dict[str, Any]) -> str:
    """``config`` as YAML text that :func:`load_yaml` (and OmegaConf) read back to the same values."""
    return yaml.dump(
        config, Dumper=TrainYamlDumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=10_000
    )


#: LlamaFactory's training stages (``FinetuningArguments.stage``), as services/trainer/config.py checks them.
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")


def dataset_names(value: Any) -> list[str] | None:
    """``dataset``/``eval_dataset`` as LlamaFactory reads them (``a,b`` or a list); None if neither."""
    if value is None:
        return []
    items: Any = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return None
    return [name.strip() for name in items if name.strip()]


def config_problems(config: Any) -> list[str]:
    """What is wrong with the keys of a loaded train.yaml that needs neither a worker nor the data:
    the same rules the trainer applies first (services/trainer/config.py), for a check before submit.
    Each problem says what to change."""
    if config is None:
        return ["train.yaml is empty: write LlamaFactory training arguments as `key: value` lines"]
    if not isinstance(config, dict):
        return [f"train.yaml must be a mapping of LlamaFactory arguments (`key: value` lines); it is a YAML "
                f"{type(config).__name__}"]
    problems: list[str] = []
    model = config.get("model_name_or_path")
    if model is None or (isinstance(model, str) and not model.strip()):
        problems.append("train.yaml has no model_name_or_path: set it to the base model (a folder name under the "
                        "assets' models/, e.g. tiny-llama)")
    elif not isinstance(model, str):
        problems.append(f"model_name_or_path must be a string; got {model!r}")
    stage = config.get("stage")
    if stage is not None and stage not in STAGES:
        problems.append(f"stage {stage!r} is not one of LlamaFactory's stages: {', '.join(STAGES)}")
    if config.get("do_train") is False:
        problems.append("train.yaml sets do_train: false; this evaluation trains a model: set do_train: true")
    finetuning_type = config.get("finetuning_type", "lora")
    if not isinstance(finetuning_type, str) or not finetuning_type.strip():
        problems.append(f"finetuning_type must be a string such as lora or full; got {finetuning_type!r}")
    dataset_dir = config.get("dataset_dir")
    if isinstance(dataset_dir, str) and dataset_dir.strip() == "ONLINE":
        problems.append("dataset_dir: ONLINE loads datasets from the Hugging Face Hub, which training cannot "
                        "reach; declare the processed data in dataset_info.json and leave dataset_dir out")
    elif dataset_dir is not None and (not isinstance(dataset_dir, str) or not dataset_dir.strip()):
        problems.append(f"dataset_dir must be a folder path; got {dataset_dir!r} (or leave it out)")
    for key in ("dataset", "eval_dataset"):
        names = dataset_names(config.get(key))
        if names is None:
            problems.append(f"{key} must be a dataset name, a comma-separated string of names or a list of "
                            f"names; got {config.get(key)!r}")
        elif key == "dataset" and not names:
            problems.append("train.yaml names no dataset: set `dataset:` to the name declared in "
                            "dataset_info.json (e.g. processed_data)")
    return problems
