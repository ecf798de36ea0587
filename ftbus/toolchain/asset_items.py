"""What the offline assets hold: the synthetic items of the tiny benchmarks and the records of the
raw datasets, deterministic from one seed, with no dependency beyond the standard library.

Written out by build_assets.py (the same standalone script run by the toolchain's interpreter), whose
stamp hashes this file too: a change here rebuilds the assets.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

SEED = 20261130

# ------------------------------------------------------------------ synthetic items


def _arith_item(rng: random.Random, op: str) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if op == "+":
        return f"What is {a} + {b}?", str(a + b)
    a, b = max(a, b), min(a, b)  # keep answers non-negative: fewer tokens, easier to learn
    return f"What is {a} - {b}?", str(a - b)


def _unique_items(rng: random.Random, make: Callable[[], tuple[str, str]], n: int,
                  exclude: set[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen = set(exclude)
    while len(out) < n:
        q, a = make()
        if q not in seen:
            seen.add(q)
            out.append((q, a))
    return out


def benchmark_items() -> dict[str, dict[str, list[dict[str, Any]]]]:
    """benchmark -> subset -> items. Fixed seed: the same items on every machine."""
    rng = random.Random(SEED)
    arith = {
        "addition": _unique_items(rng, lambda: _arith_item(rng, "+"), 40, set()),
        "subtraction": _unique_items(rng, lambda: _arith_item(rng, "-"), 40, set()),
    }
    tiny_arith = {
        subset: [{"id": f"{subset[:3]}-{i:03d}", "question": q, "answer": a} for i, (q, a) in enumerate(items)]
        for subset, items in arith.items()
    }

    def mc_sum() -> dict[str, Any]:
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        right = a + b
        wrong = sorted({right + d for d in (-10, -1, 1, 10) if right + d >= 0})
        choices = [str(right), *(str(w) for w in rng.sample(wrong, 3))]
        rng.shuffle(choices)
        return {"question": f"What is {a} + {b}?", "choices": choices, "answer": str(right)}

    def mc_parity() -> dict[str, Any]:
        n = rng.randint(0, 999)
        return {"question": f"Is {n} even or odd?", "choices": ["even", "odd"],
                "answer": "even" if n % 2 == 0 else "odd"}

    mc: dict[str, list[dict[str, Any]]] = {}
    for subset, make in (("sum_choice", mc_sum), ("parity", mc_parity)):
        seen: set[str] = set()
        rows: list[dict[str, Any]] = []
        while len(rows) < 40:
            item = make()
            if item["question"] not in seen:
                seen.add(item["question"])
                rows.append({"id": f"{subset}-{len(rows):03d}", **item})
        mc[subset] = rows
    return {"tiny-arith": tiny_arith, "tiny-arith-mc": mc}


def dataset_records(exclude_questions: set[str], n: int = 400) -> list[dict[str, str]]:
    """Training records; benchmark questions are excluded so the benchmark measures generalisation."""
    rng = random.Random(SEED + 1)
    rows: list[dict[str, str]] = []
    seen = set(exclude_questions)
    kinds = ["addition", "subtraction", "parity", "successor"]
    while len(rows) < n:
        kind = kinds[len(rows) % len(kinds)]
        if kind == "addition":
            q, a = _arith_item(rng, "+")
        elif kind == "subtraction":
            q, a = _arith_item(rng, "-")
        elif kind == "parity":
            k = rng.randint(0, 999)
            q, a = f"Is {k} even or odd?", "even" if k % 2 == 0 else "odd"
        else:
            k = rng.randint(0, 998)
            q, a = f"What number comes after {k}?", str(k + 1)
        if q in seen:
            continue
        seen.add(q)
        rows.append({"id": f"qa-{len(rows):04d}", "kind": kind, "question": q, "answer": a})
    return rows


# ------------------------------------------------------------------ reviews (the demo's task)
#
# The random tiny model cannot answer arithmetic after a minute of CPU training, so both it and any
# candidate score 0 on tiny-arith. Sentiment of a short review is what such a model *can* learn in a
# minute: the answer is one of two words (the untrained model never produces either), and the label
# follows from the review's adjectives, whose combinations in the benchmark never occur in training.

POSITIVE = ["delicious", "wonderful", "excellent", "lovely", "superb", "tasty", "friendly", "brilliant",
            "delightful", "fantastic", "charming", "perfect", "pleasant", "amazing", "marvellous", "great"]
NEGATIVE = ["awful", "terrible", "horrible", "dreadful", "bland", "rude", "boring", "disgusting",
            "stale", "nasty", "dull", "soggy", "miserable", "poor", "lousy", "tedious"]
REVIEW_TEMPLATES = {
    "food": ["The {noun} was {a} and the staff were {b}.", "What a {a} {noun}, and such {b} service.",
             "Our {noun} tasted {a}; the waiter was {b}."],
    "films": ["The {noun} was {a} and the ending {b}.", "A {a} {noun} with {b} acting.",
              "This {noun} felt {a}, the music {b}."],
}
REVIEW_NOUNS = {
    "food": ["soup", "pizza", "curry", "salad", "burger", "pasta", "dessert", "breakfast", "lunch", "dinner"],
    "films": ["film", "movie", "thriller", "comedy", "drama", "western", "cartoon", "sequel", "musical", "story"],
}
REVIEW_QUESTION = "Review: {text} Is this review positive or negative?"


def _review(rng: random.Random, domain: str) -> tuple[str, str]:
    label = rng.choice(["positive", "negative"])
    words = POSITIVE if label == "positive" else NEGATIVE
    a, b = rng.sample(words, 2)
    text = rng.choice(REVIEW_TEMPLATES[domain]).format(noun=rng.choice(REVIEW_NOUNS[domain]), a=a, b=b)
    return REVIEW_QUESTION.format(text=text), label


def sentiment_items() -> dict[str, list[dict[str, Any]]]:
    """The tiny-sentiment benchmark: subset -> items, 40 per subset (20 validation, 20 test)."""
    rng = random.Random(SEED + 2)
    return {
        domain: [{"id": f"{domain}-{i:03d}", "question": q, "answer": a}
                 for i, (q, a) in enumerate(_unique_items(rng, lambda d=domain: _review(rng, d), 40, set()))]
        for domain in REVIEW_TEMPLATES
    }


#: tiny-sentiment's split size (benchmark.yaml ``split_size``): 20 validation and 20 test items a subset,
#: and the items between them its hidden confirmation pool.
SENTIMENT_SPLIT = 20
#: Pool items per subset, placed between the validation and the test items.
SENTIMENT_POOL = 60


def with_sentiment_pool(items: dict[str, list[dict[str, Any]]], exclude_questions: set[str],
                        ) -> dict[str, list[dict[str, Any]]]:
    """tiny-sentiment with its confirmation pool: each subset's first 20 items (validation) and last
    20 (test) as :func:`sentiment_items` made them, and 60 new reviews between them, none of them a
    benchmark or training question (so the tokenizer, the training data and both splits stay as
    they were, and no candidate trained on a pool item)."""
    rng = random.Random(SEED + 5)
    seen = set(exclude_questions) | {i["question"] for subset in items.values() for i in subset}
    out: dict[str, list[dict[str, Any]]] = {}
    for domain, subset in items.items():
        fresh = _unique_items(rng, lambda d=domain: _review(rng, d), SENTIMENT_POOL, seen)
        seen |= {q for q, _ in fresh}
        pool = [{"id": f"{domain}-{len(subset) + j:03d}", "question": q, "answer": a} for j, (q, a) in enumerate(fresh)]
        out[domain] = [*subset[:SENTIMENT_SPLIT], *pool, *subset[SENTIMENT_SPLIT:]]
    return out


def review_records(exclude_questions: set[str], n: int = 600) -> list[dict[str, str]]:
    """Training reviews for tiny-reviews; benchmark questions are excluded."""
    rng = random.Random(SEED + 3)
    rows: list[dict[str, str]] = []
    seen = set(exclude_questions)
    domains = list(REVIEW_TEMPLATES)
    while len(rows) < n:
        domain = domains[len(rows) % len(domains)]
        q, a = _review(rng, domain)
        if q in seen:
            continue
        seen.add(q)
        rows.append({"id": f"rv-{len(rows):04d}", "kind": "sentiment", "domain": domain, "question": q, "answer": a})
    return rows


# ------------------------------------------------------------------ grade-school arithmetic, in GSM8K's format
#
# The gsm8k-synth benchmark and the grade-school-arith dataset come from one generator, in GSM8K's
# own schema (`question`, and an `answer` that works the problem out and ends in `#### <number>`),
# scored by the real GSM8K scorer. What a tiny model can learn in a minute is reading a number
# written as a word: each problem names a quantity in words ("seven apples") that the story leaves
# unchanged, and the answer restates it in digits. The benchmark's questions (names, objects,
# stories) never occur in the training data. Measured (2 CPU cores): a full fine-tune of tiny-llama,
# 300 steps of 8 (examples/gsm8k, ~50 s), takes strict match from 0 to 0.90 on the validation half
# and 0.95 on all 40; LoRA (rank 8, which leaves embeddings and output layer alone) gets ~0.2.

NUMBER_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
ARITH_NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jack", "Kira", "Liam",
               "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara"]
ARITH_OBJECTS = ["apples", "pencils", "marbles", "stickers", "books", "cookies", "shells", "stamps", "coins",
                 "cards", "balloons", "buttons"]
ARITH_STORIES = [
    ("{name} has {word} {obj} and gives none of them away. How many {obj} does {name} have now?",
     "{name} gave none away, so {name} still has {n} {obj}."),
    ("{name} buys {word} {obj}. Later {name} loses zero {obj}. How many {obj} are left?",
     "Nothing was lost, so {n} {obj} are left."),
    ("There are {word} {obj} in {name}'s bag, and nobody takes any. How many {obj} are in the bag?",
     "Nobody took any, so the bag holds {n} {obj}."),
]


def _arith_problem(rng: random.Random, names: list[str], objects: list[str]) -> dict[str, str]:
    n = rng.randint(1, len(NUMBER_WORDS))
    question, working = rng.choice(ARITH_STORIES)
    name, obj = rng.choice(names), rng.choice(objects)
    values = {"name": name, "obj": obj, "word": NUMBER_WORDS[n - 1], "n": n}
    return {"question": question.format(**values), "answer": f"{working.format(**values)}\n#### {n}"}


def grade_school_items() -> tuple[dict[str, list[dict[str, str]]], list[dict[str, str]]]:
    """The gsm8k-synth benchmark (40 items: 20 validation, 20 test) and 600 training records; the
    benchmark's names and objects are held out of the training records, so no question repeats."""
    rng = random.Random(SEED + 4)
    held_names, held_objects = ARITH_NAMES[:5], ARITH_OBJECTS[:3]
    train_names, train_objects = ARITH_NAMES[5:], ARITH_OBJECTS[3:]
    bench = [{"id": f"gs-{i:03d}", **p}
             for i, p in enumerate(_unique(rng, lambda: _arith_problem(rng, held_names, held_objects), 40))]
    train = [{"id": f"ga-{i:04d}", **p}
             for i, p in enumerate(_unique(rng, lambda: _arith_problem(rng, train_names, train_objects), 600))]
    return {"word_numbers": bench}, train


