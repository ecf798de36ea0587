"""bench/table.py: the performance table gathers each script's rows, says which failed, and sets two
saved runs side by side."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from rich.console import Console

REPO = Path(__file__).resolve().parents[2]


def _table_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_table", REPO / "bench" / "table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_table"] = module
    spec.loader.exec_module(module)
    return module


table = _table_module()


def _text(renderable: object) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_every_listed_script_exists_and_speaks_json() -> None:
    for script in table.SCRIPTS:
        source = (REPO / "bench" / f"{script.name}.py").read_text()
        assert "--json" in source, f"bench/{script.name}.py has no --json option"


def test_rows_are_shown_with_their_target_and_a_failed_script_says_why() -> None:
    rows = [table.Row(measure="burst of 20 / ideal", value="1.09x", target="<= 1.10x", met=True),
            table.Row(measure="overhead vs hops", value="9.1x", target="<= 3x", met=False)]
    text = _text(table.render({"pipelining": (rows, None), "overhead": ([], "exited with code 1")}, "t"))
    assert "burst of 20 / ideal" in text and "1.09x" in text and "yes" in text
    assert "overhead" in text and "failed" in text and "exited with code 1" in text


def test_compare_sets_before_and_after_side_by_side(tmp_path: Path) -> None:
    def saved(value: str) -> dict[str, object]:
        row = {"measure": "pre-check failures, 100 at once", "value": value, "target": ">= 300 req/s",
               "met": value.startswith("3")}
        return {"when": "x", "results": {"precheck_burst": {"rows": [row], "error": None}}}

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(saved("79 req/s")))
    after.write_text(json.dumps(saved("320 req/s")))
    text = _text(table.compare(before, after))
    line = next(line for line in text.splitlines() if "pre-check failures" in line)
    assert line.index("79 req/s") < line.index("320 req/s") and "yes" in line
