"""train.yaml preparation: managed values set, everything else kept, each bad config explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from services.trainer.config import (
    SYSTEM_MANAGED_PARAMS,
    PreparedTrainConfig,
    TrainConfigError,
    prepare_train_yaml,
)
from shared.train_yaml import TrainYamlLoader as _Loader

GOOD = """\
### model
model_name_or_path: tiny-model
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: processed_data
template: default
cutoff_len: 1024
max_samples: 1000

### output
output_dir: /somewhere/else
logging_steps: 10
plot_loss: true
report_to: wandb

### train
per_device_train_batch_size: 2
learning_rate: 1e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
run_name: '2024-01-01'
"""


@pytest.fixture
def assets(tmp_path: Path) -> Path:
    root = tmp_path / "assets"
    for name in ("tiny-model", "Qwen/Qwen3-1.7B"):
        (root / "models" / name).mkdir(parents=True)
        (root / "models" / name / "config.json").write_text("{}")
    return root


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    info = {"processed_data": {"file_name": "data.json", "formatting": "alpaca"}, "extra": {"file_name": "x.json"}}
    (ws / "dataset_info.json").write_text(json.dumps(info))
    return ws


def prepare(text: str, assets: Path, workspace: Path) -> PreparedTrainConfig:
    return prepare_train_yaml(text, assets_dir=assets, workspace_dir=workspace)


def error_of(text: str, assets: Path, workspace: Path) -> str:
    with pytest.raises(TrainConfigError) as err:
        prepare(text, assets, workspace)
    assert str(err.value) == err.value.message
    return err.value.message


# ---------------------------------------------------------------- a good config


def test_sets_managed_values_and_keeps_the_rest(assets: Path, workspace: Path) -> None:
    prepared = prepare(GOOD, assets, workspace)
    # Read back the way LlamaFactory reads it (OmegaConf's loader rules).
    config = yaml.load(prepared.yaml_text, Loader=_Loader)
    original = yaml.load(GOOD, Loader=_Loader)

    for key, value in SYSTEM_MANAGED_PARAMS.items():
        assert config[key] == value
    assert config["output_dir"] == "output"
    assert config["dataset_dir"] == "."
    assert config["model_name_or_path"] == str((assets / "models" / "tiny-model").absolute())
    changed = {*SYSTEM_MANAGED_PARAMS, "model_name_or_path", "dataset_dir"}
    assert {k: v for k, v in config.items() if k not in changed} == {
        k: v for k, v in original.items() if k not in changed
    }
    # Key order is the author's; new keys come last.
    assert list(config)[: len(original)] == list(original)

    assert prepared.model_path == (assets / "models" / "tiny-model").absolute()
    assert prepared.finetuning_type == "lora"
    assert prepared.datasets == ["processed_data"]
    assert sorted(prepared.overridden) == ["output_dir", "report_to"]


def test_floats_and_strings_survive_the_rewrite(assets: Path, workspace: Path) -> None:
    text = GOOD + "warmup_ratio: 5e-2\nhub_token: '1e-4'\n"
    config = yaml.load(prepare(text, assets, workspace).yaml_text, Loader=_Loader)
    assert config["learning_rate"] == pytest.approx(1e-4) and isinstance(config["learning_rate"], float)
    assert config["warmup_ratio"] == pytest.approx(0.05)
    assert config["hub_token"] == "1e-4"  # quoted in the source: still a string
    assert config["run_name"] == "2024-01-01"  # dates stay strings
    assert yaml.safe_load(prepare(text, assets, workspace).yaml_text)["run_name"] == "2024-01-01"
    assert config["num_train_epochs"] == 3.0


def test_defaults_left_to_llamafactory(assets: Path, workspace: Path) -> None:
    text = "model_name_or_path: tiny-model\ndataset: processed_data\n"
    prepared = prepare(text, assets, workspace)
    config = yaml.safe_load(prepared.yaml_text)
    assert "stage" not in config  # LlamaFactory's default (sft) applies
    assert config["do_train"] is True  # left out, training would do nothing
    assert prepared.finetuning_type == "lora"


def test_dataset_lists_and_comma_strings(assets: Path, workspace: Path) -> None:
    base = "model_name_or_path: tiny-model\n"
    assert prepare(base + "dataset: processed_data, extra\n", assets, workspace).datasets == [
        "processed_data",
        "extra",
    ]
    assert prepare(base + "dataset: [extra, processed_data]\n", assets, workspace).datasets == [
        "extra",
        "processed_data",
    ]


def test_model_paths(assets: Path, workspace: Path, tmp_path: Path) -> None:
    tail = "dataset: processed_data\n"
    nested = prepare("model_name_or_path: Qwen/Qwen3-1.7B\n" + tail, assets, workspace)
    assert nested.model_path == (assets / "models" / "Qwen" / "Qwen3-1.7B").absolute()
    # The reference's constant path maps onto this worker's assets.
    mapped = prepare("model_name_or_path: /assets/models/tiny-model\n" + tail, assets, workspace)
    assert mapped.model_path == (assets / "models" / "tiny-model").absolute()
    installed = (assets / "models" / "tiny-model").absolute()
    absolute = prepare(f"model_name_or_path: {installed}\n" + tail, assets, workspace)
    assert absolute.model_path == installed
    assert yaml.safe_load(absolute.yaml_text)["model_name_or_path"] == str(installed)
    # A model folder that is not installed (elsewhere on the worker, or in the candidate's own
    # workspace, where its code would run with trust_remote_code) is refused.
    elsewhere = tmp_path / "elsewhere" / "my-model"
    elsewhere.mkdir(parents=True)
    (workspace / "my-model").mkdir()
    for path in (elsewhere, workspace / "my-model"):
        message = error_of(f"model_name_or_path: {path}\n" + tail, assets, workspace)
        assert "is not an installed model" in message and "tiny-model" in message


def test_custom_dataset_dir_is_kept_and_checked(assets: Path, workspace: Path) -> None:
    (workspace / "data").mkdir()
    (workspace / "data" / "dataset_info.json").write_text('{"mine": {"file_name": "m.json"}}')
    text = "model_name_or_path: tiny-model\ndataset_dir: data\ndataset: mine\n"
    prepared = prepare(text, assets, workspace)
    assert yaml.safe_load(prepared.yaml_text)["dataset_dir"] == "data"
    assert prepared.datasets == ["mine"]


# ---------------------------------------------------------------- each bad config, its message


def test_unparsable_yaml_gives_line_and_column(assets: Path, workspace: Path) -> None:
    message = error_of("model_name_or_path: tiny-model\ndataset: [processed_data\nstage: sft\n", assets, workspace)
    assert message.startswith("train.yaml is not valid YAML")
    assert "line 3 column" in message


def test_duplicate_key_is_an_error(assets: Path, workspace: Path) -> None:
    message = error_of(GOOD + "learning_rate: 2e-4\n", assets, workspace)
    assert "'learning_rate' appears twice" in message and "line" in message


def test_not_a_mapping(assets: Path, workspace: Path) -> None:
    assert "must be a mapping" in error_of("- model_name_or_path: tiny-model\n", assets, workspace)
    assert "train.yaml is empty" in error_of("# nothing here\n", assets, workspace)


def test_missing_model_lists_available(assets: Path, workspace: Path) -> None:
    message = error_of("dataset: processed_data\n", assets, workspace)
    assert "no model_name_or_path" in message
    assert "Qwen/Qwen3-1.7B" in message and "tiny-model" in message


def test_unknown_model_lists_available(assets: Path, workspace: Path) -> None:
    message = error_of("model_name_or_path: meta-llama/Llama-3-8B\ndataset: processed_data\n", assets, workspace)
    assert "'meta-llama/Llama-3-8B' is neither a folder under" in message
    assert "available models: Qwen/Qwen3-1.7B, tiny-model" in message


def test_model_name_cannot_escape_models_folder(assets: Path, workspace: Path) -> None:
    (assets / "secret").mkdir()
    message = error_of("model_name_or_path: ../secret\ndataset: processed_data\n", assets, workspace)
    assert "is neither a folder under" in message


def test_no_models_installed(tmp_path: Path, workspace: Path) -> None:
    message = error_of("model_name_or_path: x\ndataset: processed_data\n", tmp_path / "empty", workspace)
    assert "no models are installed" in message


def test_undeclared_dataset(assets: Path, workspace: Path) -> None:
    message = error_of("model_name_or_path: tiny-model\ndataset: processed_data,alpaca_en\n", assets, workspace)
    assert "dataset 'alpaca_en' in train.yaml is not declared in dataset_info.json" in message
    assert "declared: extra, processed_data" in message


def test_undeclared_eval_dataset(assets: Path, workspace: Path) -> None:
    text = "model_name_or_path: tiny-model\ndataset: processed_data\neval_dataset: held_out\n"
    assert "eval_dataset 'held_out'" in error_of(text, assets, workspace)


def test_no_dataset(assets: Path, workspace: Path) -> None:
    message = error_of("model_name_or_path: tiny-model\n", assets, workspace)
    assert "names no dataset" in message and "processed_data" in message


def test_dataset_info_missing(assets: Path, workspace: Path) -> None:
    (workspace / "dataset_info.json").unlink()
    message = error_of("model_name_or_path: tiny-model\ndataset: processed_data\n", assets, workspace)
    assert "no dataset_info.json in the workspace root" in message


def test_dataset_info_unparsable(assets: Path, workspace: Path) -> None:
    (workspace / "dataset_info.json").write_text('{"processed_data": {"file_name": "data.json",}}')
    message = error_of("model_name_or_path: tiny-model\ndataset: processed_data\n", assets, workspace)
    assert "dataset_info.json in the workspace root is not valid JSON" in message and "line 1" in message


def test_do_train_false_and_bad_stage(assets: Path, workspace: Path) -> None:
    base = "model_name_or_path: tiny-model\ndataset: processed_data\n"
    assert "set do_train: true" in error_of(base + "do_train: false\n", assets, workspace)
    assert "stage 'sftt' is not one of" in error_of(base + "stage: sftt\n", assets, workspace)


def test_online_datasets_and_escaping_dataset_dir(assets: Path, workspace: Path) -> None:
    base = "model_name_or_path: tiny-model\ndataset: processed_data\n"
    assert "Hugging Face Hub" in error_of(base + "dataset_dir: ONLINE\n", assets, workspace)
    assert "leaves the workspace" in error_of(base + "dataset_dir: ../other\n", assets, workspace)


def test_nothing_loads_from_outside_the_workspace_or_runs_a_script(
    assets: Path, workspace: Path, tmp_path: Path
) -> None:
    """Fields that would make LlamaFactory read host files or run candidate code are refused, each
    with the reason."""
    base = "model_name_or_path: tiny-model\ndataset: processed_data\n"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dataset_info.json").write_text('{"processed_data": {"file_name": "x.json"}}')
    cases = {
        f"dataset_dir: {outside}\n": "is neither inside the workspace nor an installed dataset",
        "deepspeed: /etc/ds.json\n": "deepspeed '/etc/ds.json' must be a path inside the workspace",
        "adapter_name_or_path: ../other\n": "adapter_name_or_path '../other' must be a path inside the workspace",
        "cache_dir: /root\n": "cache_dir '/root' must be a path inside the workspace",
        f"ref_model: {outside}\n": "is not an installed model",
    }
    for extra, expected in cases.items():
        assert expected in error_of(base + extra, assets, workspace), extra
    # Inside the workspace, the same keys are fine.
    prepare(base + "deepspeed: ds.json\nadapter_name_or_path: init_adapter\n", assets, workspace)

    def info(entry: str) -> None:
        (workspace / "dataset_info.json").write_text('{"processed_data": ' + entry + "}")

    for entry, expected in {
        '{"hf_hub_url": "org/data"}': "uses hf_hub_url",
        '{"script_url": "loader"}': "uses script_url",
        '{"file_name": "../../assets/benchmarks/x/test.jsonl"}': "leaves the dataset folder",
        '{"file_name": "/etc/passwd"}': "leaves the dataset folder",
        '{"file_name": "load.py"}': "is a loading script",
        '"data.json"': "must be an object with a file_name",
    }.items():
        info(entry)
        assert expected in error_of(base, assets, workspace), entry
    (workspace / "loader").mkdir()
    (workspace / "loader" / "loader.py").write_text("import os\n")
    info('{"file_name": "loader"}')
    assert "is a loading script" in error_of(base, assets, workspace)
    (workspace / "linked").symlink_to(outside)
    info('{"file_name": "linked/x.json"}')
    assert "leaves the dataset folder" in error_of(base, assets, workspace)
