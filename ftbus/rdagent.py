"""RD-Agent's fine-tuning evaluator, run by ftbus: install ``ftbus[rdagent]`` and set
``FT_RUNNER=ftbus.rdagent.FtbusFinetuneRunner`` (docs/rdagent.md).

``FtbusRunnerEvaluator`` takes the place of ``rdagent.scenarios.finetune.train.eval.FTRunnerEvaluator``:
instead of processing the data, training and benchmarking in the agent's own process, it sends the
implementation's files and the task (base model, benchmark, description, datasets) to ftbus, waits
for the verdict, and hands RD-Agent what its own evaluator would have:

- a ``CoSTEERSingleFeedback`` (``execution``, ``return_checking``, ``code``, ``final_decision``,
  ``raw_execution``), also set as ``implementation.feedback``;
- ``implementation.running_info.running_time``: the training stage's wall time, set once training
  ran (as RD-Agent sets it after its training command, whether that succeeded or not);
- ``implementation.running_info.result``, once training succeeded and the validation benchmark ran:
  ``{"benchmark": {"accuracy_summary", "error_samples"}, "benchmark_test": {...},
  "training_metrics": {"loss_history": {"train": [...], "eval": [...]}, "final_loss", "initial_loss"},
  "baseline_comparison": {...}}`` (ftbus's own key: the paired comparison with the base model on
  the validation items, its interval and p-value, and the repeated runs' statistics);
- ``data_stats.json`` injected into the workspace after data processing succeeded;
- the trained model's files in the workspace's ``output/`` after training succeeded (`ftbus pull`;
  setting ``rdagent_pull_model``, on by default).

``benchmark_test`` (the hidden test split; RD-Agent shows it in its UI and never gives it to the
agent) needs a NATS user allowed to read reports: set ``FTBUS_REPORT_NATS_URL`` (and, if that user's
inbox is not ``dashboard``, ``FTBUS_REPORT_CLIENT_NAME``). Without it ``benchmark_test`` is ``{}``.

The evaluator holds only settings (no connection: each ``evaluate`` opens its own), so it pickles
into RD-Agent's worker processes, and any number of parallel loops may share one ftbus.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from rdagent.app.finetune.llm.conf import FT_RD_SETTING
from rdagent.components.coder.CoSTEER import CoSTEER
from rdagent.components.coder.CoSTEER.evaluators import (
    CoSTEEREvaluator,
    CoSTEERMultiEvaluator,
    CoSTEERSingleFeedback,
)
from rdagent.components.coder.finetune.conf import FT_YAML_FILE_NAME
from rdagent.log import rdagent_logger as logger
from rdagent.scenarios.finetune.train.runner import (
    FTRunnerEvolvingStrategy,
    FTRunnerSettings,
    LLMFinetuneRunner,
)

from ftbus.client import Client
from shared.campaigns import campaign_name_from
from shared.events import (
    BaselineComparison,
    BenchmarkScores,
    CampaignCheck,
    FailedStage,
    Report,
    TrainingMetrics,
    Verdict,
)

# RD-Agent's UI finds the runner's feedback under its evaluator's tag.
LOG_TAG = "evaluator_feedback.FTRunnerEvaluator"
# Where a verdict says training never produced a model: RD-Agent then leaves running_info.result unset.
_NO_MODEL = {FailedStage.precheck, FailedStage.data_processing, FailedStage.training, FailedStage.cancelled}
_NO_DATA = {FailedStage.precheck, FailedStage.data_processing, FailedStage.cancelled}


class FtbusRunnerEvaluator(CoSTEEREvaluator):
    """A drop-in for RD-Agent's ``FTRunnerEvaluator`` that evaluates through ftbus."""

    def __init__(self, scen: Any = None, *, client: Client | None = None, timeout_s: float | None = None,
                 report_timeout_s: float = 120.0, campaign: str | None = None) -> None:
        """``client``: which ftbus (default ``Client()``: FTBUS_NATS_URL or the server `ftbus up`
        recorded). ``timeout_s``: give up waiting for a verdict after this long (default: never;
        ftbus's own stage timeouts and sweeper always end a request). ``campaign``: the campaign its
        candidates are judged in (default: the setting ``rdagent_campaign``, whose default ``trace``
        is this RD-Agent run's trace; ``off``: none)."""
        super().__init__(scen)
        self.client = client if client is not None else Client()
        self.timeout_s = timeout_s
        self.report_timeout_s = report_timeout_s
        self.campaign = campaign

    def campaign_name(self) -> str | None:
        """The campaign of the next candidate: the one given, else ``rdagent_campaign``: ``trace`` ->
        this run's trace (:func:`trace_campaign`), ``off`` -> None, another value -> that name."""
        chosen = self.campaign if self.campaign is not None else self.client.settings.rdagent_campaign
        if chosen == "off":
            return None
        return trace_campaign() if chosen == "trace" else chosen

    def evaluate(
        self,
        target_task: Any,
        implementation: Any,
        gt_implementation: Any = None,
        queried_knowledge: Any = None,
        **kwargs: Any,
    ) -> CoSTEERSingleFeedback:
        if FT_YAML_FILE_NAME not in implementation.file_dict:  # word for word RD-Agent's own check
            fb = CoSTEERSingleFeedback(
                execution=f"No {FT_YAML_FILE_NAME} found in workspace",
                return_checking="Config file missing",
                code="No valid configuration file",
                final_decision=False,
            )
            implementation.feedback = fb
            logger.log_object(fb, tag=LOG_TAG)
            return fb

        workspace_path = getattr(implementation, "workspace_path", None)
        verdict, train_seconds, report = self.client.run(
            lambda client: self._evaluate(client, target_task, dict(implementation.file_dict), workspace_path)
        )
        logger.info(f"ftbus verdict {verdict.request_id}: status={verdict.status} "
                    f"final_decision={verdict.final_decision} failed_stage={verdict.failed_stage}")
        apply_verdict(implementation, verdict, train_seconds, report)
        fb = feedback_of(verdict)
        implementation.feedback = fb
        logger.log_object(fb, tag=LOG_TAG)
        return fb

    async def _evaluate(
        self, client: Client, task: Any, files: dict[str, str], workspace_path: Path | None = None
    ) -> tuple[Verdict, float | None, Report | None]:
        with tempfile.TemporaryDirectory(prefix="ftbus-rdagent-") as tmp:
            workspace = write_files(Path(tmp), files)
            campaign = self.campaign_name()
            rid = await client.submit(
                workspace, base_model=task.base_model, benchmark=task.benchmark,
                description=getattr(task, "description", "") or "",
                datasets=list(getattr(task, "involving_datasets", None) or []),
                campaign=campaign,
            )
        logger.info(f"ftbus request {rid}: {task.base_model} on {task.benchmark}"
                    + (f", campaign {campaign}" if campaign else ""))
        verdict = await client.wait(rid, timeout_s=self.timeout_s)
        view = await client.status(rid)
        timing = view.stages.get("train") if view is not None else None
        train_seconds = timing.duration_s if timing is not None else None
        if workspace_path is not None and client.settings.rdagent_pull_model:
            await pull_model_into(client, verdict, Path(workspace_path) / "output")
        return verdict, train_seconds, await self._report(client, rid)

    async def _report(self, client: Client, request_id: str) -> Report | None:
        settings = client.settings
        if not settings.report_nats_url:
            return None
        reader = Client(settings=settings.model_copy(
            update={"nats_url": settings.report_nats_url, "client_name": settings.report_client_name}))
        async with reader:
            return await reader.wait_report(request_id, timeout_s=self.report_timeout_s)


