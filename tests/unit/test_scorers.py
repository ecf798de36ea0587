"""The scorers on known answers: lm-eval's gsm8k filters, math-verify, choice letters, the rest."""

from __future__ import annotations

import threading

import pytest

from evaluation.registry import BenchmarkItem
from evaluation.scorers import (
    check_gold,
    exact_match,
    extract_choice_letter,
    extracted_answer,
    rouge_l,
    score_text,
    strip_think,
    token_f1,
)


def item(answer: str, question: str = "q", choices: list[str] | None = None) -> BenchmarkItem:
    return BenchmarkItem(id="i", question=question, answer=answer, choices=choices)


GSM8K_GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1234"


# ------------------------------------------------------------------ think


def test_strip_think() -> None:
    assert strip_think("<think>hmm</think> 42") == "42"
    assert strip_think("<think>a</think>b<think>c</think>d") == "d"  # up to the last </think>
    assert strip_think("<think>still going, 7") == ""  # never closed: all of it is thinking
    assert strip_think("no thinking\n") == "no thinking"
    assert score_text("gsm8k", item("#### 5"), "<think>#### 3</think>#### 5") == {
        "strict_match": 1.0, "flexible_match": 1.0,
    }
    assert score_text("gsm8k", item("#### 3"), "<think>#### 3</think>#### 5")["strict_match"] == 0.0


# ------------------------------------------------------------------ gsm8k


def test_gsm8k_strict_and_flexible() -> None:
    assert score_text("gsm8k", item("He has 8.\n#### 8"), "5 + 3 = 8, so 5+3=8.\n#### 8") == {
        "strict_match": 1.0, "flexible_match": 1.0,
    }
    # No ####: strict fails; the last number ($, comma and full stop dropped) is the gold.
    assert score_text("gsm8k", item(GSM8K_GOLD), "The answer is $1,234.") == {
        "strict_match": 0.0, "flexible_match": 1.0,
    }
    assert extracted_answer("gsm8k", "The answer is $1,234.") == "$1,234."
    # Strict takes the first ####, flexible the last number: they can disagree.
    scores = score_text("gsm8k", item("#### 12"), "#### 12\nWait, no: 13")
    assert scores == {"strict_match": 1.0, "flexible_match": 0.0}
    assert score_text("gsm8k", item("#### -3"), "#### -3.")["strict_match"] == 1.0
    assert score_text("gsm8k", item("72"), "so 72")["flexible_match"] == 1.0  # a bare gold number
    assert score_text("gsm8k", item("#### 8"), "no number here") == {"strict_match": 0.0, "flexible_match": 0.0}
    assert extracted_answer("gsm8k", "#### 9\nand 10") == "9"
    assert extracted_answer("gsm8k", "nothing") is None


# ------------------------------------------------------------------ math


def test_math_verify() -> None:
    assert score_text("math", item("0.5"), r"So $\boxed{\frac{1}{2}}$.") == {"math_verify": 1.0}
    assert score_text("math", item(r"Thus the answer is $\boxed{3}$."), r"\boxed{2}") == {"math_verify": 0.0}
    assert score_text("math", item("204"), r"the answer is \boxed{204}") == {"math_verify": 1.0}
    # The last \boxed{} is the answer, even after an earlier one.
    assert score_text("math", item("7"), r"first \boxed{3}. Then, finally, \boxed{7}")["math_verify"] == 1.0
    # math-verify alone would read these as one set-valued answer, {3, 7}: the last box is the answer.
    assert score_text("math", item("7"), r"\boxed{3}, \boxed{7}")["math_verify"] == 1.0
    assert score_text("math", item("7"), r"\boxed{7} and \boxed{3}")["math_verify"] == 0.0
    assert score_text("math", item(r"$\boxed{3, 7}$"), r"so \boxed{7, 3}")["math_verify"] == 1.0  # sets compare
    # A box cut off unclosed (the token budget): math-verify's extraction over the whole text.
    assert score_text("math", item("5"), r"x = 5, so the answer is 5. \boxed{5")["math_verify"] == 1.0
    # No \boxed{}: math-verify's own extraction.
    assert score_text("math", item("7"), "The final answer is 7.")["math_verify"] == 1.0
    assert score_text("math", item("7"), "I do not know")["math_verify"] == 0.0
    assert extracted_answer("math", r"so \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extracted_answer("math", "no answer") is None


def test_math_verify_in_a_worker_thread() -> None:
    # The benchmark stage scores in asyncio.to_thread: math-verify's signal timeouts would raise there.
    results: list[dict[str, float]] = []
    worker = threading.Thread(target=lambda: results.append(score_text("math", item("0.5"), r"\boxed{\frac12}")))
    worker.start()
    worker.join(timeout=60)
    assert results == [{"math_verify": 1.0}]


# ------------------------------------------------------------------ choice letters


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is (B)", 1),
        ("B", 1),
        ("**C**", 2),
        ("Answer: D.", 3),
        ("answer: a", None),  # lower case is not a choice letter
        ("(A) because it is the largest", 0),
        ("C. Paris", 2),
        ("D\nThe others are wrong.", 3),
        ("The correct answer is **C**.", 2),
        ("Final Answer: The final answer is $\\boxed{B}$. I hope it is correct.", 1),
        ("A is wrong and B is wrong. The answer is option D", 3),
        ("I think it must be C", 2),  # the last standalone capital in range (I is not)
        ("Option A looks right but the answer is: B", 1),
        ("A cat sat on the mat, so E", 0),  # E is out of range for 4 choices
        ("None of them", None),
        ("", None),
    ],
)
def test_extract_choice_letter(text: str, expected: int | None) -> None:
    assert extract_choice_letter(text, 4) == expected


