"""Build the offline assets a new user needs: a tiny model, a raw dataset and two tiny benchmarks.

    <toolchain python> build_assets.py ASSETS_DIR [--force]

A standalone script run by the fine-tuning toolchain's interpreter (it imports torch, tokenizers and
transformers); the services never import it, they call ``ftbus.assets.build_assets``. Nothing is
downloaded: the tokenizer is trained here and the model is randomly initialised with a fixed seed,
so the whole pipeline (data -> train -> benchmark) runs on a machine without network or GPU.

Layout written under ASSETS_DIR (each folder built in a temporary sibling, then renamed into place,
and skipped when its stamp matches this script's hash, so re-running is cheap and never leaves half
an asset behind):

    models/tiny-llama/            LlamaForCausalLM (hidden 64, 2 layers, 4 heads) + tokenizer.json
                                  + ftbus_inference.yaml (greedy)
    datasets/tiny-qa/raw.jsonl    synthetic {id, kind, question, answer} records
    datasets/tiny-reviews/raw.jsonl   synthetic restaurant and film reviews labelled positive/negative
    datasets/grade-school-arith/raw.jsonl   synthetic word problems in GSM8K's format {id, question, answer}
    benchmarks/tiny-arith/        benchmark.yaml (generate_until, exact_match) + one jsonl per subset
    benchmarks/tiny-arith-mc/     benchmark.yaml (multiple_choice, acc) + one jsonl per subset
    benchmarks/tiny-sentiment/    benchmark.yaml (generate_until, exact_match): "positive" or "negative"
    benchmarks/gsm8k-synth/       benchmark.yaml (generate_until, scorer gsm8k, strict_match): held out
                                  of grade-school-arith (examples/gsm8k learns it in under a minute)
    benchmarks/README.md          the registry folder format
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

STAMP = ".ftbus-asset.json"
SEED = 20261130

# LlamaFactory's `default` template (llamafactory/data/template.py, 0.9.5), as its own
# Template._get_jinja_template renders it: the model then chats the way `template: default` trains
# it, and lm-eval's --apply_chat_template produces the same prompt as training did.
DEFAULT_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% if system_message is defined %}{{ 'System: ' + system_message + '</s>' + '\n' }}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'user' %}"
    "{{ 'Human: ' + content + '</s>' + '\nAssistant:' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ content + '</s>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
LM_HEAD_STD = 0.5

BENCHMARKS_README = """\
# Benchmark registry

One folder per benchmark, named like the benchmark: `benchmarks/<name>/`.

`benchmark.yaml`:

```yaml
name: tiny-arith              # must equal the folder name
version: 1                    # bump when items change: split manifests and caches key on it
description: free text shown to the judge
kind: generate_until          # or multiple_choice
primary_metric: exact_match   # generate_until: exact_match; multiple_choice: acc or acc_norm
higher_is_better: true
subsets:                      # evaluated and reported one by one
  - {name: addition, file: addition.jsonl}
generation: {max_gen_toks: 16, until: ["\\n"]}   # optional, generate_until only
```

