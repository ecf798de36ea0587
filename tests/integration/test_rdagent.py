"""The RD-Agent evaluator (ftbus.rdagent) against the REAL rdagent 1.0.0 package.

rdagent lives in an environment of its own (.rdagent-env, `make rdagent-env`; `make test` builds
it): these tests run ftbus's services here, on a real nats-server with the stand-in toolchain, and
run tests/rdagent/drive_rdagent.py with that environment's interpreter, which drives RD-Agent's
own classes (FTWorkspace, FTTask, CoSTEERSingleFeedback, multiprocessing_wrapper, FTTrace, the UI's
render_training_result) and reports what it saw as JSON. Skipped, saying why, where the environment
could not be installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ftbus import Client
from shared.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer, answer
from tests.integration.conftest import Pipeline, write_workspace
from tests.integration.test_delivery import ftbus_env

REPO = Path(__file__).resolve().parents[2]
RDAGENT_ENV = Path(os.environ.get("FTBUS_TEST_RDAGENT_ENV", REPO / ".rdagent-env"))
DRIVER = REPO / "tests" / "rdagent" / "drive_rdagent.py"
RUN_S = 600  # rdagent's import alone takes ~7 s, more on a loaded machine


@pytest.fixture(scope="session")
def rdagent_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = RDAGENT_ENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the RD-Agent environment is not installed ({RDAGENT_ENV}): run `make rdagent-env` "
                    "(make test does; it needs PyPI and ~2.1 GB)")
    probe = subprocess.run(
        [str(python), "-c", "import rdagent.scenarios.finetune.train.eval, ftbus.rdagent"],
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}, capture_output=True, text=True,
        timeout=RUN_S, check=False, cwd=tmp_path_factory.mktemp("rdagent-probe"),  # rdagent writes ./log
    )
    if probe.returncode != 0:
        pytest.skip(f"the RD-Agent environment {RDAGENT_ENV} cannot import rdagent and ftbus.rdagent "
                    f"(run `make rdagent-env` again): {probe.stderr.strip()[-500:]}")
    return python


@pytest.fixture
def llm() -> Any:
    """The LLM RD-Agent's feedback summariser calls: a local OpenAI-compatible server."""
    with FakeOpenAIServer(default=answer({"Code Summary": "LoRA on doubling data", "Reason": "beats the base model",
                                           "Decision": "yes", "New Hypothesis": "more steps",
                                           "Observations": "loss falls"})) as server:
        yield server