def test_choice_scorer() -> None:
    mc = item("Paris", choices=["London", "Paris", "Rome", "Berlin"])
    assert score_text("choice", mc, "The answer is (B)") == {"letter_acc": 1.0}
    assert score_text("choice", mc, "<think>B? no</think>Answer: C") == {"letter_acc": 0.0}
    assert extract_choice_letter("The answer is E", 5) == 4
    assert extracted_answer("choice", "The answer is (B)") == "B"


# ------------------------------------------------------------------ exact, numeric, f1, rouge_l


def test_exact_and_numeric() -> None:
    assert exact_match("  Hello   World\n", "hello world") == 1.0
    assert exact_match("hello", "hello world") == 0.0
    assert score_text("numeric", item("1234"), "It costs $1,234.00 in total.") == {"numeric_match": 1.0}
    assert score_text("numeric", item("0.333333"), "about 0.3333333") == {"numeric_match": 1.0}  # within 1e-6
    assert score_text("numeric", item("0.3333"), "about 0.3333333") == {"numeric_match": 0.0}
    assert score_text("numeric", item("-5"), "first 3, then -5") == {"numeric_match": 1.0}
    assert score_text("numeric", item("5"), "no number") == {"numeric_match": 0.0}
    assert extracted_answer("numeric", "from 2 to 3.5.") == "3.5"


def test_f1_hand_computed() -> None:
    # SQuAD normalisation: "the", punctuation and case go: pred [cat, sat, on, mat], gold [cat, sat].
    # precision 2/4, recall 2/2: F1 = 2 * 0.5 * 1 / 1.5 = 2/3.
    assert token_f1("The cat sat on the mat.", "a cat, sat") == pytest.approx(2 / 3)
    assert token_f1("Paris", "paris!") == 1.0
    assert token_f1("London", "Paris") == 0.0
    assert score_text("f1", item("a cat, sat"), "The cat sat on the mat.") == {"f1": pytest.approx(2 / 3)}


def test_rouge_l_hand_computed() -> None:
    # pred "the cat sat on the mat" (6), gold "the cat is on the mat" (6): LCS the cat on the mat = 5.
    # P = R = 5/6, F = 5/6.
    assert rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # pred "a b c d" (4), gold "b d" (2): LCS 2; P 2/4, R 2/2; F = 2 * 0.5 * 1 / 1.5 = 2/3.
    assert rouge_l("a b c d", "b d") == pytest.approx(2 / 3)
    # Order matters (unlike F1): LCS of "c b a" and "a b c" is 1; P = R = 1/3.
    assert rouge_l("c b a", "A B C") == pytest.approx(1 / 3)
    assert rouge_l("x y", "z") == 0.0
    assert score_text("rouge_l", item("b d"), "a b c d") == {"rouge_l": pytest.approx(2 / 3)}


# ------------------------------------------------------------------ interface, golds


def test_scorers_it_does_not_handle() -> None:
    for scorer in ("exact", "loglik", "code", "llm", "nope"):
        with pytest.raises(ValueError, match="not scored from generated text"):
            score_text(scorer, item("1"), "1")


def test_check_gold() -> None:
    assert check_gold("gsm8k", item(GSM8K_GOLD)) is None
    assert check_gold("gsm8k", item("72")) is None
    assert "no number after" in (check_gold("gsm8k", item("They sold many.\n#### many")) or "")
    assert check_gold("gsm8k", item("The answer is five")) is not None
    assert check_gold("math", item(r"So the answer is $\boxed{\frac{1}{2}}$.")) is None
    assert check_gold("math", item("204")) is None
    assert "math-verify parses nothing" in (check_gold("math", item("no math here")) or "")
    assert check_gold("numeric", item("$1,234")) is None
    assert "not a number" in (check_gold("numeric", item("twelve")) or "")
    assert check_gold("choice", item("Paris", choices=["Paris", "Rome"])) is None
    assert check_gold("f1", item("  ")) == "the gold answer is empty"
    assert check_gold("exact", item("anything")) is None  # lm-eval's: nothing to check here


def test_boxed_variants_are_found_as_minerva_finds_them() -> None:
    from evaluation.scorers import boxed_content, last_boxed

    assert boxed_content(r"so the answer is $\boxed 5$.") == "5"
    assert last_boxed(r"so the answer is $\boxed 5$.") == r"\boxed{5}"
    assert boxed_content(r"\fbox{12} is it") == "12"
    assert boxed_content(r"\boxed{\frac{1}{2}} then \fbox{3}") == r"\frac{1}{2}"  # \boxed before \fbox, as minerva
    assert boxed_content(r"\boxed{5") is None
    assert score_text("math", item("5"), r"The answer is $\boxed 5$.") == {"math_verify": 1.0}
    assert score_text("math", item("12"), r"Hence \fbox{12}.") == {"math_verify": 1.0}
    assert score_text("math", item("12"), r"Hence \fbox{13}.") == {"math_verify": 0.0}


def test_aime_answers_count_only_as_integers_from_0_to_999() -> None:
    aime = (0, 999)
    assert score_text("math", item("5"), r"\boxed{5}", answer_range=aime) == {"math_verify": 1.0}
    assert score_text("math", item("5"), r"\boxed{005}", answer_range=aime) == {"math_verify": 1.0}
    # Equal to 5, but no AIME answer: math-verify alone would count them.
    assert score_text("math", item("5"), r"\boxed{\frac{10}{2}}") == {"math_verify": 1.0}
    assert score_text("math", item("5"), r"\boxed{\frac{10}{2}}", answer_range=aime) == {"math_verify": 0.0}
    assert score_text("math", item("5"), r"\boxed{5.0}", answer_range=aime) == {"math_verify": 0.0}
    assert score_text("math", item("1000"), r"\boxed{1000}", answer_range=aime) == {"math_verify": 0.0}