class FtbusFinetuneRunner(LLMFinetuneRunner):
    """RD-Agent's ``LLMFinetuneRunner`` with ``FtbusRunnerEvaluator`` in place of ``FTRunnerEvaluator``:
    what ``FT_RUNNER`` names. Everything else (settings, evolving strategy, loop limits) is RD-Agent's."""

    def __init__(self, scen: Any, *args: Any, **kwargs: Any) -> None:
        eva = CoSTEERMultiEvaluator(single_evaluator=[FtbusRunnerEvaluator(scen=scen)], scen=scen)
        settings = FTRunnerSettings()
        es = FTRunnerEvolvingStrategy(scen=scen, settings=settings, improve_mode=True)
        CoSTEER.__init__(  # LLMFinetuneRunner.__init__ builds its own evaluator: skip it, keep the rest
            self,
            *args,
            settings=settings,
            eva=eva,
            es=es,
            evolving_version=2,
            scen=scen,
            max_loop=getattr(FT_RD_SETTING, "runner_max_loop", 1),
            stop_eval_chain_on_fail=True,
            **kwargs,
        )


def trace_campaign() -> str | None:
    """This RD-Agent run's campaign: ``rdagent-<its trace folder's name>``. The trace is the run's log
    folder (``LOG_TRACE_PATH``, by default ``log/<start time>``), which every loop of the run writes,
    worker processes included, and which a resumed run takes up again: so a run's candidates, over
    all its loops, are one campaign, and each must beat the run's incumbent."""
    path = getattr(getattr(logger, "storage", None), "path", None)
    if path is None:
        return None
    return campaign_name_from(Path(path).name, prefix="rdagent-")


