"""Turn the raw grade-school-arith records into LlamaFactory alpaca records (data.json in the current folder).

The candidate teaches the tiny model the gsm8k-synth benchmark: grade-school word problems in
GSM8K's own format, whose worked answer ends in `#### <number>` (what GSM8K's strict match reads).
Each record's prompt is the benchmark's own, `Question: <question>\nAnswer:`, and its response the
record's worked answer. The benchmark stage sends that same prompt as the user's turn of the
tokenizer's chat template (lm-eval's --apply_chat_template) and LlamaFactory's `template: default`
wraps the instruction in the same turn, so the model is trained on exactly the text it is tested on.

The data stage runs this in the workspace with FTBUS_ASSETS_DIR (the assets root) and
FT_DATASET_PATH (<assets>/datasets) set. `--debug` keeps 10 records.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PROMPT = "Question: {question}\nAnswer:"  # gsm8k-synth's benchmark.yaml prompt, as lm-eval renders it


def dataset_root() -> Path:
    if os.environ.get("FT_DATASET_PATH"):
        return Path(os.environ["FT_DATASET_PATH"])
    if os.environ.get("FTBUS_ASSETS_DIR"):
        return Path(os.environ["FTBUS_ASSETS_DIR"]) / "datasets"
    sys.exit("neither FT_DATASET_PATH nor FTBUS_ASSETS_DIR is set: where are the datasets?")


def main() -> None:
    raw = dataset_root() / "grade-school-arith" / "raw.jsonl"
    records = [json.loads(line) for line in raw.read_text(encoding="utf-8").splitlines() if line.strip()]
    if "--debug" in sys.argv[1:]:
        records = records[:10]
    data = [
        {"instruction": PROMPT.format(question=r["question"].strip()), "input": "", "output": r["answer"].strip()}
        for r in records
        if r["question"].strip() and "\n#### " in r["answer"]
    ]
    Path("data.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"read {len(records)} records from {raw}; wrote {len(data)} to data.json")


if __name__ == "__main__":
    main()
