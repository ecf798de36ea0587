"""Judge prompts: rendered from prompts/judge.yaml, complete, small, and free of test-split data."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from services.judge.facts import collect_facts, default_log_stage
from services.judge.prompts import (
    NO_BENCHMARK,
    PROMPTS_FILE,
    build_context,
    load_templates,
    render_retry_note,
    render_system,
    render_user,
)
from services.judge.rules import rules_decision
from shared.events import ErrorSample, Timeouts
from shared.settings import Settings
from shared.untrusted import Fence
from tests.fakes import judge_events as ev
from tests.fakes.judge_events import OOM_LOG


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path)


def _user_prompt(event, settings: Settings, log: str = "", train_yaml: str = ev.TRAIN_YAML) -> str:  # type: ignore[no-untyped-def]
    stage = default_log_stage(event, rules_decision(event).failed_stage)
    facts = collect_facts(event, train_yaml, {stage: log} if stage else {}, settings)
    return render_user(build_context(facts, Fence()))


def test_templates_live_in_the_prompts_file() -> None:
    raw = PROMPTS_FILE.read_text()
    assert "final_decision" in raw and "{{ task.base_model }}" in raw
    fence = Fence()
    system = render_system(fence=fence)
    # The YAML block, de-indented, with the fence's rule (its token) in its place.
    assert system in raw.replace("\n  ", "\n").replace("{{ untrusted_data_rule }}", fence.rule())


def test_system_prompt_states_criteria_taxonomy_and_schema() -> None:
    system = render_system()
    for word in ("Timeout", "OOM", "CUDA", "Config", "Data", "exit code 124", "137"):
        assert word in system
    assert "model output files" in system and "non-empty accuracy summary" in system
    assert "must never make final_decision false" in system
    for key in ('"execution"', '"return_checking"', '"code"', '"final_decision"'):
        assert key in system


def test_user_prompt_for_failed_training(settings: Settings) -> None:
    prompt = _user_prompt(ev.train_failed(1, OOM_LOG), settings, OOM_LOG)
    assert "Name: LLM-Fine-Tuning" in prompt
    assert "Teach the model step-by-step grade-school arithmetic." in prompt
    assert "Base model: Qwen2.5-0.5B-Instruct" in prompt and "Benchmark: gsm8k" in prompt
    assert "per_device_train_batch_size: 8" in prompt
    assert "Exit code: 1" in prompt
    assert "Model output files: Not found\n" in prompt
    assert "Failed stage: training" in prompt
    assert "Stage timeout setting: 360000 seconds" in prompt
    assert NO_BENCHMARK in prompt
    assert '"cuda_oom": true' in prompt and "torch.OutOfMemoryError" in prompt
    assert "Error reported by the stage" not in prompt  # it would only repeat the exit code
    event = ev.data_failed(0, "done\n", error="data.json is an empty list")
    shown = _user_prompt(event, settings, "done\n")
    assert "Error reported by the stage:\n<<<UNTRUSTED DATA BEGIN " in shown
    assert "(the stage's error message)>>>\ndata.json is an empty list\n<<<UNTRUSTED DATA END " in shown


def test_timeout_comes_from_the_request_when_the_runner_did_not_record_one(settings: Settings) -> None:
    event = ev.data_failed(124, "generating...\n")
    event.runs["data_processing"].outcome.timeout_s = None  # type: ignore[union-attr]
    event.context.timeouts = Timeouts(data_processing=600)
    prompt = _user_prompt(event, settings, "generating...\n")
    assert "Failed stage: data_processing" in prompt
    assert "Stage timeout setting: 600 seconds" in prompt
    assert '"timeout": true' in prompt


def test_success_prompt_shows_results_and_files(settings: Settings) -> None:
    prompt = _user_prompt(ev.bench_result(), settings, "Training completed.\n")
    assert "Exit code: 0" in prompt
    assert "Model output files: Found (2 files)\n<<<UNTRUSTED DATA BEGIN " in prompt
    assert "(model file names, as training wrote them)>>>\nadapter_model.safetensors\nadapter_config.json\n" in prompt
    assert "Failed stage" not in prompt and "Stage timeout" not in prompt
    assert '"accuracy_summary"' in prompt and '"gsm8k"' in prompt
    assert "VAL-Q-7781" in prompt  # validation error samples are shown
    assert "not a decision criterion" in prompt  # baseline is context only


def test_loss_history_is_truncated_on_a_copy(settings: Settings) -> None:
    event = ev.bench_result(n_loss=200)
    before = event.model_dump()
    prompt = _user_prompt(event, settings)
    assert event.model_dump() == before
    assert len(event.train.training_metrics.loss_history.train) == 200
    section = prompt.split("# Loss history")[1].split("# Stage log")[0]
    assert "first 30 and last 30 of 200 points" in section
    steps = [json.loads(line.strip().rstrip(","))["step"] for line in section.splitlines() if '"loss"' in line]
    assert len(steps) == 60
    assert steps[:2] == [5, 10] and steps[29] == 150 and steps[30] == 5 * 171 and steps[-1] == 1000


def test_short_loss_history_is_whole_and_missing_one_is_na(settings: Settings) -> None:
    prompt = _user_prompt(ev.bench_result(n_loss=60), settings)
    assert "of 60 points" not in prompt and prompt.count('"loss"') == 60
    prompt = _user_prompt(ev.train_failed(1, OOM_LOG, n_loss=0), settings, OOM_LOG)
    assert "# Loss history\nN/A" in prompt


def test_no_test_split_data_reaches_the_prompt(settings: Settings) -> None:
    """The judge is given the validation BenchResult only; nothing of the test split may leak."""
    test_only = [
        ErrorSample(
            question="TEST-ONLY-Q-55123: A farmer has 17 sheep...",
            gold="TEST-GOLD-9",
            model_output="TEST-OUTPUT-zebra",
        )
    ]
    test_event = ev.bench_result(
        split="test",
        benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.6173}}, samples=test_only, ids=["test-id-88231"]),
    )
    val_event = ev.bench_result(
        benchmark=ev.scores(accuracy={"gsm8k": {"accuracy": 0.52}}, ids=["val-id-10001", "val-id-10002"])
    )
    prompt = _user_prompt(val_event, settings, "Training completed.\n")
    system = render_system()
    for leaked in ("TEST-ONLY-Q-55123", "TEST-GOLD-9", "TEST-OUTPUT-zebra", "test-id-88231", "0.6173"):
        assert leaked not in prompt and leaked not in system
    # The validation samples are there; item ids of any split are not needed and stay out.
    assert "VAL-Q-7781" in prompt and "VAL-Q-1203" in prompt
    assert "val-id-10001" not in prompt
    # And a test-split event cannot be rendered at all.
    with pytest.raises(ValueError, match="validation"):
        build_context(collect_facts(test_event, ev.TRAIN_YAML, {}, settings), Fence())


def test_prompt_is_small_next_to_a_huge_log(settings: Settings) -> None:
    noise = "".join(f"[INFO|callbacks.py:143] 2025-11-30 10:00:01,123 >> step {i}\n" for i in range(30000))
    log = OOM_LOG.replace("Traceback", noise + "Traceback")
    prompt = _user_prompt(ev.train_failed(1, log), settings, log)
    assert len(log) > 1_000_000 and len(prompt) < 6000
    assert "torch.OutOfMemoryError" in prompt


def test_strict_undefined_and_retry_note(tmp_path: Path) -> None:
    templates = load_templates()
    with pytest.raises(jinja2.UndefinedError):
        templates.user.render(task={"name": "x"})
    note = render_retry_note(2, "final_decision: must be a boolean")
    assert note == "Attempt 2: the previous answer was rejected because: final_decision: must be a boolean"


def test_custom_prompts_file(tmp_path: Path) -> None:
    path = tmp_path / "judge.yaml"
    path.write_text("system: S {{ 1 + 1 }}\nuser: U {{ exit_code }}\nretry_note: R\n")
    templates = load_templates(path)
    assert render_system(templates) == "S 2"
    bad = tmp_path / "bad.yaml"
    bad.write_text("system: S\n")
    with pytest.raises(ValueError, match="retry_note"):
        load_templates(bad)
