"""The code executor's channel (evaluation/code_supervisor.py): what crosses between a benchmark's
tests and the model's code, and how strictly the checking side reads what the model's side sent.

The codec is checked value by value; then the checking side's ``check`` runs here against the real
model harness in a plain subprocess (benign code only: the sandbox is tests/integration's).
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from enum import IntEnum

import pytest

from evaluation import code_supervisor as cs

PLAIN = [None, True, False, 0, -7, 2**200, -(2**70), 1.5, -0.0, math.inf, -math.inf, 1e-308, 3 + 4j, "",
         "é\n\"\\\u2028", b"", b"\x00\xff", [], [1, [2, [3]]], (), (1, "a"), set(), {1, 2}, frozenset({"x"}),
         {}, {"a": 1, (1, 2): [3], 4: {5: None}}]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_values_cross_unchanged_and_with_their_exact_types(value: object) -> None:
    wire = cs.to_json(cs.encode(value))
    back = cs.decode(json.loads(wire))
    assert back == value and type(back) is type(value)
    if isinstance(value, list | tuple):
        assert [type(x) for x in back] == [type(x) for x in value]


def test_nan_crosses_as_nan() -> None:
    assert math.isnan(cs.decode(json.loads(cs.to_json(cs.encode(math.nan)))))


class Anything(float):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = float.__hash__


class Listy(list):
    pass


class Colour(IntEnum):
    RED = 1


@pytest.mark.parametrize(("value", "said"), [
    (Anything(0.0), "a subclass of float"), (Listy(), "a subclass of list"), (Colour.RED, "a subclass of"),
    (type("S", (str,), {})("x"), "a subclass of str"), (object(), "type object"), ((i for i in ()), "generator"),
    (len, "builtin_function_or_method"), ([1, {2: Anything(1.0)}], "a subclass of float"),
])
def test_anything_else_is_refused_by_exact_type(value: object, said: str) -> None:
    with pytest.raises(cs.NotPlain, match=said):
        cs.encode(value)


def test_values_nested_too_deep_are_refused() -> None:
    deep: list = []
    for _ in range(cs._codec["MAX_DEPTH"] + 2):
        deep = [deep]
    with pytest.raises(cs.NotPlain, match="nested"):
        cs.encode(deep)


@pytest.mark.parametrize("node", [
    ["i", 5], ["b", 1], ["x"], ["N", 1], ["l", "abc"], ["s", 3], ["f", "nonsense"], ["y", "zz"], "i", {"i": "1"},
    ["d", [[["l", []], ["N"]]]], ["S", [["l", []]]], ["d", [["s", "a"]]], ["c", "0x1p0"], [],
], ids=repr)
def test_the_checking_side_refuses_what_is_no_plain_value(node: object) -> None:
    with pytest.raises(cs.ChannelError):
        cs.decode(node)


def test_the_checking_side_refuses_nesting_past_its_limit() -> None:
    node: list = ["N"]
    for _ in range(cs._codec["MAX_DEPTH"] + 2):
        node = ["l", [node]]
    with pytest.raises(cs.ChannelError):
        cs.decode(node)


def _replies(data: bytes) -> cs.Replies:
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return cs.Replies(read)


@pytest.mark.parametrize(("data", "said"), [
    (b"", "closed the channel"), (b"not json\n", "not JSON"), (b"[1, 2]\n", "not an object"),
    (b'{"a": 1}', "MiB"), (b"[" * 20000 + b"\n", "not JSON"),
])
def test_replies_that_are_no_frame_are_refused(data: bytes, said: str) -> None:
    with pytest.raises(cs.ChannelError, match=said):
        _replies(data).receive()


def test_a_reply_over_the_size_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "MAX_LINE", 64)
    with pytest.raises(cs.ChannelError, match="MiB"):
        _replies(b'{"return": ["s", "' + b"x" * 100 + b'"]}\n').receive()


# ---------------------------------------------------------------------- the two sides, for real


def run_sample(solution: str, tests: str, functions: tuple[str, ...], prelude: str = "") -> tuple[int, str]:
    """The checking side here, the model's harness in a subprocess, joined by the channel."""
    calls_read, calls_write = os.pipe()
    replies_read, replies_write = os.pipe()
    model = subprocess.Popen([sys.executable, "-I", "-S", "-c", cs.BOOTSTRAP], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(calls_read, replies_write))
    os.close(calls_read)
    os.close(replies_write)
    harness = cs.MODEL_HARNESS.encode()
    head = __import__("marshal").dumps((calls_read, replies_write, sys.path)).hex().encode()
    assert model.stdin is not None and model.stdout is not None
    model.stdin.write(f"{len(harness)}\n".encode() + harness + head + b"\n" + solution.encode())
    model.stdin.close()
    report = io.StringIO()
    job = {"prelude": prelude, "tests": tests, "functions": list(functions)}
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = report
    try:
        status = cs.check(42, job, cs.Calls(calls_write), cs.Replies(replies_read))
    finally:
        sys.stdout, sys.stderr = saved
        os.close(calls_write)
    model.wait(60)  # a hang guard: the harness has answered, it only exits
    return status, report.getvalue() + model.stdout.read().decode()


