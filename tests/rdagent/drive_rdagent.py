"""Drives the REAL rdagent 1.0.0 against a running ftbus; run by tests/integration/test_rdagent.py
with the RD-Agent environment's interpreter (.rdagent-env), never collected by pytest itself.

    <rdagent-env>/bin/python tests/rdagent/drive_rdagent.py CASE WORKSPACE [WORKSPACE ...]

The ftbus to use comes from FTBUS_* variables. Everything RD-Agent-side is RD-Agent's own class:
the fine-tuning workspace (FTWorkspace, an FBWorkspace), FTTask, CoSTEERSingleFeedback, RD-Agent's
multiprocessing_wrapper (how its loops run evaluators in worker processes), FTTrace (the SOTA
readers of running_info.result), the fine-tuning UI's render_training_result and the experiment
feedback summariser FTExperiment2Feedback (whose LLM is the test's local OpenAI-compatible server,
when OPENAI_API_BASE is set). It prints one JSON object on its last line of stdout,
what it observed, for the test to check.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download at import

from rdagent.components.coder.CoSTEER.evaluators import CoSTEERSingleFeedback
from rdagent.components.coder.finetune.exp import FTTask
from rdagent.core.experiment import FBWorkspace
from rdagent.core.utils import multiprocessing_wrapper
from rdagent.scenarios.finetune.experiment.workspace import FTWorkspace

from ftbus.rdagent import FtbusRunnerEvaluator


def workspace_from(folder: Path) -> FTWorkspace:
    ws = FTWorkspace()
    ws.inject_files(**{p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()})
    return ws


def task() -> FTTask:
    return FTTask(base_model="tiny-standin", description="double numbers", benchmark="tiny-arith")


def evaluate_in_worker(evaluator: FtbusRunnerEvaluator, target: FTTask, ws: FBWorkspace) -> dict[str, Any]:
    """What one RD-Agent worker process sees after evaluating: runs in a child process."""
    fb = evaluator.evaluate(target, ws, None)
    return observe(fb, ws)


def observe(fb: CoSTEERSingleFeedback, ws: FBWorkspace) -> dict[str, Any]:
    output = ws.workspace_path / "output"
    return {
        "pid": os.getpid(),
        "feedback_type": type(fb).__name__,
        "is_costeer_feedback": isinstance(fb, CoSTEERSingleFeedback),
        "execution": fb.execution,
        "return_checking": fb.return_checking,
        "code": fb.code,
        "final_decision": fb.final_decision,
        "raw_execution": fb.raw_execution,
        "workspace_feedback_is_it": ws.feedback is fb,
        "running_time": ws.running_info.running_time,
        "result": ws.running_info.result,
        "data_stats": json.loads(ws.file_dict["data_stats.json"]) if "data_stats.json" in ws.file_dict else None,
        "output_files": sorted(p.name for p in output.iterdir()) if output.is_dir() else None,
        # RD-Agent's own look for a model (FTRunnerEvaluator.evaluate), word for word.
        "rdagent_model_files": sorted(p.name for p in (
            list(output.glob("*.safetensors")) + list(output.glob("*.bin")) + list(output.glob("adapter_*"))
            if output.exists() else [])),
    }


def readers(ws: FBWorkspace, fb: CoSTEERSingleFeedback) -> dict[str, Any]:
    """RD-Agent's own readers of running_info.result, fed the evaluated workspace."""
    from rdagent.core.proposal import ExperimentFeedback
    from rdagent.scenarios.finetune.experiment.experiment import FTExperiment
    from rdagent.scenarios.finetune.proposal.trace import FTTrace

    exp = FTExperiment(sub_tasks=[task()])
    exp.experiment_workspace = ws
    trace = FTTrace(scen=None)
    trace.hist.append((exp, ExperimentFeedback(reason="ftbus verdict", decision=bool(fb.final_decision))))
    trace.dag_parent.append(())
    out: dict[str, Any] = {
        "sota_benchmark": trace.sota_benchmark(),
        "experiment_info_benchmark": trace.get_experiment_info(exp)["benchmark"],
        "sota_info_config_is_train_yaml": trace.sota_info()["config"] == ws.file_dict["train.yaml"],
    }
    out["ui"] = render_ui(ws.running_info.result)
    if os.environ.get("OPENAI_API_BASE"):
        out["summariser"] = summarise(exp, trace)
    return out


