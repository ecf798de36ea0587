"""data.json checks: each unusable file gives the message its author needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.data.validate import DataInvalid, load_data_json


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "data.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_valid_alpaca_list_is_returned(tmp_path: Path) -> None:
    records = [{"instruction": "Add 1 and 2", "input": "", "output": "3"}, {"instruction": "你好", "output": "hi"}]
    path = _write(tmp_path, json.dumps(records, ensure_ascii=False))
    assert load_data_json(path) == records


def test_missing_file_says_script_wrote_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataInvalid) as err:
        load_data_json(tmp_path / "data.json")
    assert err.value.message == "process_data.py exited 0 but wrote no data.json in the workspace root"


def test_invalid_json_reports_position(tmp_path: Path) -> None:
    path = _write(tmp_path, '[\n  {"instruction": "a"},\n  {"instruction": "b",}\n]')
    with pytest.raises(DataInvalid) as err:
        load_data_json(path)
    assert "not valid JSON" in err.value.message
    assert "line 3" in err.value.message and "column" in err.value.message


def test_not_utf8_is_explained(tmp_path: Path) -> None:
    path = _write(tmp_path, '[{"instruction": "caf\xe9"}]'.encode("latin-1"))
    with pytest.raises(DataInvalid) as err:
        load_data_json(path)
    assert "UTF-8" in err.value.message


def test_object_instead_of_list_points_at_the_inner_list(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps({"data": [{"instruction": "a", "output": "b"}]}))
    with pytest.raises(DataInvalid) as err:
        load_data_json(path)
    assert "must be a JSON list" in err.value.message
    assert "an object" in err.value.message and "'data'" in err.value.message


def test_empty_list(tmp_path: Path) -> None:
    with pytest.raises(DataInvalid) as err:
        load_data_json(_write(tmp_path, "[]"))
    assert "empty list" in err.value.message


def test_non_object_element_names_its_index(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps([{"instruction": "a"}, {"instruction": "b"}, "oops", 4]))
    with pytest.raises(DataInvalid) as err:
        load_data_json(path)
    message = err.value.message
    assert message.startswith("data.json element 2 is a string, not an object")
    assert "2 of 4 elements" in message and "2, 3" in message


def test_str_of_error_is_the_message(tmp_path: Path) -> None:
    with pytest.raises(DataInvalid) as err:
        load_data_json(_write(tmp_path, "[]"))
    assert str(err.value) == err.value.message
