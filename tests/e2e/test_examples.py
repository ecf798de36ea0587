"""Both example workspaces through the real pipeline: real nats-server, llamafactory-cli, lm-eval."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from ftbus.embedded import EmbeddedServer
from shared.events import Progress, Report, TaskSpec, Verdict
from shared.settings import Settings
from tests.integration.conftest import Pipeline
from tests.sandbox_support import require_sandbox

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
# example -> (benchmark, raw dataset, validation subsets): the LoRA example learns tiny-sentiment,
# the full fine-tune runs tiny-arith (which no minute of CPU training learns: both score 0).
TASKS = {
    "lora": ("tiny-sentiment", "tiny-reviews", {"food", "films"}),
    "full": ("tiny-arith", "tiny-qa", {"addition", "subtraction"}),
    # GSM8K's format, scored by the GSM8K scorer on held-out word problems.
    "gsm8k": ("gsm8k-synth", "grade-school-arith", {"word_numbers"}),
}


@pytest.mark.timeout(1500)  # real training on 2 loaded cores (lora: three candidates): minutes, not 300 s
@pytest.mark.parametrize("example", ["lora", "full", "gsm8k"])
async def test_example_passes_for_real(
    example: str, nats_server: EmbeddedServer, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    settings = Settings(
        home=tmp_path / "home", assets_dir=real_assets, nats_url=nats_server.url, toolchain_bin=toolchain_bin,
        subject_prefix="e" + secrets.token_hex(4), log_format="json", log_level="WARNING",
        # The real toolchain in the real sandbox: every candidate-controlled run in a container.
        sandbox="docker", sandbox_image=require_sandbox(),
        # The default: both splits and the baseline on the bench worker's warm engine container.
        bench_engine="warm",
        # The LoRA example must beat the base model beyond noise; a null candidate (below) must not.
        # The full fine-tune runs under the default policy (`better`): it scores as its base model does,
        # and is refused (below); gsm8k under `llm`, the reference's meaning.
        judge_policy={"lora": "significant", "full": "better"}.get(example, "llm"),
    )
    pipeline = Pipeline(settings)
    try:
        await pipeline.start()
        seen: list[Progress] = []
        benchmark, dataset, subsets = TASKS[example]
        # The LoRA example opens a campaign: the null candidate and a copy of it follow in the same one.
        campaign = f"e2e-{secrets.token_hex(3)}" if example == "lora" else None
        task = TaskSpec(base_model="tiny-llama", benchmark=benchmark, involving_datasets=[dataset],
                        description="answer the benchmark's questions", campaign=campaign)
        rid = await pipeline.client.submit(REPO / "examples" / example, task)
        verdict = await pipeline.client.wait(rid, on_progress=seen.append, timeout_s=900)

        assert verdict.status == "completed", verdict.execution
        assert verdict.judge is not None and verdict.judge.rules_decision is True, verdict.execution  # all ran
        if example == "full":
            await _not_better_is_refused_by_default(settings, verdict, tmp_path)
        else:
            assert verdict.final_decision is True, verdict.execution
        metrics = verdict.result.training_metrics
        assert metrics.loss_history.train, "no loss history"
        assert metrics.final_loss is not None and metrics.initial_loss is not None
        bench = verdict.result.benchmark
        assert bench is not None and bench.accuracy_summary
        assert set(bench.accuracy_summary) == subsets
        baseline = verdict.result.baseline
        assert baseline is not None and baseline.difference is not None
        if example == "gsm8k":
            # The base model never writes `#### n`; the candidate does, on problems it never saw.
            assert bench.scorer == "gsm8k" and bench.primary_metric == "strict_match"
            assert baseline.baseline_value == 0.0, baseline
            assert baseline.candidate_value is not None and baseline.candidate_value >= 0.75, baseline
        if example == "lora":
            # The demo's claim: the base model never answers "positive"/"negative"; the candidate
            # does, on reviews it never saw (20 per subset: 0.5 is ten items, far beyond noise).
            assert baseline.baseline_value == 0.0, baseline
            assert baseline.candidate_value is not None and baseline.candidate_value >= 0.75, baseline
            assert baseline.difference >= 0.5, baseline
            # Paired over the same 40 validation items: significant, its interval excluding 0.
            paired = baseline.paired
            assert paired is not None and paired.items == 40 and paired.test == "mcnemar", baseline
            assert paired.ci_low > 0 and paired.p_value < 0.001 and paired.improves(), paired
            assert baseline.summary is not None and baseline.summary.startswith(
                f"better than the base model by +{paired.difference:.2f} (95% CI +"), baseline.summary
            assert bench.num_runs == 1 and bench.overall is not None and bench.overall.items == 40
            assert baseline.baseline.item_ids == bench.item_ids
            # First in its campaign: compared with the base model (no incumbent yet), accepted, the incumbent.
            check = verdict.result.campaign
            assert check is not None and (check.campaign, check.index, check.incumbent) == (campaign, 1, None)
            assert check.better and check.accepted, check
            assert check.summary.startswith("better than the base model (no incumbent yet) by +"), check.summary
        model_files = {a.path for a in verdict.artifacts}
        expected = "output/adapter_model.safetensors" if example == "lora" else "output/model.safetensors"
        assert expected in model_files
        assert "output/training_loss.png" in model_files  # plot_loss: true, kept and referenced
        assert "benchmark_test" not in verdict.model_dump()
        assert verdict.sandbox == f"docker:{settings.sandbox_image}"

        report = await pipeline.client.wait_report(rid, timeout_s=300)
        assert isinstance(report, Report)
        assert report.benchmark_test is not None and report.benchmark_test.accuracy_summary
        first = sorted(subsets)[0]
        assert set(report.benchmark_test.item_ids[first]).isdisjoint(bench.item_ids[first])

        steps = [p.step for p in seen if p.stage == "train" and p.step is not None]
        assert steps, "no training progress arrived"
        assert steps == sorted(steps)
        if example == "lora":
            assert campaign is not None
            # The pulled model's check needs lora only: it runs while the campaign's candidates go through
            # the pipeline (the null one, then the copy, in that order: their places in the campaign).
            await asyncio.gather(
                _pulled_model_answers_as_scored(pipeline, rid, verdict, real_assets, toolchain_bin, tmp_path),
                _the_campaign_after_lora(pipeline, settings, tmp_path, campaign, rid))
    finally:
        await pipeline.stop()


async def _not_better_is_refused_by_default(settings: Settings, verdict: Verdict, tmp_path: Path) -> None:
    """The default policy on the real pipeline: a candidate no better than its base model (the full
    fine-tune scores 0, as its base model does) is refused; the exit code of `ftbus get` and the
    dashboard's pill, in a real browser, say the same."""
    from tests.integration.test_dashboard import CHROMIUM, CHROMIUM_ARGS, _browser_missing, _start_dashboard
    from tests.integration.test_delivery import run_ftbus

    assert Settings.model_fields["judge_policy"].default == settings.judge_policy == "better"
    decision = verdict.result.decision
    assert decision is not None and decision.answer == "indistinguishable" and not decision.screened, decision
    assert verdict.final_decision is False, verdict.return_checking
    assert verdict.judge is not None and verdict.judge.policy == "better"
    assert verdict.judge.reason is not None and \
        "judge_policy=better accepts only a candidate better than the base model: not distinguishable" \
        in verdict.judge.reason
    assert f"[ftbus] Decision: indistinguishable. {decision.summary}." in verdict.return_checking
    code, out, err = await run_ftbus(settings, "get", verdict.request_id)
    assert code == 1, (out, err[-3000:])
    assert "decision: indistinguishable" in out, out
    missing = _browser_missing()
    if missing is not None:
        pytest.skip(f"the dashboard's half of this check needs a browser: {missing}")
    from playwright.async_api import async_playwright

    proc, url = await asyncio.to_thread(_start_dashboard, settings, tmp_path / "dashboard.log")
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                await page.goto(f"{url.rstrip('/')}/requests/{verdict.request_id}")
                pill = "#decision[data-decision='rejected']"
                await page.wait_for_selector(pill, timeout=90_000)
                assert await page.get_attribute(pill, "data-answer") == "indistinguishable"
                assert (await page.text_content(pill) or "").strip() == "rejected: not better"
                await page.wait_for_selector("#decision-summary[data-answer='indistinguishable']", timeout=90_000)
            finally:
                await browser.close()
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


