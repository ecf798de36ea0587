"""Turn a model's generated text into metrics, the way the field scores it.

Each scorer reads the text lm-eval generated for one item (after ``<think>`` blocks are removed)
and returns its metrics (the names are registry.SCORER_METRICS'), each 0.0..1.0:

- ``gsm8k``: lm-eval's gsm8k filters, exactly: ``strict_match`` (the number after ``#### ``) and
  ``flexible_match`` (the last number-looking token), compared after lm-eval's normalisation;
- ``math`` (MATH, AIME): ``math_verify``, the last ``\\boxed{}`` answer (else math-verify's own
  extraction) checked symbolically against the gold by the math-verify library;
- ``choice``: ``letter_acc``, the choice letter the model wrote (MMLU generated answers);
- ``numeric``: ``numeric_match``, the last number within a relative 1e-6 of the gold number;
- ``f1``: SQuAD's token F1; ``rouge_l``: ROUGE-L's LCS F-measure (beta 1).

``exact`` and ``loglik`` are lm-eval's own, ``code`` is the code executor's, ``llm`` is
answer_check.py's: :func:`score_text` refuses them.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import string
from collections import Counter

from evaluation.registry import BenchmarkItem

TEXT_SCORERS = frozenset({"gsm8k", "math", "choice", "numeric", "f1", "rouge_l"})
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# ------------------------------------------------------------------ reasoning models

_THINK_CLOSE = "</think>"


def strip_think(text: str, *, keep_indent: bool = False) -> str:
    """The answer without the reasoning: everything up to the last ``</think>`` goes.

    An opened ``<think>`` that never closes means the model was still thinking when it stopped
    (usually its token budget): there is no answer, so the result is "" rather than the thinking,
    which would otherwise be scored (a number in the reasoning would count as the answer).
    ``keep_indent``: only blank lines go from the start, not the first line's indentation (a
    HumanEval completion continues a function's body: its leading spaces are code).
    """
    end = text.rfind(_THINK_CLOSE)
    if end >= 0:
        text = text[end + len(_THINK_CLOSE):]
    elif "<think>" in text:
        return ""
    if keep_indent:
        return re.sub(r"\A(?:[ \t]*\r?\n)+", "", text).rstrip()
    return text.strip()


# ------------------------------------------------------------------ gsm8k (lm-eval's filters)

# lm-eval tasks/gsm8k/gsm8k.yaml: "strict-match" and "flexible-extract", verbatim.
_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
# The exact_match metric's regexes_to_ignore (applied in this order, to both sides) and ignore_case.
_GSM8K_IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]
_INVALID = "[invalid]"  # lm-eval's RegexFilter fallback: never equals a gold number
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def gsm8k_strict(text: str) -> str | None:
    """The first ``#### <number>`` (lm-eval: regex, then take_first)."""
    match = _GSM8K_STRICT.search(text)
    return match.group(1).strip() if match else None


def gsm8k_flexible(text: str) -> str | None:
    """The last number-looking token (lm-eval: group_select -1, the first non-empty group)."""
    found = _GSM8K_FLEXIBLE.findall(text)
    if not found:
        return None
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else None


def gsm8k_normalise(text: str) -> str:
    """lm-eval's exact_match normalisation for gsm8k: drop ``,`` ``$``, anything up to ``#### ``,
    a trailing ``.``; then lower case."""
    for pattern in _GSM8K_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower()


def gsm8k_gold(answer: str) -> str:
    """The gold number: what follows ``####`` in GSM8K's answer field, or the bare answer
    (lm-eval's doc_to_target: ``answer.split('####')[-1].strip()``)."""
    return answer.split("####")[-1].strip()


def score_gsm8k(output: str, answer: str) -> dict[str, float]:
    gold = gsm8k_normalise(gsm8k_gold(answer))

    def hit(extracted: str | None) -> float:
        return float(gsm8k_normalise(extracted or _INVALID) == gold)

    return {"strict_match": hit(gsm8k_strict(output)), "flexible_match": hit(gsm8k_flexible(output))}


# ------------------------------------------------------------------ math (math-verify)

# Boxed answers first (priority 0), the last one first (math-verify tries the rightmost match of a
# priority first); then math-verify's own "final answer is" and plain-expression extraction.


