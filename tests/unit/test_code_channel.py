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


def test_a_forged_value_crosses_as_the_plain_value_it_holds_and_fails() -> None:
    # An object equal to everything is a float (or list) subclass: it crosses as the float it holds,
    # and the tests compare that.
    solution = ("class Anything(float):\n    def __eq__(self, o):\n        return True\n"
                "class Everything(list):\n    def __eq__(self, o):\n        return True\n"
                "def truncate(x):\n    return Anything(0)\n"
                "def items(x):\n    return Everything()\n")
    status, said = run_sample(solution, "assert truncate(3.5) == 0.5\n", ("truncate",))
    assert status == 1 and "AssertionError" in said, said
    status, said = run_sample(solution, "assert items(3) == [1, 2, 3]\n", ("items",))
    assert status == 1 and "AssertionError" in said, said
    # What is no plain value at all is still refused.
    status, said = run_sample("def f():\n    return object()\n", "assert f() is not None\n", ("f",))
    assert status == 1 and "NotPlain" in said and "type object" in said, said


@pytest.mark.parametrize(("returns", "tests"), [
    ("__import__('collections').Counter('aab')", "assert f() == {'a': 2, 'b': 1}"),
    ("__import__('collections').defaultdict(int, {'x': 1})", "assert f() == {'x': 1}"),
    ("__import__('collections').OrderedDict([(2, 'b'), (1, 'a')])", "assert f() == {1: 'a', 2: 'b'}"),
    ("__import__('collections').namedtuple('P', 'x y')(1, 2)", "assert f() == (1, 2)"),
    ("[__import__('collections').namedtuple('P', 'x y')(1, 2)]", "assert f() == [(1, 2)]"),
    ("__import__('enum').IntEnum('C', 'RED')(1)", "assert f() == 1"),
    ("__import__('enum').Enum('S', {'A': 'a'}, type=str)('a')", "assert f() == 'a'"),
    ("(i * 2 for i in range(3))", "assert tuple(f()) == (0, 2, 4)"),
    ("iter([[1], (j for j in 'ab')])", "a, b = f()\nassert a == [1] and list(b) == ['a', 'b']"),
    ("map(str, [1, 2])", "assert sorted(f()) == ['1', '2']"),
    ("__import__('itertools').count()", "g = f()\nassert (next(g), next(g), next(g)) == (0, 1, 2)"),
], ids=lambda v: v.split("(")[0][:40])
def test_values_cross_as_python_compares_them(returns: str, tests: str) -> None:
    # A subclass of a plain type crosses as that type; an iterator as a stand-in the tests iterate
    # through the channel: each test here passes in one process too.
    status, said = run_sample(f"def f():\n    return {returns}\n", tests + "\n", ("f",))
    assert status == 42, said
    exec(f"def f():\n    return {returns}\n{tests}\n", {})


@pytest.mark.parametrize("tests", [
    "assert f() == [0, 2, 4]", "assert f() == (0, 2, 4)", "assert len(f()) == 3",
])
def test_a_generator_is_no_list_as_in_one_process(tests: str) -> None:
    status, said = run_sample("def f():\n    return (i * 2 for i in range(3))\n", tests + "\n", ("f",))
    assert status == 1, said
    with pytest.raises((AssertionError, TypeError)):
        exec(f"def f():\n    return (i * 2 for i in range(3))\n{tests}\n", {})


def test_an_exception_in_a_generator_crosses_where_it_is_raised() -> None:
    solution = "def f():\n    yield 1\n    raise ValueError('second')\n"
    tests = "g = f()\nassert next(g) == 1\ntry:\n    next(g)\nexcept ValueError as e:\n    assert str(e) == 'second'\n"
    assert run_sample(solution, tests, ("f",))[0] == 42


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


# ---------------------------------------------------------------------- outcome-blind calls

LOGGING = """
calls = []
def f(x):
    print('call', repr(x), flush=True)
    return ANSWER
"""
ASSERTS = """
def check(candidate):
    assert candidate(1) == 1
    assert candidate([2]) == 1, 'second'
    for x in range(3, 5):
        assert candidate(x) == 1
    assert candidate('end') == 1
check(f)
"""


def _calls(said: str) -> list[str]:
    return [line for line in said.splitlines() if line.startswith("call ")]


@pytest.mark.parametrize("answer", ["1", "0", "None", "1 if x == 1 else 0", "1/0 if x == 1 else 1",
                                    "[][5] if x == 3 else 1"])
