"""Turn the raw tiny-qa records into LlamaFactory alpaca records (data.json in the current folder).

This variant keeps only arithmetic (addition, subtraction): the full fine-tune example targets the
tiny-arith benchmark. The data stage sets FTBUS_ASSETS_DIR and FT_DATASET_PATH (<assets>/datasets).
`--debug` keeps 10 records.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

KINDS = {"addition", "subtraction"}


def dataset_root() -> Path:
    if os.environ.get("FT_DATASET_PATH"):
        return Path(os.environ["FT_DATASET_PATH"])
    if os.environ.get("FTBUS_ASSETS_DIR"):
        return Path(os.environ["FTBUS_ASSETS_DIR"]) / "datasets"
    sys.exit("neither FT_DATASET_PATH nor FTBUS_ASSETS_DIR is set: where are the datasets?")


def main() -> None:
    raw = dataset_root() / "tiny-qa" / "raw.jsonl"
    records = [json.loads(line) for line in raw.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [r for r in records if r["kind"] in KINDS]
    if "--debug" in sys.argv[1:]:
        records = records[:10]
    data = [
        {"instruction": "Answer with a number only.", "input": r["question"], "output": r["answer"]}
        for r in records
    ]
    Path("data.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"kept {len(data)} arithmetic records of {raw}; wrote data.json")


if __name__ == "__main__":
    main()