async def _the_campaign_after_lora(pipeline: Pipeline, settings: Settings, tmp_path: Path, campaign: str,
                                   lora: str) -> None:
    """The null candidate, then a copy of lora, in lora's campaign; `ftbus compare` on lora and the null
    candidate runs while the copy goes through the pipeline."""
    null = await _null_candidate_is_noise(pipeline, tmp_path, campaign, lora)
    _, copy = await asyncio.gather(_compare_says_lora_beats_the_null_candidate(settings, lora, null),
                                   _a_copy_of_lora_is_not_distinguishable_from_it(pipeline, tmp_path, campaign, lora))
    await _the_campaign_shows_lora_as_its_incumbent(settings, campaign, lora, null, copy)


async def _null_candidate_is_noise(pipeline: Pipeline, tmp_path: Path, campaign: str, lora: str) -> str:
    """examples/lora with a learning rate of 0 (and 2 steps) learns nothing: its LoRA update stays 0,
    so it answers as the base model does. On the same warm engine and cached baseline, it is reported
    not distinguishable from the base model and refused by judge_policy=significant; in lora's
    campaign, it is worse than lora, the incumbent, whose request id the verdict names. Returns its id."""
    workspace = tmp_path / "null"
    shutil.copytree(REPO / "examples" / "lora", workspace)
    config = (workspace / "train.yaml").read_text()
    config = config.replace("learning_rate: 5.0e-3", "learning_rate: 0.0").replace("max_steps: 80", "max_steps: 2")
    assert "learning_rate: 0.0" in config and "max_steps: 2" in config
    (workspace / "train.yaml").write_text(config)
    task = TaskSpec(base_model="tiny-llama", benchmark="tiny-sentiment", involving_datasets=["tiny-reviews"],
                    campaign=campaign)
    null = await pipeline.client.submit(workspace, task)
    verdict = await pipeline.client.wait(null, timeout_s=900)
    assert verdict.status == "completed", verdict.execution
    assert verdict.judge is not None and verdict.judge.rules_decision is True  # every stage ran fine
    assert verdict.final_decision is False, verdict.return_checking
    baseline = verdict.result.baseline
    assert baseline is not None and baseline.paired is not None, baseline
    paired = baseline.paired
    assert paired.ci_low <= 0 <= paired.ci_high and not paired.improves(), paired
    assert baseline.summary is not None and baseline.summary.startswith("not distinguishable from the base model")
    assert verdict.judge.reason is not None and "beat the base model beyond noise: not distinguishable" \
        in verdict.judge.reason
    check = verdict.result.campaign
    assert check is not None and (check.index, check.incumbent) == (2, lora) and not check.accepted, check
    assert check.summary.startswith(f"worse than the incumbent {lora} by -"), check.summary
    assert f"the candidate is worse than the incumbent {lora} by -" in verdict.return_checking
    return null


