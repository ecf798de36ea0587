"""What `submit --wait` shows: a line per stage with training step, loss and the trainer's ETA."""

from __future__ import annotations

from rich.console import Console

from ftbus.progress_view import ProgressView
from ftbus.verdict_view import render_verdict
from shared.events import BaselineComparison, BenchmarkScores, Progress, Stage, Verdict, VerdictResult


def test_progress_view_shows_step_loss_and_eta() -> None:
    console = Console(record=True, width=120, force_terminal=False)
    with ProgressView(console) as view:
        view.update(Progress(request_id="r", stage=Stage.data, state="started"))
        view.update(Progress(request_id="r", stage=Stage.data, state="finished"))
        view.update(Progress(request_id="r", stage=Stage.train, step=3, total=15, loss=0.5, eta_s=65))
    text = console.export_text()
    assert "train" in text and "3/15" in text
    assert "loss 0.5000" in text and "eta 0:01:05" in text
    assert "finished" in text


def test_verdict_view_shows_decision_baseline_and_loss() -> None:
    from shared.events import LossHistory, TrainingMetrics, TrainLossPoint

    scores = BenchmarkScores(accuracy_summary={"addition": {"exact_match": 0.25}}, primary_metric="exact_match",
                             primary_value=0.25)
    history = LossHistory(train=[TrainLossPoint(step=1, loss=2.0), TrainLossPoint(step=2, loss=1.0)])
    verdict = Verdict(
        request_id="r", status="completed", execution="SUCCESS", return_checking="ok", code="fine",
        final_decision=True,
        result=VerdictResult(
            benchmark=scores,
            training_metrics=TrainingMetrics.from_history(history),
            baseline=BaselineComparison(baseline=scores, primary_metric="exact_match", candidate_value=0.25,
                                        baseline_value=0.1, difference=0.15),
        ),
    )
    console = Console(record=True, width=120, force_terminal=False)
    render_verdict(console, verdict)
    text = console.export_text()
    assert "final_decision: True" in text
    assert "addition: exact_match=0.2500" in text
    assert "baseline 0.1" in text and "+0.1500" in text
    assert "initial 2.0000 -> final 1.0000" in text


def test_verdict_view_names_the_sandbox_and_the_llm_spend() -> None:
    from shared.events import LlmCall, LlmUsage

    usage = LlmUsage(calls=[LlmCall(model="m", status=200, prompt_tokens=10, completion_tokens=5)], requests=1,
                     prompt_tokens=10, completion_tokens=5, refused=2, budget_requests=1)
    for sandbox, expected in (("docker:ftbus-sandbox:latest", "sandbox: docker:ftbus-sandbox:latest"),
                              ("local", "sandbox: local (no isolation)")):
        verdict = Verdict(request_id="r", status="completed", execution="e", return_checking="r", code="c",
                          final_decision=False, sandbox=sandbox, llm_usage=usage)
        console = Console(record=True, width=120, force_terminal=False)
        render_verdict(console, verdict)
        text = console.export_text()
        assert expected in text
        assert "LLM calls in data processing: 1 of 1 allowed, 15 tokens, 2 refused over budget" in text