def _unique(rng: random.Random, make: Callable[[], dict[str, str]], n: int) -> list[dict[str, str]]:
    seen: set[str] = set()
    out = []
    while len(out) < n:
        problem = make()
        if problem["question"] not in seen:
            seen.add(problem["question"])
            out.append(problem)
    return out


GRADE_SCHOOL_README = (
    "# grade-school-arith\n\nSynthetic grade-school word problems in GSM8K's own format, one JSON object a line in\n"
    "`raw.jsonl`: `{id, question, answer}`, the answer worked out and ending in `#### <number>`. The\n"
    "gsm8k-synth benchmark comes from the same generator, with names and objects held out of these\n"
    "records. Built by ftbus/toolchain/build_assets.py.\n"
)
GSM8K_SYNTH = {
    "name": "gsm8k-synth", "version": 1,
    "description": "Synthetic grade-school word problems in GSM8K's format, scored by the GSM8K scorer.",
    "source": "synthetic (ftbus/toolchain/build_assets.py), GSM8K's schema",
    "kind": "generate_until", "scorer": "gsm8k", "primary_metric": "strict_match", "higher_is_better": True,
    "prompt": "Question: {{question}}\nAnswer:",
    "generation": {"max_gen_toks": 48, "until": ["Question:", "\n\n"]},
    "subsets": [{"name": "word_numbers", "file": "word_numbers.jsonl"}],
}