def test_right_code_passes_and_wrong_code_fails() -> None:
    right = "def add(a, b):\n    return a + b\n"
    assert run_sample(right, "assert add(1, 2) == 3\nassert add('a', 'b') == 'ab'\n", ("add",))[0] == 42
    status, said = run_sample("def add(a, b):\n    return a - b\n", "assert add(1, 2) == 3\n", ("add",))
    assert status == 1 and "AssertionError" in said


def test_an_argument_mutated_by_the_model_is_mutated_for_the_tests() -> None:
    solution = "def grow(xs, d, s):\n    xs.append(4)\n    d['k'] = 1\n    s.add(9)\n"
    tests = "xs, d, s = [1], {}, set()\ngrow(xs, d, s)\nassert xs == [1, 4] and d == {'k': 1} and s == {9}\n"
    assert run_sample(solution, tests, ("grow",))[0] == 42


def test_python_exceptions_cross_by_name_and_flow_changers_do_not() -> None:
    solution = "def f(x):\n    raise ValueError('bad ' + str(x))\ndef g():\n    raise StopIteration\n"
    tests = ("try:\n    f(1)\nexcept ValueError as e:\n    assert str(e) == 'bad 1'\nelse:\n    raise AssertionError\n"
             "try:\n    g()\nexcept StopIteration:\n    raise AssertionError('crossed')\nexcept Exception as e:\n"
             "    assert type(e).__name__ == 'ModelError'\n")
    assert run_sample(solution, tests, ("f", "g")) [0] == 42


def test_a_forged_value_is_refused_and_fails_the_call() -> None:
    solution = ("class Anything(float):\n    def __eq__(self, o):\n        return True\n"
                "def truncate(x):\n    return Anything(0)\n")
    status, said = run_sample(solution, "assert truncate(3.5) == 0.5\n", ("truncate",))
    assert status == 1 and "NotPlain" in said and "a subclass of float" in said, said


def test_what_the_tests_cannot_pass_across_fails_in_the_tests() -> None:
    status, said = run_sample("def apply(f, x):\n    return f(x)\n", "assert apply(lambda v: v + 1, 1) == 2\n",
                              ("apply",))
    assert status == 1 and "cannot cross" in said, said


def test_the_prompts_helpers_are_the_tests_own() -> None:
    prelude = "def helper(x):\n    return x * 2\n"
    solution = "def helper(x):\n    return 0\ndef solve(x):\n    return helper(x)\n"  # its own copy: wrong
    status, said = run_sample(solution, "assert helper(2) == 4\nassert solve(2) == 4\n", ("solve",), prelude)
    assert status == 1 and "line 2" in said, said  # the tests' helper held; the model's answer did not


def test_a_model_that_leaves_says_so() -> None:
    assert run_sample("import os\nos._exit(0)\n", "assert f(1)\n", ("f",))[0] == cs.LEFT
    status, said = run_sample("raise RuntimeError('boom')\n", "assert f(1)\n", ("f",))
    assert status == cs.LEFT and "did not load (RuntimeError: boom)" in said