async def pull_model_into(client: Client, verdict: Verdict, output: Path) -> None:
    """After a successful training, the model's files in the workspace's ``output/``, as RD-Agent's
    own evaluator leaves them there (its checks look for ``*.safetensors`` and ``adapter_*``). The
    folder is replaced, as a new training run overwrites it. A pull that fails is logged: the
    verdict stands without the files."""
    from ftbus.pull import OUTPUT_PREFIX, PullError

    if verdict.failed_stage in _NO_MODEL or not any(a.path.startswith(OUTPUT_PREFIX) for a in verdict.artifacts):
        return
    if output.exists():
        shutil.rmtree(output)
    try:
        pulled = await client.pull(verdict.request_id, output)
    except (PullError, OSError) as exc:
        logger.warning(f"ftbus request {verdict.request_id}: the trained model could not be downloaded into "
                       f"{output}: {exc}")
        return
    logger.info(f"ftbus request {verdict.request_id}: {len(pulled.files)} model files in {output}")


# ---------------------------------------------------------------------- verdict -> RD-Agent's shapes


def write_files(root: Path, files: dict[str, str]) -> Path:
    """The implementation's files (``FBWorkspace.file_dict``) as a folder ftbus can upload."""
    for name, content in files.items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"workspace file {name!r} is outside the workspace")
        path = root.joinpath(*rel.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else str(content), encoding="utf-8")
    return root


def feedback_of(verdict: Verdict) -> CoSTEERSingleFeedback:
    fb = CoSTEERSingleFeedback(
        execution=verdict.execution,
        return_checking=verdict.return_checking,
        code=verdict.code,
        final_decision=verdict.final_decision,
    )
    fb.raw_execution = verdict.raw_execution
    return fb


def benchmark_result(scores: BenchmarkScores | None) -> dict[str, Any]:
    """What RD-Agent's ``run_benchmark`` returns: ``{"accuracy_summary", "error_samples"}``."""
    if scores is None:
        return {}
    return {
        "accuracy_summary": {ds: dict(metrics) for ds, metrics in scores.accuracy_summary.items()},
        # RD-Agent reads exactly these three keys; ftbus's own ``extracted`` stays in the report.
        "error_samples": [
            {"question": s.question, "gold": s.gold, "model_output": s.model_output} for s in scores.error_samples
        ],
    }