Each subset file is JSON Lines, one item a line: `{"id": str, "question": str, "answer": str}`;
multiple_choice items add `"choices": [str, ...]` and `answer` is the text of the right choice.
Ids are unique within a subset. Items keep their file order: the validation split is the first
min(max_items, n//2) items of each subset, the hidden test split the last min(max_items, n//2).
"""


# ------------------------------------------------------------------ helpers


def _script_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _make_readable(root: Path) -> None:
    """mkdtemp makes 0700 folders and safetensors writes 0600 files: assets are mounted read-only
    into containers that run as another user, so everything must be world-readable."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _build(dest: Path, builder: Callable[[Path], None], force: bool) -> bool:
    """Run ``builder`` into a temporary sibling of ``dest`` and swap it in. False if up to date."""
    stamp = dest / STAMP
    want = {"builder_sha256": _script_hash()}
    if not force and stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == want:
                return False
        except json.JSONDecodeError:
            pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        builder(tmp)
        (tmp / STAMP).write_text(json.dumps(want))
        _make_readable(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return True


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
#: The tiny model is evaluated greedily: its scores are the same run to run (docs/benchmarks.md).
TINY_INFERENCE = "# Sampling of this model in benchmarks (evaluation/inference.py).\ngreedy: true\n"


def build_gsm8k_synth(dest: Path, subsets: dict[str, list[dict[str, str]]]) -> None:
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "benchmark.yaml").write_text(yaml.safe_dump(GSM8K_SYNTH, sort_keys=False, allow_unicode=True))
    for subset, items in subsets.items():
        _write_jsonl(dest / f"{subset}.jsonl", items)


# ------------------------------------------------------------------ builders


def build_tiny_model(dest: Path, corpus: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE over the full byte alphabet: any text encodes, nothing maps to <unk>.
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=1024,
        padding_side="right",
    )
    fast.chat_template = DEFAULT_CHAT_TEMPLATE
    fast.save_pretrained(dest)

    save_llama(fast, dest)


def save_llama(tokenizer: Any, dest: Path, *, hidden: int = 64, heads: int = 4, layers: int = 2) -> None:
    """A randomly initialised Llama for ``tokenizer`` (fixed seed), saved as safetensors in ``dest``.

    The defaults are the tiny model's; deploy/gpu/build_model.py asks for wider heads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # A pretrained model's output layer can make one token far likelier than the rest; a freshly
    # initialised one (std 0.02) cannot: after the final RMSNorm its logits stay within about +-1.3,
    # so no amount of LoRA training (which leaves lm_head alone) gets the loss below ~6. A wider
    # output layer gives the tiny model the dynamic range of a real one.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, LM_HEAD_STD)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)


def build_dataset(dest: Path, records: list[dict[str, str]], readme: str = "") -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _write_jsonl(dest / "raw.jsonl", records)
    (dest / "README.md").write_text(readme or (
        "# tiny-qa\n\nSynthetic question/answer records (addition, subtraction, parity, successor),\n"
        "one JSON object a line in `raw.jsonl`: `{id, kind, question, answer}`. None of the\n"
        "questions appears in the tiny-arith benchmarks. Built by ftbus/toolchain/build_assets.py.\n"
    ))


REVIEWS_README = (
    "# tiny-reviews\n\nSynthetic restaurant (`food`) and film (`films`) reviews, one JSON object a line in\n"
    "`raw.jsonl`: `{id, kind: sentiment, domain, question, answer}`, answer `positive` or `negative`.\n"
    "None of the questions appears in the tiny-sentiment benchmark. Built by ftbus/toolchain/build_assets.py.\n"
)
BENCH_DESCRIPTIONS = {
    "tiny-sentiment": "Is a short restaurant or film review positive or negative? Exact match (synthetic).",
}


def build_benchmark(dest: Path, name: str, subsets: dict[str, list[dict[str, Any]]]) -> None:
    import yaml  # comes with the toolchain (transformers, LlamaFactory)

    dest.mkdir(parents=True, exist_ok=True)
    mc = any("choices" in item for items in subsets.values() for item in items)
    spec: dict[str, Any] = {
        "name": name,
        "version": 1,
        "description": BENCH_DESCRIPTIONS.get(name) or (
            "Tiny multiple-choice arithmetic and parity questions (synthetic, for tests and demos)."
            if mc else "Tiny addition and subtraction questions, answered by exact match (synthetic)."
        ),
        "kind": "multiple_choice" if mc else "generate_until",
        "primary_metric": "acc" if mc else "exact_match",
        "higher_is_better": True,
        "subsets": [{"name": s, "file": f"{s}.jsonl"} for s in subsets],
    }
    if not mc:
        spec["generation"] = {"max_gen_toks": 16, "until": ["\n"]}
    (dest / "benchmark.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    for subset, items in subsets.items():
        _write_jsonl(dest / f"{subset}.jsonl", items)


def build_all(assets: Path, force: bool = False) -> list[str]:
    """Build every asset under ``assets``; return a line per asset saying built or up to date."""
    report: list[str] = []
    benches = benchmark_items()
    bench_questions = {i["question"] for subsets in benches.values() for items in subsets.values() for i in items}
    records = dataset_records(bench_questions)
    sentiment = sentiment_items()
    reviews = review_records({i["question"] for items in sentiment.values() for i in items})
    benches["tiny-sentiment"] = sentiment
    corpus = [f"{r['question']} {r['answer']}" for r in records] + [
        f"{i['question']} {i['answer']}" for s in benches.values() for items in s.values() for i in items
    ] + ["Human: Assistant: System: even odd What is comes after number"] * 8
    corpus += [f"{r['question']} {r['answer']}" for r in reviews]
    # Every number up to 1999, so that BPE has enough to merge to its ~2000-token vocabulary.
    corpus += [" ".join(str(k) for k in range(start, start + 100)) for start in range(0, 2000, 100)] * 4

    steps: list[tuple[Path, Callable[[Path], None]]] = [
        (assets / "models" / "tiny-llama", lambda d: build_tiny_model(d, corpus)),
        (assets / "datasets" / "tiny-qa", lambda d: build_dataset(d, records)),
        (assets / "datasets" / "tiny-reviews", lambda d: build_dataset(d, reviews, REVIEWS_README)),
    ]
    for name, subsets in benches.items():
        steps.append((assets / "benchmarks" / name,
                      lambda d, name=name, subsets=subsets: build_benchmark(d, name, subsets)))
    grade_school, grade_school_records = grade_school_items()
    steps += [
        (assets / "datasets" / "grade-school-arith",
         lambda d: build_dataset(d, grade_school_records, GRADE_SCHOOL_README)),
        (assets / "benchmarks" / "gsm8k-synth", lambda d: build_gsm8k_synth(d, grade_school)),
    ]
    for dest, builder in steps:
        built = _build(dest, builder, force)
        report.append(f"{'built' if built else 'up to date'}: {dest}")
    inference = assets / "models" / "tiny-llama" / "ftbus_inference.yaml"
    if not inference.is_file() or inference.read_text() != TINY_INFERENCE:
        inference.write_text(TINY_INFERENCE)
    readme = assets / "benchmarks" / "README.md"
    if force or not readme.is_file() or readme.read_text() != BENCHMARKS_README:
        readme.write_text(BENCHMARKS_README)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assets_dir", type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    for line in build_all(args.assets_dir.resolve(), force=args.force):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