async def drive(python: Path, settings: Settings, cwd: Path, case: str, *workspaces: Path,
                extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the driver in the RD-Agent environment, without blocking the services' event loop."""
    cwd.mkdir(parents=True, exist_ok=True)  # RD-Agent writes its workspaces and logs under the cwd
    env = {**ftbus_env(settings), "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(extra_env or {})}
    proc = await asyncio.create_subprocess_exec(
        str(python), str(DRIVER), case, *map(str, workspaces), cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=RUN_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-4000:]
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_parallel_rdagent_workers_share_one_ftbus_and_get_rdagents_own_shapes(
    pipeline: Pipeline, settings: Settings, rdagent_python: Path, tmp_path: Path
) -> None:
    await pipeline.start(concurrency=2)
    good = write_workspace(tmp_path / "good")
    also_good = write_workspace(tmp_path / "also-good", train={"max_steps": 3})
    bad = write_workspace(tmp_path / "bad", script="raise SystemExit('no data today')\n")

    # Each candidate judged on its own (no campaign): this test is about the shapes RD-Agent reads.
    report = await drive(rdagent_python, settings, tmp_path / "rd", "parallel", good, also_good, bad,
                         extra_env={"FTBUS_RDAGENT_CAMPAIGN": "off"})
    runs = report["runs"]
    # Three RD-Agent worker processes (not the parent), one ftbus.
    assert len({r["pid"] for r in runs}) == 3 and report["parent_pid"] not in {r["pid"] for r in runs}
    listed = {v.request_id: v for v in await _requests(pipeline)}
    assert len(listed) == 3 and all(v.status == "completed" for v in listed.values())

    ok, ok3, failed = runs
    for run, steps in ((ok, 5), (ok3, 3)):
        assert run["is_costeer_feedback"] and run["feedback_type"] == "CoSTEERSingleFeedback"
        assert run["final_decision"] is True, run["execution"]
        assert run["execution"].startswith("SUCCESS") and run["return_checking"] and run["code"]
        assert "Training completed." in run["raw_execution"]  # the training log, as RD-Agent keeps it
        assert run["workspace_feedback_is_it"]
        assert isinstance(run["running_time"], float) and run["running_time"] > 0
        result = run["result"]
        # RD-Agent's three keys, unchanged, and ftbus's own paired comparison beside them.
        assert set(result) == {"benchmark", "benchmark_test", "training_metrics", "baseline_comparison"}
        comparison = result["baseline_comparison"]
        assert comparison["num_runs"] == 1 and comparison["seed"] == 0 and comparison["overall"]["items"] > 0
        assert comparison["summary"]  # the paired comparison in words, or why there is none
        assert set(result["benchmark"]) == {"accuracy_summary", "error_samples"}
        assert set(result["benchmark"]["accuracy_summary"]) == {"doubling", "halving"}
        assert all(set(s) == {"question", "gold", "model_output"} for s in result["benchmark"]["error_samples"])
        assert result["benchmark_test"] == {}  # no report credentials given: empty, as documented
        metrics = result["training_metrics"]
        train = metrics["loss_history"]["train"]
        assert [p["step"] for p in train] == list(range(1, steps + 1))
        assert all(set(p) == {"step", "epoch", "loss"} for p in train)
        evals = metrics["loss_history"]["eval"]
        assert len(evals) == 1 and set(evals[0]) == {"step", "epoch", "eval_loss"}  # the stand-in's one eval
        assert metrics["initial_loss"] == train[0]["loss"] and metrics["final_loss"] == train[-1]["loss"]
        assert run["data_stats"]["total_samples"] == 40
        assert set(run["data_stats"]) == {"total_samples", "token_stats", "stdout_summary"}
        # The trained model in the workspace's output/, where RD-Agent's own evaluator leaves it and
        # its own check finds it.
        assert "adapter_model.safetensors" in run["output_files"] and "trainer_state.json" in run["output_files"]
        assert "adapter_model.safetensors" in run["rdagent_model_files"]

    # A failed data stage: RD-Agent's evaluator sets neither running_time nor result then.
    assert failed["final_decision"] is False
    assert "no data today" in failed["raw_execution"]
    assert failed["result"] is None and failed["running_time"] is None and failed["data_stats"] is None
    assert failed["output_files"] is None  # no model: nothing downloaded


async def test_one_evaluation_feeds_rdagents_readers_and_the_report_fills_benchmark_test(
    pipeline: Pipeline, settings: Settings, rdagent_python: Path, tmp_path: Path, llm: FakeOpenAIServer
) -> None:
    await pipeline.start()
    ws = write_workspace(tmp_path / "ws")
    llm_env = {"OPENAI_API_KEY": "sk-test", "OPENAI_API_BASE": llm.base_url, "CHAT_MODEL": "gpt-4o-mini",
               "CHAT_STREAM": "False"}
    # Report credentials: here the server has no users, so the plain URL may read reports.
    report = await drive(rdagent_python, settings, tmp_path / "rd", "one", ws,
                         extra_env={"FTBUS_REPORT_NATS_URL": str(settings.nats_url), "FTBUS_RDAGENT_PULL_MODEL": "0",
                                    "FTBUS_RDAGENT_CAMPAIGN": "off", **llm_env})
    run = report["run"]
    assert run["final_decision"] is True, run["execution"]
    assert run["output_files"] is None  # rdagent_pull_model off: the weights stay in ftbus
    result = run["result"]
    test = result["benchmark_test"]
    assert set(test) == {"accuracy_summary", "error_samples"}
    assert set(test["accuracy_summary"]) == {"doubling", "halving"}

    readers = report["readers"]
    # FTTrace: the SOTA benchmark the agent is shown is the validation result, never the test split.
    assert readers["sota_benchmark"] == result["benchmark"]
    assert readers["experiment_info_benchmark"] == result["benchmark"]["accuracy_summary"]
    assert readers["sota_info_config_is_train_yaml"] is True
    # RD-Agent's UI draws it without an exception: both losses, validation and test tables.
    ui = readers["ui"]
    assert ui["exceptions"] == []
    metrics = result["training_metrics"]
    assert ui["metrics"] == {"Initial Loss": f"{metrics['initial_loss']:.4f}",
                             "Final Loss": f"{metrics['final_loss']:.4f}"}
    assert "**Validation Benchmark**" in ui["markdown"] and "**Test Benchmark**" in ui["markdown"]
    assert ui["dataframe_rows"] == [2, 2]
    # The feedback summariser read the same result into its prompt, and parsed the LLM's answer.
    assert readers["summariser"] == {"decision": True, "reason": "beats the base model"}
    prompt = llm.requests[-1].user_prompt
    assert f"**Execution Time**: {run['running_time']} seconds" in prompt
    assert json.dumps(result["benchmark"]["accuracy_summary"], indent=2) in prompt
    for point in metrics["loss_history"]["train"]:
        assert f'"loss": {point["loss"]}' in prompt and f'"step": {point["step"]}' in prompt
    assert f'"eval_loss": {metrics["loss_history"]["eval"][0]["eval_loss"]}' in prompt
    for sample in result["benchmark"]["error_samples"]:
        assert f"- Expected Answer: {sample['gold']}" in prompt
    # ... and nothing of the hidden test split (its items differ from validation's).
    assert test["error_samples"]
    for sample in test["error_samples"]:
        assert sample["question"] not in prompt


async def test_an_rdagent_run_is_a_campaign_named_after_its_trace(
    pipeline: Pipeline, settings: Settings, rdagent_python: Path, tmp_path: Path
) -> None:
    """By default (rdagent_campaign=trace) the evaluator submits every candidate of one RD-Agent run in
    the campaign of its trace: the first is compared with the base model and accepted, an identical
    second one is refused as not distinguishable from the first, which the verdict names."""
    await pipeline.start()
    # The stand-in model answers every validation item right with standin_accuracy_every 1: far beyond noise.
    first = write_workspace(tmp_path / "first", train={"standin_accuracy_every": 1})
    copy = write_workspace(tmp_path / "copy", train={"standin_accuracy_every": 1})
    trace = tmp_path / "rd" / "log" / "run-2026_01-01"
    report = await drive(rdagent_python, settings, tmp_path / "rd", "campaign", first, copy,
                         extra_env={"LOG_TRACE_PATH": str(trace), "FTBUS_RDAGENT_PULL_MODEL": "0"})
    assert report["campaign"] == "rdagent-run-2026_01-01"
    accepted, refused = report["runs"]
    assert accepted["final_decision"] is True, accepted["return_checking"]
    check = accepted["result"]["baseline_comparison"]["campaign"]
    assert check["campaign"] == "rdagent-run-2026_01-01" and check["incumbent"] is None and check["accepted"]
    assert refused["final_decision"] is False
    against = refused["result"]["baseline_comparison"]["campaign"]
    async with Client(settings=settings) as client:
        record = await client.campaign("rdagent-run-2026_01-01")
    assert record is not None and len(record.history) == 2
    incumbent = record.history[0].request_id
    assert [e.request_id for e in record.incumbents] == [incumbent] and record.incumbent == incumbent
    assert against["incumbent"] == incumbent and not against["accepted"]
    assert f"not distinguishable from the incumbent {incumbent}" in refused["return_checking"]


async def test_ft_runner_selects_ftbus_and_a_workspace_without_train_yaml_sends_nothing(
    pipeline: Pipeline, settings: Settings, rdagent_python: Path, tmp_path: Path
) -> None:
    await pipeline.start()
    ws = write_workspace(tmp_path / "ws")
    report = await drive(rdagent_python, settings, tmp_path / "rd", "no-yaml", ws,
                         extra_env={"FT_RUNNER": "ftbus.rdagent.FtbusFinetuneRunner"})
    # RD-Agent's own setting picks the runner, whose only evaluator is ftbus's.
    assert report["runner"] == {"class": "ftbus.rdagent.FtbusFinetuneRunner", "evaluators": ["FtbusRunnerEvaluator"]}
    run = report["run"]
    assert (run["execution"], run["return_checking"], run["code"], run["final_decision"]) == (
        "No train.yaml found in workspace", "Config file missing", "No valid configuration file", False)
    assert run["result"] is None
    assert await _requests(pipeline) == []


async def _requests(pipeline: Pipeline) -> list[Any]:
    from ftbus import Client

    async with Client(settings=pipeline.settings) as client:
        return await client.requests()