def test_the_calls_the_model_receives_do_not_depend_on_its_answers(answer: str) -> None:
    # The tests record a failed assert and go on: however the model answers, right, wrong or raising,
    # the same calls reach it in the same order, and only the end of the tests says pass or fail.
    right_status, right = run_sample(LOGGING.replace("ANSWER", "1"), ASSERTS, ("f",))
    status, said = run_sample(LOGGING.replace("ANSWER", answer), ASSERTS, ("f",))
    assert right_status == 42
    assert _calls(said) == _calls(right) == ["call 1", "call [2]", "call 3", "call 4", "call 'end'"]
    if answer != "1":
        assert status == 1, said


def test_the_report_is_the_first_failure_as_one_process_would_raise_it() -> None:
    status, said = run_sample(LOGGING.replace("ANSWER", "0 if x == [2] or x == 'end' else 1"), ASSERTS, ("f",))
    assert status == 1
    assert "line 4, in check" in said and "AssertionError: second" in said, said
    assert "1 more statement(s) of the tests failed" in said


def test_a_try_or_with_statement_of_the_tests_keeps_its_own_exceptions() -> None:
    solution = "def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return x\n"
    tests = ("import contextlib\n"
             "def check(candidate):\n"
             "    try:\n        candidate(-1)\n        assert False, 'no error'\n    except ValueError:\n        pass\n"
             "    with contextlib.suppress(ValueError):\n        candidate(-2)\n        assert False\n"
             "    assert candidate(3) == 3\n"
             "check(f)\n")
    assert run_sample(solution, tests, ("f",))[0] == 42
    status, said = run_sample("def f(x):\n    return x\n", tests, ("f",))
    assert status == 1 and "no error" in said, said


def test_going_on_changes_nothing_where_every_statement_succeeds() -> None:
    source = ("total = 0\n"
              "def add(v):\n    global total\n    assert v >= 0\n    total += v\n    return total\n"
              "for i in range(4):\n    if i % 2:\n        add(i)\n    else:\n        continue\n"
              "while total < 10:\n    add(3)\n    break\nelse:\n    total = -1\n")
    plain: dict = {}
    exec(source, plain)
    recorded: list = []
    rewritten: dict = {cs.RECORD: recorded.append}
    exec(cs.going_on(source), rewritten)
    assert recorded == [] and rewritten["total"] == plain["total"] == 7


# ---------------------------------------------------------------------- the wipe


def test_the_wipe_empties_a_tree_of_any_depth_without_recursion(tmp_path) -> None:
    top = tmp_path / "tmp"
    top.mkdir()
    here = os.open(top, os.O_RDONLY)
    try:
        # 3,000 folders deep: deeper than Python's recursion limit, and than PATH_MAX (4,096 bytes).
        fd = os.dup(here)
        for depth in range(3000):
            os.mkdir("ab", dir_fd=fd)
            if depth % 500 == 0:
                with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
                    f.write("x")
            inner = os.open("ab", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(fd)
    finally:
        os.close(here)
    (top / "locked").mkdir()
    (top / "locked" / "f").write_text("x")
    (top / "locked").chmod(0)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (top / "link").symlink_to(outside)
    cwd = os.getcwd()
    try:
        cs.remove_tree(str(top))
    finally:
        os.chdir(cwd)
    assert os.listdir(top) == []
    assert (outside / "keep").exists()  # a link is removed, never followed


def test_an_asserts_message_calls_the_model_whether_the_assert_holds_or_not() -> None:
    # HumanEval/78's asserts call the model again in their message: only on failure, in one process.
    tests = "assert f(1) == 1, 'wrong: ' + str(f(1))\nassert f(2) == 1, 'wrong: ' + str(f(2))\n"
    right_status, right = run_sample("def f(x):\n    print('call', x, flush=True)\n    return 1\n", tests, ("f",))
    status, said = run_sample("def f(x):\n    print('call', x, flush=True)\n    return x\n", tests, ("f",))
    assert right_status == 42 and status == 1
    assert _calls(said) == _calls(right) == ["call 1", "call 1", "call 2", "call 2"]
    assert "AssertionError: wrong: 2" in said and "line 2" in said, said
    # A message that raises matters only where its assert fails, as in one process.
    raising = "assert f(1) == 1, 1 / 0\n"
    assert run_sample("def f(x):\n    return 1\n", raising, ("f",))[0] == 42
    status, said = run_sample("def f(x):\n    return 0\n", raising, ("f",))
    assert status == 1 and "ZeroDivisionError" in said, said