async def _a_copy_of_lora_is_not_distinguishable_from_it(pipeline: Pipeline, tmp_path: Path, campaign: str,
                                                         lora: str) -> str:
    """A copy of lora, in its campaign: examples/lora with lora's own adapter (`ftbus pull`) as its start
    (adapter_name_or_path), trained 2 steps at a learning rate of 0, so it is lora's model and answers as
    lora does (training it again for 80 steps gives the same model, minutes later on a loaded machine). It
    beats the base model beyond noise (judge_policy=significant passes), but not the incumbent: refused, as
    not distinguishable from lora, which the verdict names. Returns its id."""
    from ftbus.pull import pull

    workspace = tmp_path / "copy"
    shutil.copytree(REPO / "examples" / "lora", workspace)
    pulled = await pull(pipeline.client, lora, tmp_path / "copy-adapter")
    shutil.copytree(pulled.path, workspace / "lora-adapter")
    config = (workspace / "train.yaml").read_text()
    config = config.replace("learning_rate: 5.0e-3", "learning_rate: 0.0").replace("max_steps: 80", "max_steps: 2")
    assert "learning_rate: 0.0" in config and "max_steps: 2" in config
    (workspace / "train.yaml").write_text(config + "adapter_name_or_path: lora-adapter\n")
    task = TaskSpec(base_model="tiny-llama", benchmark="tiny-sentiment", involving_datasets=["tiny-reviews"],
                    campaign=campaign)
    copy = await pipeline.client.submit(workspace, task)
    verdict = await pipeline.client.wait(copy, timeout_s=900)
    assert verdict.status == "completed", verdict.execution
    assert verdict.judge is not None and verdict.judge.rules_decision is True
    assert verdict.final_decision is False, verdict.return_checking
    baseline = verdict.result.baseline
    assert baseline is not None and baseline.paired is not None and baseline.paired.improves(), baseline
    check = verdict.result.campaign
    assert check is not None and (check.index, check.incumbent) == (3, lora) and not check.better, check
    assert check.summary.startswith(f"not distinguishable from the incumbent {lora}"), check.summary
    assert f"the candidate is not distinguishable from the incumbent {lora}" in verdict.return_checking
    assert verdict.judge.reason is not None and (
        f"campaign {campaign} accepts only a candidate that beats its incumbent beyond noise") in verdict.judge.reason
    return copy


