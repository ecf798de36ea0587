
"""Checks on ``data.json``, the file ``process_data.py`` must write into the workspace root.

LlamaFactory reads it (through ``dataset_info.json``) as a list of records, e.g. Alpaca
``[{"instruction": ..., "input": ..., "output": ...}]``. A file it cannot read would only fail
deep inside training, minutes later and with a confusing traceback; here it fails at once, with
a message that tells the candidate's author what to fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.errors import ExplainedError

#: How many offending element indexes a message lists before it just counts them.
_MAX_LISTED = 5


class DataInvalid(ExplainedError):
    """data.json is missing or not a non-empty JSON list of objects. ``message`` is user-facing."""


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, as the author of the script would call it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def load_data_json(path: Path, max_bytes: int | None = None) -> list[dict[str, Any]]:
    """Read and check data.json; raise ``DataInvalid`` with a clear message when it is unusable.

    ``max_bytes``: a larger file is refused before it is read (parsed, JSON takes several times
    its size in memory: a multi-GB data.json must not take the worker down with it)."""
    if not path.exists():
        raise DataInvalid("process_data.py exited 0 but wrote no data.json in the workspace root")
    if not path.is_file():
        raise DataInvalid(f"data.json in the workspace root is not a regular file ({path})")
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise DataInvalid(
            f"data.json is {size} bytes, over the limit of {max_bytes} bytes (max_data_json_bytes): "
            "keep the processed data to what training needs"
        )
    raw = path.read_bytes()
    try:
        # json.loads on bytes detects UTF-8/16/32 (with or without BOM) like the JSON spec says.
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise DataInvalid(
            f"data.json is not UTF-8 text (byte {exc.start}: {exc.reason}); write it with "
            "encoding='utf-8' (json.dump(..., ensure_ascii=False) is fine)"
        ) from None
    except json.JSONDecodeError as exc:
        raise DataInvalid(
            f"data.json is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(char {exc.pos}); write it with json.dump(records, f) as one JSON list"
        ) from None
    if not isinstance(data, list):
        hint = ""
        if isinstance(data, dict):
            list_keys = [k for k, v in data.items() if isinstance(v, list)]
            if list_keys:
                hint = f" (it holds a list under {list_keys[0]!r}: write that list itself)"
        raise DataInvalid(
            f"data.json must be a JSON list of samples, e.g. "
            f'[{{"instruction": ..., "input": ..., "output": ...}}]; it is {_json_type(data)}{hint}'
        )
    if not data:
        raise DataInvalid("data.json is an empty list: process_data.py produced no training samples")
    bad = [i for i, item in enumerate(data) if not isinstance(item, dict)]
    if bad:
        first = bad[0]
        listed = ", ".join(str(i) for i in bad[:_MAX_LISTED]) + (", ..." if len(bad) > _MAX_LISTED else "")
        raise DataInvalid(
            f"data.json element {first} is {_json_type(data[first])}, not an object: every sample must be "
            f"an object such as {{\"instruction\": ..., \"output\": ...}} "
            f"({len(bad)} of {len(data)} elements are not objects, at index {listed})"
        )
    return data
