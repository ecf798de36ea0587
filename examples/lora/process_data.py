"""Turn the raw tiny-reviews records into LlamaFactory alpaca records (data.json in the current folder).

The candidate teaches the tiny model to tell positive from negative reviews (the tiny-sentiment
benchmark): each record is the review question and its one-word answer.

The data stage runs this in the workspace with FTBUS_ASSETS_DIR (the assets root) and
FT_DATASET_PATH (<assets>/datasets, the reference evaluator's name) set. `--debug` keeps 10 records,
as the reference's coding stage does for a quick check.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def dataset_root() -> Path:
    if os.environ.get("FT_DATASET_PATH"):
        return Path(os.environ["FT_DATASET_PATH"])
    if os.environ.get("FTBUS_ASSETS_DIR"):
        return Path(os.environ["FTBUS_ASSETS_DIR"]) / "datasets"
    sys.exit("neither FT_DATASET_PATH nor FTBUS_ASSETS_DIR is set: where are the datasets?")


def main() -> None:
    raw = dataset_root() / "tiny-reviews" / "raw.jsonl"
    records = [json.loads(line) for line in raw.read_text(encoding="utf-8").splitlines() if line.strip()]
    if "--debug" in sys.argv[1:]:
        records = records[:10]
    data = [
        {"instruction": r["question"], "input": "", "output": r["answer"]}
        for r in records
        if r["question"].strip() and r["answer"].strip()
    ]
    Path("data.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    labels = {label: sum(r["answer"] == label for r in records) for label in sorted({r["answer"] for r in records})}
    print(f"read {len(records)} records from {raw} ({labels}); wrote {len(data)} to data.json")


if __name__ == "__main__":
    main()
