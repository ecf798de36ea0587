"""`ftbus score` on lm-eval's --log_samples files, and the reference metrics it computes (the same per item
as lm-eval's own: tests/e2e/test_reference_protocol.py checks them against lm-eval)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evaluation.reference import aime_exact_match, mbpp_instruct_code, mmlu_acc, reference_program
from evaluation.registry import BenchmarkItem
from ftbus.cli import app


def _row(doc_id: int, doc: dict, response: str, flt: str) -> dict:
    return {"doc_id": doc_id, "doc": doc, "target": doc["answer"], "filter": flt,
            "arguments": {"gen_args_0": {"arg_0": f"Question: {doc['question']}\nAnswer:", "arg_1": {}}},
            "resps": [[response]], "filtered_resps": ["x"]}


def test_lm_eval_samples_of_gsm8k_are_rescored_with_their_protocol(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTBUS_ASSETS_DIR", str(tmp_path / "assets"))  # none imported: the docs are the items
    docs = [{"question": "250 * 4?", "answer": "250 * 4 = 1000\n#### 1000"}, {"question": "2 + 3?", "answer": "#### 5"}]
    responses = [" so 1,000 pens.\n#### 1,000", " The answer is 5."]
    path = tmp_path / "samples_gsm8k_2026-12-04T10-00-00.jsonl"
    path.write_text("".join(json.dumps(_row(i, d, r, f)) + "\n" for f in ("strict-match", "flexible-extract")
                            for i, (d, r) in enumerate(zip(docs, responses, strict=True))))
    done = CliRunner().invoke(app, ["score", "gsm8k", "--samples", str(path), "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert (result["protocol"], result["metric"], result["value"]) == ("reference", "strict_match", 0.5)
    first, second = result["items"]
    assert first["prompt"] == "Question: 250 * 4?\nAnswer:" and first["response"] == responses[0]
    assert (first["extracted"], first["metrics"]) == ("1,000", {"strict_match": 1.0, "flexible_match": 1.0})
    assert second["metrics"] == {"strict_match": 0.0, "flexible_match": 1.0}
    table = CliRunner().invoke(app, ["score", "gsm8k", "--samples", str(path)])
    assert "protocol: reference" in table.stdout and "strict_match = 0.5000" in table.stdout
    neither = CliRunner().invoke(app, ["score", "gsm8k"])
    assert neither.exit_code == 2 and "one of them" in neither.output


def test_lm_evals_aime_mmlu_and_code_rules_as_ftbus_computes_them() -> None:
    assert aime_exact_match(r"so $\boxed 24$.", "24") == 1.0
    assert aime_exact_match(r"There are $\fbox{6}$ divisors.", "6") == 0.0  # its remove_boxed refuses \fbox
    assert aime_exact_match(r"$k = 6$", "6") == 1.0  # strip_string drops a short "k ="
    assert aime_exact_match("0.5", "1/2") == 1.0
    assert mmlu_acc([-1.0, -1.0, -3.0], 0) == 1.0 and mmlu_acc([-1.0, -1.0, -3.0], 1) == 0.0  # ties: the first
    # lm-eval's own regex, quirks kept: after its prepended "```", a reply opening with "def" loses the word
    # as a "language tag" (lm-eval 0.4.13's mbpp_instruct does the same); one opening on a new line does not.
    assert mbpp_instruct_code("def f():\n    return 1\n```\ntext") == " f():\n    return 1"
    assert mbpp_instruct_code("\ndef f():\n    return 1\n```") == "def f():\n    return 1"
    item = BenchmarkItem(id="HumanEval/9", question="def f():\n", answer="", test="def check(c):\n  assert c()\n",
                         entry_point="f")
    fenced = "```python\n    return 1\n```"
    assert reference_program("humaneval", "plain", item, fenced).solution == "def f():\n" + fenced  # verbatim
    assert reference_program("humaneval", "instruct", item, "    return 1\n```\nDone").solution == \
        "def f():\n    return 1\n"