@functools.cache
def _math_config() -> tuple[object, ...]:
    # math-verify (and sympy under it) is imported on first use: half a second that every CLI
    # command and every worker would otherwise pay at start (they import the pipeline's stages).
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

# math-verify's timeouts are signal.alarm(): in any thread but the main one they do not time out,
# they raise ValueError ("signal only works in main thread"), from parse and verify alike, and the
# benchmark stage scores in a worker thread (asyncio.to_thread). In the main thread they would
# replace the process's SIGALRM handler and cancel any pending alarm (pytest-timeout's, say). So
# they are off (None) everywhere: a pathological expression is bounded by the stage's own timeout.
_NO_TIMEOUT = None


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off: here that is deliberate (above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


_BOXED = "\\boxed{"
_BOXED_SPACE = "\\boxed "


def last_boxed(text: str) -> str | None:
    """The last boxed answer of ``text``, as minerva finds it (lm-eval's ``last_boxed_only_string``),
    written ``\\boxed{...}``; None when there is none (or it is cut off unclosed).

    As minerva: ``\\boxed 5`` (a space, no braces) wins wherever it is, and runs to the next ``$``;
    else the last ``\\boxed{...}`` (braces matched); else the last ``\\fbox{...}``."""
    content = boxed_content(text)
    return None if content is None else _BOXED + content + "}"


def boxed_content(text: str) -> str | None:
    """What the last box of ``text`` holds (see :func:`last_boxed`), or None."""
    if _BOXED_SPACE in text:
        return text.split(_BOXED_SPACE)[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    opened = text.find("{", start)
    if opened < 0:
        return None
    depth = 0
    for end in range(opened, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[opened + 1:end]
    return None


def math_parse(text: str) -> list[object]:
    """math-verify's parse of the last ``\\boxed{}``, else of the whole text: ``[sympy expression,
    the text it came from]``, or [] when nothing parses.

    The last box alone, because math-verify by itself reads boxes joined by "," or "and" (and a
    greedy ``\\boxed{.+}`` spanning several) as one set-valued answer: "\\boxed{3}, then
    \\boxed{7}" would be {3, 7}, not the 7 the model settled on.
    """
    from math_verify import parse

    boxed = last_boxed(text)
    if boxed is not None:
        parsed = parse(boxed, extraction_config=_math_config(), parsing_timeout=_NO_TIMEOUT)
        if parsed:
            return list(parsed)
    return list(parse(text, extraction_config=_math_config(), parsing_timeout=_NO_TIMEOUT))


def score_math(output: str, answer: str, answer_range: tuple[int, int] | None = None) -> dict[str, float]:
    """``math_verify``; with ``answer_range`` (AIME's 0-999) the answer must also be written as an
    integer in that range: "\\frac{10}{2}" equals 5, but it is no AIME answer."""
    from math_verify import verify

    gold = math_parse(answer)
    predicted = math_parse(output)
    if not gold or not predicted:
        return {"math_verify": 0.0}
    if answer_range is not None and not in_integer_range(str(predicted[-1]), answer_range):
        return {"math_verify": 0.0}
    # verify is not symmetric: the gold comes first.
    return {"math_verify": float(verify(gold, predicted, timeout_seconds=_NO_TIMEOUT))}


def in_integer_range(answer: str, answer_range: tuple[int, int]) -> bool:
    """Whether ``answer`` (an extracted final answer) is written as an integer within the range."""
    text = answer.strip().strip("$").strip()
    low, high = answer_range
    return re.fullmatch(r"[0-9]+", text) is not None and low <= int(text) <= high


def math_extracted(output: str) -> str | None:
    """The text math-verify took as the answer (the second element of parse's result)."""
    parsed = math_parse(output)
    if not parsed:
        return None
    return str(parsed[-1])


# ------------------------------------------------------------------ choice letters (MMLU generated)

# "answer is (B)", "Answer: D.", "The correct answer is **C**", "answer: $\boxed{A}$", "answer is option B":
# "answer", a few filler words, decorations, then one capital letter that does not start a word. Only
# "answer" anchors it: "Option D is wrong" at the end must not outrank an earlier "the answer is B".
_EXPLICIT = re.compile(
    r"(?i:answer)"
    r"(?:\s+(?i:is|would|will|should|be|the|correct|final|option|choice|letter))*"
    r"\s*[:=\-]?\s*"
    r"(?:\*\*|\*|\$|\\boxed\{|\\text\{|\\textbf\{|[(\[{])*\s*"
    r"([A-Z])(?![A-Za-z'])"
)
# A letter alone at the start: "B", "**C**", "(A) because ...", "D. Paris", "C\nThe reason".
# Not "A cat ..." (an article): after the letter comes an end, a bracket or punctuation, not a word.
_LEADING = re.compile(r"^(?:\*\*|\*|[(\[])*\s*([A-Z])\s*(?:\*\*|\*|[)\]])*\s*(?:$|[.:,)\n])")
_STANDALONE = re.compile(r"(?<![A-Za-z'])([A-Z])(?![A-Za-z'])")


def extract_choice_letter(text: str, n_choices: int) -> int | None:
    """The index of the choice the text names (A is 0), among the first ``n_choices`` letters.

    In order of trust: the last explicit "answer is X" / "Answer: X"; else a lone letter that opens
    the text; else the last standalone capital letter in range. None when there is no such letter.
    """
    allowed = LETTERS[: max(0, min(n_choices, len(LETTERS)))]
    text = text.strip()

    def in_range(letters: list[str]) -> list[str]:
        return [letter for letter in letters if letter in allowed]

    explicit = in_range(_EXPLICIT.findall(text))
    if explicit:
        return allowed.index(explicit[-1])
    leading = _LEADING.match(text)
    if leading and leading.group(1) in allowed:
        return allowed.index(leading.group(1))
    standalone = in_range(_STANDALONE.findall(text))
    if standalone:
        return allowed.index(standalone[-1])
    return None


def score_choice(output: str, item: BenchmarkItem) -> dict[str, float]:
    if not item.choices or item.answer not in item.choices:
        raise ValueError(f"item {item.id}: the choice scorer needs choices that contain the answer")
    picked = extract_choice_letter(output, len(item.choices))
    return {"letter_acc": float(picked == item.choices.index(item.answer))}


# ------------------------------------------------------------------ exact, numeric

def normalise_exact(text: str) -> str:
    """Stripped, casefolded, whitespace collapsed to single spaces."""
    return " ".join(text.casefold().split())


def exact_match(output: str, gold: str) -> float:
    return float(normalise_exact(output) == normalise_exact(gold))


# A number as people write it: optional sign and $, thousands commas, decimals, an exponent.
_NUMBER = re.compile(r"[-+]?\$?[-+]?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
NUMERIC_REL_TOL = 1e-6


def to_number(text: str) -> float | None:
    """``text`` as a finite number (``$`` and ``,`` ignored, a trailing ``.`` allowed), else None."""
    cleaned = text.strip().replace("$", "").replace(",", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def score_numeric(output: str, answer: str) -> dict[str, float]:
    gold = to_number(answer)
    found = last_number(output)
    value = to_number(found) if found is not None else None
    if gold is None or value is None:
        return {"numeric_match": 0.0}
    return {"numeric_match": float(math.isclose(value, gold, rel_tol=NUMERIC_REL_TOL))}


# ------------------------------------------------------------------ f1 (SQuAD), rouge_l

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def squad_tokens(text: str) -> list[str]:
    """SQuAD's normalize_answer, split: lower case, no punctuation, no articles, whitespace tokens."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return _ARTICLES.sub(" ", text).split()


def token_f1(output: str, gold: str) -> float:
    predicted, reference = squad_tokens(output), squad_tokens(gold)
    if not predicted or not reference:
        return float(predicted == reference)  # SQuAD v2: both empty is a match
    same = sum((Counter(predicted) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(reference)
    return 2 * precision * recall / (precision + recall)


def _lcs_length(a: list[str], b: list[str]) -> int:
    # One row of the dynamic programme at a time: O(len(a) * len(b)) time, O(len(b)) memory.
    previous = [0] * (len(b) + 1)
    for token in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if token == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(output: str, gold: str) -> float:
    """ROUGE-L F-measure (beta 1) over whitespace tokens, compared casefolded."""
    predicted, reference = output.casefold().split(), gold.casefold().split()
    if not predicted or not reference:
        return float(predicted == reference)
    lcs = _lcs_length(predicted, reference)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(predicted), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


# ------------------------------------------------------------------ short answers (the llm scorer)

#: The longest answer an LLM answer check is shown (answer_check.py): a final answer, not an essay.
SHORT_ANSWER_CHARS = 200
# "The answer is Paris.", "Final answer: 42", "**Answer:** x = 3": the last such line's rest.
_ANSWER_MARKER = re.compile(r"(?i:\banswer\b)(?:\s+is)?\s*[:=]?\s*(?:\*\*)?\s*(.+?)\s*$", re.MULTILINE)


def short_answer(text: str) -> str | None:
    """The final answer of a free-form output, for the ``llm`` scorer's check; None when none is found.

    The last ``\\boxed{}``'s contents, else what follows the last "answer is" / "Answer:", else the
    whole text when it is short (at most SHORT_ANSWER_CHARS): an answer given bare. A long text with
    neither is reasoning without a stated answer, and no checker is shown it.
    """
    text = text.strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed[len(_BOXED):-1].strip() or None
    marked = _ANSWER_MARKER.findall(text)
    if marked:
        return marked[-1].strip().strip("*").rstrip(".").strip() or None
    return text if 0 < len(text) <= SHORT_ANSWER_CHARS else None


# ------------------------------------------------------------------ the interface


def _refuse(scorer: str) -> ValueError:
    return ValueError(
        f"scorer {scorer!r} is not scored from generated text here (one of {', '.join(sorted(TEXT_SCORERS))}); "
        "exact and loglik are lm-eval's, code is the code executor's, llm is the LLM answer check's"
    )


def score_text(scorer: str, item: BenchmarkItem, output: str, *,
               answer_range: tuple[int, int] | None = None) -> dict[str, float]:
    """The scorer's metrics for one generated ``output`` (its ``<think>`` blocks removed first);
    ``answer_range``: the math scorer's integer range (the benchmark's, AIME's 0-999)."""
    answer = strip_think(output)
    if scorer == "gsm8k":
        return score_gsm8k(answer, item.answer)
    if scorer == "math":
        return score_math(answer, item.answer, answer_range)
    if scorer == "choice":
        return score_choice(answer, item)
    if scorer == "numeric":
        return score_numeric(answer, item.answer)
    if scorer == "f1":
        return {"f1": token_f1(answer, item.answer)}
    if scorer == "rouge_l":
        return {"rouge_l": rouge_l(answer, item.answer)}
    raise _refuse(scorer)


def extracted_answer(scorer: str, output: str, *, n_choices: int = len(LETTERS)) -> str | None:
    """What the scorer took as the answer, for error samples; None when it found none.

    gsm8k: the strict extraction, else the flexible one; choice: the letter (pass
    ``n_choices=len(item.choices)`` to see exactly what was scored); f1 and rouge_l: the whole answer;
    llm: :func:`short_answer`, what the LLM answer check is shown.
    """
    answer = strip_think(output)
    if scorer == "gsm8k":
        return gsm8k_strict(answer) or gsm8k_flexible(answer)
    if scorer == "math":
        return math_extracted(answer)
    if scorer == "choice":
        index = extract_choice_letter(answer, n_choices)
        return None if index is None else LETTERS[index]
    if scorer == "numeric":
        return last_number(answer)
    if scorer in ("f1", "rouge_l"):
        return answer or None
    if scorer == "llm":
        return short_answer(answer)
    raise _refuse(scorer)


def check_gold(scorer: str, item: BenchmarkItem) -> str | None:
    """Why the item's gold answer cannot be scored by ``scorer``, or None when it can.

    Scorers this module does not compute (exact, loglik, code, llm) have nothing to check: None.
    """
    gold = item.answer
    if scorer == "gsm8k":
        number = gsm8k_normalise(gsm8k_gold(gold))
        if not _PLAIN_NUMBER.fullmatch(number):
            return f"gsm8k gold {gold[-80:]!r} has no number after '#### '"
    elif scorer == "math":
        if not math_parse(gold):
            return f"math-verify parses nothing in the gold answer {gold[-80:]!r}"
    elif scorer == "numeric":
        if to_number(gold) is None:
            return f"numeric gold {gold[:80]!r} is not a number"
    elif scorer == "choice":
        if not item.choices or gold not in item.choices:
            return "the gold answer is not one of the item's choices"
        if len(item.choices) > len(LETTERS):
            return f"{len(item.choices)} choices: more than there are letters"
    elif scorer in ("f1", "rouge_l"):
        if not gold.strip():
            return "the gold answer is empty"
    return None