def baseline_comparison(baseline: BaselineComparison | None, scores: BenchmarkScores | None) -> dict[str, Any]:
    """ftbus's own addition, beside the keys RD-Agent reads: the validation split against the base
    model, paired over the same items (the interval, the p-value, the words), and the repeated runs."""
    out: dict[str, Any] = {}
    if scores is not None:
        out["num_runs"] = scores.num_runs
        out["seed"] = scores.seed
        if scores.overall is not None:
            out["overall"] = scores.overall.model_dump()
    if baseline is None:
        return out
    out |= {"primary_metric": baseline.primary_metric, "candidate": baseline.candidate_value,
            "baseline": baseline.baseline_value, "difference": baseline.difference, "summary": baseline.summary}
    paired = baseline.paired
    if paired is not None:
        out |= {"items": paired.items, "paired_difference": paired.difference, "ci_low": paired.ci_low,
                "ci_high": paired.ci_high, "level": paired.level, "p_value": paired.p_value, "test": paired.test,
                "bootstrap_seed": paired.seed, "better_beyond_noise": paired.improves()}
    return out


def campaign_result(check: CampaignCheck | None) -> dict[str, Any]:
    """ftbus's own too: the candidate against its campaign's incumbent (empty without a campaign)."""
    if check is None:
        return {}
    paired = check.paired
    return {"campaign": check.campaign, "incumbent": check.incumbent, "index": check.index, "level": check.level,
            "better_than_incumbent": check.better, "accepted": check.accepted, "summary": check.summary,
            "paired_difference": paired.difference if paired else None, "p_value": paired.p_value if paired else None}


def training_metrics(metrics: TrainingMetrics) -> dict[str, Any]:
    """RD-Agent's ``extract_loss_history`` and the two losses it derives from it."""
    history = metrics.loss_history
    loss_history = {
        "train": [{"step": p.step, "epoch": p.epoch, "loss": p.loss} for p in history.train],
        "eval": [{"step": p.step, "epoch": p.epoch, "eval_loss": p.eval_loss} for p in history.eval],
    }
    train = loss_history["train"]
    return {
        "loss_history": loss_history,
        "final_loss": train[-1]["loss"] if train else None,
        "initial_loss": train[0]["loss"] if train else None,
    }


def apply_verdict(implementation: Any, verdict: Verdict, train_seconds: float | None,
                  report: Report | None = None) -> None:
    """Fill ``implementation`` as RD-Agent's evaluator leaves it after the same outcome."""
    stats = verdict.result.data_stats
    if stats is not None and stats.total_samples > 0 and verdict.failed_stage not in _NO_DATA:
        implementation.inject_files(**{"data_stats.json": json.dumps({
            "total_samples": stats.total_samples,
            "token_stats": {col: s.model_dump() for col, s in stats.token_stats.items()},
            "stdout_summary": stats.stdout_summary,
        }, indent=2)})
    if train_seconds is not None:
        implementation.running_info.running_time = train_seconds
    if verdict.failed_stage in _NO_MODEL or verdict.result.benchmark is None:
        return
    implementation.running_info.result = {
        "benchmark": benchmark_result(verdict.result.benchmark),  # agent-visible: SOTA judgment
        "benchmark_test": benchmark_result(report.benchmark_test if report else None),  # UI only
        "training_metrics": training_metrics(verdict.result.training_metrics),
        # ftbus's own (RD-Agent's readers ignore it): the validation comparison with the base model, and
        # with the campaign's incumbent when there is a campaign.
        "baseline_comparison": {**baseline_comparison(verdict.result.baseline, verdict.result.benchmark),
                                **({"campaign": campaign_result(verdict.result.campaign)}
                                   if verdict.result.campaign is not None else {}),
                                # The decision final_decision rests on under judge_policy=better (docs/rdagent.md).
                                **({"decision": verdict.result.decision.model_dump(mode="json")}
                                   if verdict.result.decision is not None else {}),
                                "judge_policy": verdict.judge.policy if verdict.judge is not None else None},
    }