async def _the_campaign_shows_lora_as_its_incumbent(settings: Settings, campaign: str, lora: str, null: str,
                                                   copy: str) -> None:
    """`ftbus campaign NAME --json` (the real CLI): lora the incumbent since it was accepted, then two refusals."""
    from tests.integration.test_delivery import run_ftbus

    code, out, err = await run_ftbus(settings, "campaign", campaign, "--json")
    assert code == 0, err[-3000:]
    shown = json.loads(out)
    assert shown["incumbent"] == lora and shown["incumbents"] == [lora]
    assert [(e["request_id"], e["incumbent"], e["accepted"]) for e in shown["history"]] == [
        (lora, None, True), (null, lora, False), (copy, lora, False)]


async def _compare_says_lora_beats_the_null_candidate(settings: Settings, lora: str, null: str) -> None:
    """`ftbus compare` (the real CLI) on the two requests: examples/lora better than the null candidate
    beyond noise, paired on their 40 shared validation items, with its interval; and the reverse."""
    from tests.integration.test_delivery import run_ftbus

    code, out, err = await run_ftbus(settings, "compare", lora, null)
    assert code == 0, err[-3000:]
    said = " ".join(out.split())
    match = re.match(rf"{lora} is better than {null} by \+([01]\.\d\d) \(95% CI \+([01]\.\d\d) to \+([01]\.\d\d), "
                     r"two-sided p = [0-9.e-]+, threshold 0\.05, 40 items\)", said)
    assert match, said
    difference, low, high = (float(g) for g in match.groups())
    assert 0 < low <= difference <= high
    code, out, err = await run_ftbus(settings, "compare", null, lora, "--json")
    assert code == 0, err[-3000:]
    reverse = json.loads(out)["paired"]
    assert reverse["items"] == 40 and reverse["ci_high"] < 0 and reverse["p_value"] < 0.001
    assert json.loads(out)["summary"].startswith(f"{null} is worse than {lora} by -")