def summarise(exp: Any, trace: Any) -> dict[str, Any]:
    """RD-Agent's experiment feedback summariser (an LLM call: the test's local OpenAI-compatible
    server answers). Its scenario is context only: a description and the base model's scores."""
    from types import SimpleNamespace

    from rdagent.scenarios.finetune.dev.feedback import FTExperiment2Feedback

    scen = SimpleNamespace(
        get_scenario_all_desc=lambda: "ftbus test scenario: double numbers",
        baseline_benchmark_score={"accuracy_summary": {"doubling": {"exact_match": 0.0}}, "error_samples": []},
    )
    feedback = FTExperiment2Feedback(scen).generate_feedback(exp, trace)
    return {"decision": feedback.decision, "reason": feedback.reason}


def render_ui(result: dict[str, Any]) -> dict[str, Any]:
    """RD-Agent's fine-tuning UI (streamlit) drawing the result, in streamlit's own test harness."""
    from streamlit.testing.v1 import AppTest

    def page(result: dict) -> None:
        from rdagent.app.finetune.llm.ui.components import render_training_result

        render_training_result(result)

    app = AppTest.from_function(page, args=(result,), default_timeout=60)
    app.run()
    return {
        "exceptions": [str(e.value) for e in app.exception],
        "metrics": {m.label: m.value for m in app.metric},
        "markdown": [m.value for m in app.markdown],
        "dataframe_rows": [len(d.value) for d in app.dataframe],
    }


def main() -> int:
    case, *folders = sys.argv[1:]
    evaluator = pickle.loads(pickle.dumps(FtbusRunnerEvaluator(scen=None)))  # as RD-Agent ships it to workers
    report: dict[str, Any] = {"case": case}
    if case == "parallel":
        # Several loops at once, each in its own worker process, all on one ftbus.
        calls = [(evaluate_in_worker, (evaluator, task(), workspace_from(Path(f)))) for f in folders]
        report["runs"] = multiprocessing_wrapper(calls, n=len(calls))
        report["parent_pid"] = os.getpid()
    elif case == "one":
        ws = workspace_from(Path(folders[0]))
        fb = evaluator.evaluate(task(), ws, None)
        report["run"] = observe(fb, ws)
        if fb.final_decision:
            report["readers"] = readers(ws, fb)
    elif case == "campaign":
        # One RD-Agent run evaluating candidates one after the other: its trace is their campaign.
        report["campaign"] = evaluator.campaign_name()
        report["runs"] = []
        for folder in folders:
            ws = workspace_from(Path(folder))
            fb = evaluator.evaluate(task(), ws, None)
            report["runs"].append(observe(fb, ws))
    elif case == "no-yaml":
        ws = workspace_from(Path(folders[0]))
        ws.file_dict.pop("train.yaml", None)
        fb = evaluator.evaluate(task(), ws, None)
        report["run"] = observe(fb, ws)
        # The one setting a user changes: RD-Agent builds its runner from FT_RUNNER.
        from rdagent.app.finetune.llm.conf import FT_RD_SETTING
        from rdagent.core.utils import import_class

        runner = import_class(FT_RD_SETTING.runner)(scen=None)
        report["runner"] = {"class": type(runner).__module__ + "." + type(runner).__name__,
                            "evaluators": [type(e).__name__ for e in runner.evaluator.single_evaluator]}
    else:
        raise SystemExit(f"unknown case {case}")
    print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
