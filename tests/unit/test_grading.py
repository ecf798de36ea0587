"""ftbus's scorers on an lm-eval run's output: what a user reads in ``accuracy_summary`` and in the
error samples, for the scorers ftbus computes from generated text (GSM8K, math, MMLU's letter)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from evaluation.grading import grade_split
from evaluation.inference import InferenceConfig
from evaluation.lmeval import letter_task_name, render_task_config, task_name, write_task_configs
from evaluation.registry import load_benchmark
from evaluation.splits import make_split
from shared.settings import Settings

STAMP = "2026-12-02T10-00-00.000000"


def _benchmark(assets: Path, name: str, descriptor: dict[str, Any], items: dict[str, list[dict[str, Any]]]) -> None:
    folder = assets / "benchmarks" / name
    folder.mkdir(parents=True)
    subsets = [{"name": s, "file": f"{s}.jsonl"} for s in items]
    (folder / "benchmark.yaml").write_text(yaml.safe_dump({"name": name, "version": 1, "subsets": subsets,
                                                           **descriptor}))
    for subset, rows in items.items():
        (folder / f"{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _lm_eval_output(out: Path, tasks: dict[str, list[dict[str, Any]]]) -> None:
    """Files laid out as lm-eval 0.4.13 leaves them (results and one samples file per task)."""
    model_dir = out / "model"
    model_dir.mkdir(parents=True)
    results = {task: {"alias": task, "exact_match,none": 0.0} for task in tasks}
    (model_dir / f"results_{STAMP}.json").write_text(json.dumps({"results": results}))
    for task, rows in tasks.items():
        (model_dir / f"samples_{task}_{STAMP}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _generated(doc_id: int, doc: dict[str, Any], text: str) -> dict[str, Any]:
    return {"doc_id": doc_id, "doc": doc, "resps": [[text]], "filtered_resps": [text], "exact_match": 0.0}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", assets_dir=tmp_path / "assets")


async def test_gsm8k_strict_and_flexible_per_subset(settings: Settings, tmp_path: Path) -> None:
    items = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
             for i in range(8)]
    _benchmark(settings.assets, "g", {"kind": "generate_until", "scorer": "gsm8k", "primary_metric": "strict_match",
                                      "generation": {"max_gen_toks": 64, "until": ["Question:"]}}, {"main": items})
    spec = load_benchmark(settings.assets, "g")
    manifest = make_split(spec, "validation", 100)
    assert manifest.item_ids["main"] == ["q0", "q1", "q2", "q3"]
    outputs = [
        "0 + 0 = 0\n#### 0",            # strict and flexible
        "1 + 1 = 2, so the answer is 2",  # flexible only
        "<think>#### 4</think>#### 5",  # thinking stripped: 5 is wrong
        "#### 1,0",                     # wrong both ways
    ]
    rows = [_generated(i, {"id": f"q{i}", "question": items[i]["question"], "answer": items[i]["answer"]}, text)
            for i, text in enumerate(outputs)]
    _lm_eval_output(tmp_path / "out", {task_name("g", "main"): rows})
    scores = await grade_split(spec, manifest, tmp_path / "out", settings=settings,
                               inference=InferenceConfig(greedy=True), tokenizer_dir=None)
    assert scores.scorer == "gsm8k"
    assert scores.accuracy_summary == {"main": {"strict_match": 0.25, "flexible_match": 0.5}}
    assert scores.primary_value == 0.25
    # Errors are the items the primary metric (strict) missed, with what the scorer read from the
    # output (the strict answer, else the flexible one).
    assert [(e.question, e.extracted) for e in scores.error_samples] == [
        ("What is 1 + 1?", "2"), ("What is 2 + 2?", "5"), ("What is 3 + 3?", "1,0")]
    assert scores.notes[0] == "generated with greedy decoding"


async def test_mmlu_style_choice_reports_log_likelihood_and_the_generated_letter(
    settings: Settings, tmp_path: Path
) -> None:
    choices = ["red", "green", "blue", "black"]
    items = [{"id": f"c{i}", "question": f"Q{i}\nA. red\nB. green\nC. blue\nD. black\nAnswer:", "choices": choices,
              "answer": choices[i % 4]} for i in range(4)]
    _benchmark(settings.assets, "m", {"kind": "multiple_choice", "scorer": "choice", "primary_metric": "acc"},
               {"colours": items})
    spec = load_benchmark(settings.assets, "m")
    manifest = make_split(spec, "validation", 100)  # c0, c1
    docs = [{k: v for k, v in items[i].items()} for i in range(2)]
    loglik = [{"doc_id": 0, "doc": docs[0], "acc": 1.0, "acc_norm": 1.0, "resps": [], "filtered_resps": []},
              {"doc_id": 1, "doc": docs[1], "acc": 0.0, "acc_norm": 1.0, "resps": [], "filtered_resps": []}]
    letters = [_generated(0, docs[0], "The answer is (B)."), _generated(1, docs[1], "B")]
    _lm_eval_output(tmp_path / "out", {task_name("m", "colours"): loglik,
                                       letter_task_name("m", "colours"): letters})
    scores = await grade_split(spec, manifest, tmp_path / "out", settings=settings, inference=None,
                               tokenizer_dir=None)
    assert scores.accuracy_summary == {"colours": {"acc": 0.5, "acc_norm": 1.0, "letter_acc": 0.5}}
    (error,) = scores.error_samples
    assert error.gold == "B. green" and error.extracted == "B"


def test_a_choice_benchmark_scores_its_letters_and_generates_one(settings: Settings, tmp_path: Path) -> None:
    choices = ["red", "green", "blue"]
    items = [{"id": f"c{i}", "question": f"Q{i}", "choices": choices, "answer": "blue"} for i in range(2)]
    _benchmark(settings.assets, "m", {"kind": "multiple_choice", "scorer": "choice", "primary_metric": "acc"},
               {"colours": items})
    spec = load_benchmark(settings.assets, "m")
    tasks = write_task_configs(spec, {"colours": tmp_path / "colours.jsonl"}, tmp_path / "tasks")
    assert tasks == [task_name("m", "colours"), letter_task_name("m", "colours")]
    loglik = yaml.safe_load((tmp_path / "tasks" / f"{tasks[0]}.yaml").read_text())
    # As lm-eval's own mmlu task: the prompt lists the choices, the letters are what is scored.
    doc_to_choice = jinja2.Template(loglik["doc_to_choice"]).render(choices=choices)
    assert ast.literal_eval(doc_to_choice) == ["A", "B", "C"]
    assert jinja2.Template(loglik["doc_to_target"]).render(choices=choices, answer="blue") == "2"
    letter = yaml.safe_load((tmp_path / "tasks" / f"{tasks[1]}.yaml").read_text())
    assert letter["output_type"] == "generate_until"


def test_task_rendering_samples_as_the_model_entry_says(settings: Settings) -> None:
    items = [{"id": "1", "question": "q", "answer": "1\n#### 1"}, {"id": "2", "question": "r", "answer": "#### 2"}]
    _benchmark(settings.assets, "g", {"kind": "generate_until", "scorer": "gsm8k", "primary_metric": "strict_match",
                                      "prompt": "Question: {{question}}\nAnswer:",
                                      "generation": {"max_gen_toks": 256, "until": ["Question:"]}}, {"main": items})
    spec = load_benchmark(settings.assets, "g")
    sampled = render_task_config(spec, "main", Path("/d/main.jsonl"), InferenceConfig())
    assert sampled["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert sampled["generation_kwargs"] == {"until": ["Question:"], "max_gen_toks": 256, "do_sample": True,
                                            "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    capped = render_task_config(spec, "main", Path("/d/main.jsonl"), InferenceConfig(greedy=True, max_gen_toks=100))
    assert capped["generation_kwargs"] == {"until": ["Question:"], "max_gen_toks": 100, "do_sample": False}