async def _pulled_model_answers_as_scored(pipeline: Pipeline, rid: str, verdict: Verdict, assets: Path,
                                         toolchain_bin: Path, tmp_path: Path) -> None:
    """`ftbus pull` of the candidate: peft loads the adapter on the tiny base model (and transformers
    the merged model), and each generates, for every validation review of a subset, the answer the
    benchmark scored: the error sample's output where it was wrong, the gold answer where right."""
    from evaluation.models import has_chat_template
    from ftbus.pull import pull

    adapter = await pull(pipeline.client, rid, tmp_path / "adapter")
    assert adapter.model_kind == "lora"
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.json"} <= set(adapter.files)
    assert any(name.startswith("tokenizer") for name in adapter.files)
    merged = await pull(pipeline.client, rid, tmp_path / "merged", what="merged",
                        base_model=assets / "models" / "tiny-llama", python=str(toolchain_bin / "python"))
    assert "model.safetensors" in merged.files and "trainer_state.json" in merged.files

    bench = verdict.result.benchmark
    assert bench is not None
    subset = "food"
    items = {json.loads(line)["id"]: json.loads(line)
             for line in (assets / "benchmarks" / "tiny-sentiment" / f"{subset}.jsonl").read_text().splitlines()}
    reviews = [items[item_id] for item_id in bench.item_ids[subset]]  # the validation split, as scored
    wrong = {s.question: s.model_output for s in bench.error_samples}
    expected = [wrong.get(r["question"], r["answer"]).strip().lower() for r in reviews]
    job = {"base": str(assets / "models" / "tiny-llama"), "adapter": str(adapter.path), "merged": str(merged.path),
           "prompts": [r["question"] for r in reviews], "max_new_tokens": 16, "until": ["\n"],
           # as the bench stage decides it for lm-eval (evaluation/lmeval.py, chat_template_for)
           "chat": has_chat_template(assets / "models" / "tiny-llama")}
    proc = await asyncio.to_thread(
        subprocess.run, [str(toolchain_bin / "python"), str(Path(__file__).with_name("peft_generate.py"))],
        input=json.dumps(job), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    generated = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind in ("adapter", "merged"):
        answers = [text.strip().lower() for text in generated[kind]]
        assert answers == expected, (kind, list(zip(answers, expected, strict=True)))


async def test_the_opencompass_backend_runs_the_pipeline(
    nats_server: EmbeddedServer, real_assets: Path, toolchain_bin: Path, tmp_path: Path
) -> None:
    from evaluation.backends import opencompass_bin

    if opencompass_bin() is None:
        pytest.skip("the OpenCompass environment is not installed: run `make opencompass` (not part of make test)")
    settings = Settings(
        home=tmp_path / "home", assets_dir=real_assets, nats_url=nats_server.url, toolchain_bin=toolchain_bin,
        subject_prefix="o" + secrets.token_hex(4), log_format="json", log_level="WARNING",
        bench_backend="opencompass",
    )
    pipeline = Pipeline(settings)
    try:
        await pipeline.start()
        task = TaskSpec(base_model="tiny-llama", benchmark="tiny-arith", involving_datasets=["tiny-qa"])
        rid = await pipeline.client.submit(REPO / "examples" / "lora", task)
        verdict = await pipeline.client.wait(rid, timeout_s=900)
        assert verdict.final_decision is True, verdict.execution
        bench = verdict.result.benchmark
        assert bench is not None and set(bench.accuracy_summary) == {"addition", "subtraction"}
        # The benchmark section of the log is OpenCompass's, not lm-eval's.
        bench_log = verdict.raw_execution.split("=== BENCHMARK OUTPUT ===")[-1].lower()
        assert "opencompass" in bench_log and "lm_eval" not in bench_log
    finally:
        await pipeline.stop()
