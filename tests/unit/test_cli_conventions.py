"""The CLI's conventions (issue 38), without a server: help, -h, flags without <bool>, choices,
one example per command, workflow order, --version, completion, plain columns in a pipe, the
local checks of a workspace, and docs/cli.md generated from the CLI itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer import _click
from typer.testing import CliRunner

from ftbus.check import check_names, check_workspace
from ftbus.cli import app
from ftbus.cli_common import WORKFLOW, plain_columns
from shared.events import TaskSpec
from shared.logs import _plain
from shared.train_yaml import config_problems, load_yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _commands() -> list[tuple[str, object]]:
    root = typer.main.get_command(app)
    ctx = _click.Context(root, info_name="ftbus")
    found: list[tuple[str, object]] = []
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        if hasattr(command, "list_commands"):
            sub_ctx = _click.Context(command, info_name=name, parent=ctx)
            found += [(f"{name} {sub}", command.get_command(sub_ctx, sub)) for sub in command.list_commands(sub_ctx)]
        else:
            found.append((name, command))
    return found


def test_commands_are_listed_in_workflow_order() -> None:
    root = typer.main.get_command(app)
    names = root.list_commands(_click.Context(root, info_name="ftbus"))
    assert names == [n for n in WORKFLOW if n in names] and set(names) == set(WORKFLOW)


@pytest.mark.parametrize("name", [name for name, _ in _commands()])
def test_every_command_has_h_an_example_and_no_bool_metavar(name: str) -> None:
    result = CliRunner().invoke(app, [*name.split(), "-h"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output, result.output
    assert "Example:" in result.output or name == "score", result.output  # score: ftbus/score.py's own help


def test_choices_are_shown_and_enforced() -> None:
    runner = CliRunner()
    for args, choices in ((["get", "-h"], "verdict|lm-eval"), (["logs", "-h"], "data|train|bench|baseline"),
                          (["pull", "-h"], "adapter|merged"), (["ls", "-h"], "table|wide|plain|json")):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert choices in result.output, result.output
    refused = runner.invoke(app, ["logs", "x", "--stage", "test"])
    assert refused.exit_code == 2 and "'test' is not one of" in refused.output


def test_version_and_completion() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("ftbus ")
    help_text = CliRunner().invoke(app, ["-h"], env={"COLUMNS": "200"}).output
    assert "--install-completion" in help_text and "--show-completion" in help_text


def test_a_flag_takes_no_value() -> None:
    result = CliRunner().invoke(app, ["check", str(EXAMPLES / "lora"), "--json", "true"])
    assert result.exit_code == 2  # `true` is a second workspace, which does not exist
    assert json.loads(result.stdout)[1]["problems"][0].startswith("workspace true is not a folder")


def test_plain_columns_cut_nothing_and_keep_one_line_per_row() -> None:
    name = "a-benchmark-name-much-longer-than-eighty-columns-would-allow-for-one-cell-of-a-table"
    text = plain_columns(["benchmark", "items"], [[name, "12"], ["tiny", "3\nlines"]])
    lines = text.splitlines()
    assert lines[0].split() == ["benchmark", "items"]
    assert lines[1].split() == [name, "12"] and lines[2].split() == ["tiny", "3", "lines"]
    assert all(line == line.rstrip() for line in lines) and len(lines) == 3


def test_client_log_lines_are_plain_text() -> None:
    line = _plain(None, "warning", {"event": "nats connection error", "level": "warning", "error": "refused",
                                    "timestamp": "2026-01-01T00:00:00Z"})
    assert line == "warning: nats connection error (error=refused)"


# ---------------------------------------------------------------------- ftbus check


def test_the_examples_pass_the_check() -> None:
    for example in ("lora", "full", "gsm8k"):
        result = check_workspace(EXAMPLES / example, REPO / "no-assets-here")
        assert result.ok, (example, result.problems)


def _workspace(tmp_path: Path, train: str | None = None, info: str | None = None) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "process_data.py").write_text("print('hi')\n")
    (ws / "train.yaml").write_text(train if train is not None else "model_name_or_path: m\ndataset: d\n")
    (ws / "dataset_info.json").write_text(info if info is not None else '{"d": {"file_name": "data.json"}}')
    return ws


def test_the_check_names_what_is_wrong(tmp_path: Path) -> None:
    nowhere = tmp_path / "no-assets"
    assert check_workspace(_workspace(tmp_path), nowhere).ok
    assert check_workspace(tmp_path / "missing", nowhere).problems == [
        f"workspace {tmp_path / 'missing'} is not a folder: it does not exist"]
    ws = _workspace(tmp_path)
    (ws / "process_data.py").unlink()
    (ws / "dataset_info.json").unlink()
    problems = check_workspace(ws, nowhere).problems
    assert [p.split(" ")[0] for p in problems] == ["process_data.py", "dataset_info.json"], problems

    bad = check_workspace(_workspace(tmp_path, train="model_name_or_path: m\n  dataset: [d\n"), nowhere)
    assert len(bad.problems) == 1 and bad.problems[0].startswith("train.yaml is not valid YAML"), bad.problems
    keys = check_workspace(_workspace(tmp_path, train="stage: sftt\ndo_train: false\ndataset: e\n"), nowhere)
    assert any("no model_name_or_path" in p for p in keys.problems)
    assert any("stage 'sftt'" in p for p in keys.problems) and any("do_train: false" in p for p in keys.problems)
    assert any("dataset 'e' in train.yaml is not declared in dataset_info.json (declared: d)" in p
               for p in keys.problems), keys.problems
    broken = check_workspace(_workspace(tmp_path, info="{not json"), nowhere)
    assert broken.problems[0].startswith("dataset_info.json is not valid JSON"), broken.problems
    remote = check_workspace(_workspace(tmp_path, info='{"d": {"hf_hub_url": "x/y", "file_name": "a"}}'), nowhere)
    assert "hf_hub_url" in remote.problems[0]


def test_the_check_of_names_needs_the_assets(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    (assets / "models" / "m").mkdir(parents=True)
    (assets / "benchmarks" / "b").mkdir(parents=True)
    (assets / "benchmarks" / "b" / "benchmark.yaml").write_text("name: b\n")
    ws = _workspace(tmp_path)
    assert check_workspace(ws, assets, TaskSpec(base_model="m", benchmark="b")).ok
    result = check_workspace(ws, assets, TaskSpec(base_model="mm", benchmark="bb", involving_datasets=["raw"]))
    assert [p.split(" ")[:2] for p in result.problems] == [["unknown", "base"], ["unknown", "benchmark"],
                                                            ["declared", "dataset"]], result.problems
    assert "available benchmarks: b" in result.problems[1]
    other = check_workspace(_workspace(tmp_path, train="model_name_or_path: nope\ndataset: d\n"), assets)
    assert other.problems == [f"train.yaml's model_name_or_path 'nope' is not a folder under {assets / 'models'}; "
                              "available models: m"]
    # Without the assets: said, not guessed.
    far = check_names(check_workspace(ws, tmp_path / "none"), tmp_path / "none", benchmark="bb")
    assert far.ok and "checked by the server" in far.notes[0]


def test_config_problems_are_the_trainers_first_checks() -> None:
    assert config_problems(load_yaml("model_name_or_path: m\ndataset: a,b\n")) == []
    assert config_problems(None)[0].startswith("train.yaml is empty")
    assert "must be a mapping" in config_problems(["a"])[0]
    assert "ONLINE" in config_problems({"model_name_or_path": "m", "dataset": "d", "dataset_dir": "ONLINE"})[0]


# ---------------------------------------------------------------------- docs/cli.md


def test_the_cli_reference_is_current() -> None:
    proc = subprocess.run([sys.executable, "docs/gen_cli_reference.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # a hang guard
    assert proc.returncode == 0, f"run `python docs/gen_cli_reference.py --write`:\n{proc.stdout}{proc.stderr}"
    text = (REPO / "docs" / "cli.md").read_text()
    for command in ("ftbus submit", "ftbus check", "ftbus benchmarks ls", "ftbus assets init"):
        assert f"## `{command}`" in text
