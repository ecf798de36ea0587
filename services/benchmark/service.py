"""The benchmark stage: the validation and the hidden test split, in parallel, plus the baseline.

Consumes ``train.completed``. Returns the validation split's ``BenchResult`` (its worker publishes it on
``bench.completed``/``bench.failed``, read by the judge) and the test split's as an ``Outgoing`` on
``bench.test`` (its own stream, read by the aggregator only).
The base model's scores are computed once per (model, benchmark, split manifest, backend) and
cached in the artifact store, so the verdict can show the candidate beside the baseline.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evaluation.backends import LABELS, LOG_FILES, OUTPUT_ERRORS, PREPARE_ERRORS, parse_run, prepare_run
from evaluation.grading import GradingUnavailable, grade_split
from evaluation.inference import InferenceConfig, InferenceError, inference_for
from evaluation.models import ModelSelection, select_model
from evaluation.registry import BenchmarkError, BenchmarkSpec, load_benchmark
from evaluation.resume import SplitJournal, journal_prefix
from evaluation.runs import effective_runs
from evaluation.splits import SplitManifest, make_split
from evaluation.warm import EnginePolicy, WarmRun, WarmSplit, engine_for
from runners.base import EXIT_TIMEOUT, RunResult, thread_env
from runners.sandbox import Sandbox
from services.benchmark.confirm import Scored, run_key, with_decision
from services.benchmark.models import Incumbents, trained_model
from shared.artifacts import ArtifactStore
from shared.events import (
    ArtifactRef,
    BaselineComparison,
    BenchmarkScores,
    BenchResult,
    FailedStage,
    Stage,
    StageOutcome,
    TrainResult,
)
from shared.logs import get_logger
from shared.modelpaths import ModelNotFound, resolve_base_model
from shared.paired import compare_scores
from shared.runtime import Outgoing, StageContext
from shared.stagespec import Grant, Grants, StageSpec

log = get_logger("ftbus.benchmark")

SplitName = Literal["validation", "test"]
#: v2: per-item outcomes in every baseline, and the key holds num_runs and the sampling settings whatever they are.
BASELINE_FORMAT = "ftbus-baseline-v2"
#: The seed every generation runs with (lm-eval's random, numpy and torch seeds), recorded in the scores.
SAMPLING_SEED = 0


@dataclass
class SplitRun:
    scores: BenchmarkScores | None
    outcome: StageOutcome | None
    error: str | None
    #: Items whose answers came from an interrupted attempt's journal (None: none).
    resumed_items: int | None = None


def detect_device(setting: str) -> str:
    """``auto`` is decided on the worker that runs the model (not on whoever submitted)."""
    if setting != "auto":
        return setting
    has_gpu = Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None
    return "cuda" if has_gpu else "cpu"


async def handle(event: TrainResult, ctx: StageContext) -> list[BenchResult | Outgoing]:
    settings = ctx.settings
    task = event.context.task
    try:
        spec = load_benchmark(settings.assets, task.benchmark)
        base_model = Path(event.train.base_model_path or resolve_base_model(settings.assets, task.base_model))
        # The candidate generates as its base model does, and so does its baseline.
        inference = inference_for(settings, base_model)
        if not spec.scored_by_lm_eval and settings.bench_backend != "lm-eval":
            raise BenchmarkError(f"benchmark {spec.name} (scorer {spec.scorer_name}) is scored from lm-eval's "
                                 f"generations: set bench_backend to lm-eval")
        runs, _ = effective_runs(spec, task.num_runs)
        if runs > 1 and settings.bench_backend != "lm-eval":
            raise BenchmarkError(f"num_runs {runs} needs bench_backend lm-eval (repeated runs are lm-eval's repeats)")
        # The candidate and its baseline sample each item as often (the baseline cache keys on it).
        inference = inference.model_copy(update={"num_runs": runs})
    except (BenchmarkError, ModelNotFound, InferenceError) as exc:
        error = str(exc)
        return [_result(event, ctx, split, SplitRun(None, None, error), None) for split in ("validation", "test")]

    model = await trained_model(await ctx.bus.models_artifacts(), event.train.outputs, ctx.workdir, base_model)
    if isinstance(model, str):
        return [_result(event, ctx, split, SplitRun(None, None, model), None) for split in ("validation", "test")]
    device = detect_device(settings.bench_device)
    if settings.bench_backend == "lm-eval" and settings.bench_engine == "warm":
        return await _handle_warm(ctx, event, spec, model, base_model, device, inference)

    async def one_split(split: SplitName) -> list[BenchResult | Outgoing]:
        manifest = make_split(spec, split, spec.max_items(settings.bench_max_items))
        candidate = await _run_split(ctx, event, spec, manifest, model, device, inference, label=split)
        baseline = None
        if candidate.scores is not None:
            baseline = await _baseline(ctx, event, spec, manifest, base_model, device, inference)
        return [_result(event, ctx, split, candidate, _compare(candidate.scores, baseline))]

    async def score_items(manifest: SplitManifest, who: Scored, label: str) -> BenchmarkScores | None:
        if who == "base":
            return await _baseline(ctx, event, spec, manifest, base_model, device, inference)
        scored = model if who == "candidate" else await incumbents.model(who)
        return (await _run_split(ctx, event, spec, manifest, scored, device, inference, label=label)).scores

    incumbents = Incumbents(ctx, base_model)
    validation, test = await asyncio.gather(one_split("validation"), one_split("test"))
    return await with_decision(ctx, event, spec, validation + test, score_items,
                               run_key(device, settings.bench_backend, inference))


def _result(
    event: TrainResult,
    ctx: StageContext,
    split: SplitName,
    run: SplitRun,
    baseline: BaselineComparison | None,
) -> BenchResult | Outgoing:
    """The validation split's result (the worker routes it to ``bench.completed`` or ``bench.failed``),
    or the test split's, on ``bench.test``: an event outside the stage's results (in its spec's ``emits``)."""
    result = BenchResult(
        request_id=event.request_id,
        ok=run.error is None,
        split=split,
        context=event.context,
        data=event.data,
        train=event.train,
        benchmark=run.scores,
        baseline=baseline,
        outcome=run.outcome,
        error=run.error,
        resumed_items=run.resumed_items,
    )
    return Outgoing(ctx.subjects.bench_test, result, "test") if split == "test" else result


async def _run_split(
    ctx: StageContext,
    event: TrainResult,
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    model: ModelSelection,
    device: str,
    inference: InferenceConfig,
    *,
    label: str,
) -> SplitRun:
    settings = ctx.settings
    backend = settings.bench_backend
    name = LABELS[backend]
    run_dir = ctx.workdir / f"bench-{label}"
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        argv, prepared_env, output_dir = prepare_run(
            backend, spec, manifest, run_dir, model=model, device=device, settings=settings, inference=inference
        )
    except PREPARE_ERRORS as exc:
        return SplitRun(None, None, f"{name} ({label}) cannot run: {exc}")
    timeout = ctx.timeout(event.context)
    log_path = run_dir / LOG_FILES[backend]
    await ctx.progress(message=f"{label}: {name} on {sum(len(v) for v in manifest.item_ids.values())} items")
    env = dict(prepared_env)
    if device == "cpu":
        # The two splits run at once: give each half the CPUs a run may use (sandbox_cpus, else the
        # host's), or torch's thread pools fight.
        env = {**thread_env((settings.sandbox_cpus or os.cpu_count() or 2) / 2), **env}
    # The backend's working folder is the run folder: OpenCompass writes ./tmp and friends there.
    # The sandbox sees this split's run folder (its data and task files, written above) and the
    # model, read-only: not the benchmark's other split, not the assets.
    run = await ctx.runner.run(
        argv, cwd=run_dir, env=env, timeout_s=timeout, log_path=log_path,
        tail_chars=settings.log_tail_chars, sandbox=Sandbox.reading(model.pretrained, model.peft, gpus=True),
    )
    return await _score_split(ctx, event, spec, manifest, run, output_dir, model, inference, label=label)


async def _score_split(
    ctx: StageContext,
    event: TrainResult,
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    run: RunResult,
    output_dir: Path,
    model: ModelSelection,
    inference: InferenceConfig,
    *,
    label: str,
    engine_error: str | None = None,
) -> SplitRun:
    """Store a finished run's log (the test split's privately) and read its scores."""
    settings = ctx.settings
    backend = settings.bench_backend
    name = LABELS[backend]
    timeout = run.timeout_s
    store = await _store_for(ctx, manifest)
    log_ref: ArtifactRef = await store.put_file(f"{event.request_id}/logs/benchmark-{label}.log", run.log_path)
    outcome = run.outcome(log_ref)
    if run.timed_out:
        error = f"benchmark ({label}) timed out after {timeout:.0f} s (exit code {EXIT_TIMEOUT})"
        return SplitRun(None, outcome, error)
    if run.exit_code != 0:
        detail = f": {engine_error}" if engine_error else ""
        return SplitRun(None, outcome, f"{name} ({label}) exited with code {run.exit_code}{detail}")
    try:
        if spec.scored_by_lm_eval:
            scores = await asyncio.to_thread(
                parse_run, backend, output_dir, spec, manifest, settings.max_error_samples, settings.error_sample_seed
            )
            scores = scores.model_copy(update={"scorer": spec.scorer_name})
        else:
            # ftbus's own scorers, on the text the engine generated (the code scorer runs it in the
            # code executor's containers: never in the engine or this worker).
            scores = await grade_split(spec, manifest, output_dir, settings=settings, inference=inference,
                                       tokenizer_dir=model.pretrained)
    except OUTPUT_ERRORS as exc:
        return SplitRun(None, outcome, f"{name} ({label}) output unreadable: {exc}")
    except GradingUnavailable as exc:
        return SplitRun(None, outcome, f"benchmark ({label}): {exc}")
    # The request's own note (its num_runs not used), never in a baseline that other requests share.
    runs_note = None if label.startswith("baseline") else effective_runs(spec, event.context.task.num_runs)[1]
    scores = scores.model_copy(update={"seed": SAMPLING_SEED, "notes": [*scores.notes, *filter(None, [runs_note])]})
    if not scores.accuracy_summary:
        return SplitRun(scores, outcome, f"{name} ({label}) produced no metrics")
    log.info("split scored", split=label, primary=scores.primary_metric, value=scores.primary_value)
    return SplitRun(scores, outcome, None)


async def _handle_warm(
    ctx: StageContext,
    event: TrainResult,
    spec: BenchmarkSpec,
    model: ModelSelection,
    base_model: Path,
    device: str,
    inference: InferenceConfig,
) -> list[BenchResult | Outgoing]:
    """Both splits on the worker's warm engine: one job (one model load) for the candidate's
    validation and test splits, then one for the base model's uncached baselines."""
    settings = ctx.settings
    engine = engine_for(ctx.runner, settings)
    timeout = ctx.timeout(event.context)
    per_split = spec.max_items(settings.bench_max_items)
    manifests = {split: make_split(spec, split, per_split) for split in ("validation", "test")}
    name = LABELS[settings.bench_backend]

    async def announce(split: WarmSplit) -> None:
        items = sum(len(v) for v in split.manifest.item_ids.values())
        await ctx.progress(message=f"{split.label}: {name} on {items} items (warm engine)")

    async def score(splits: dict[str, WarmSplit], runs: dict[str, WarmRun], scored: ModelSelection,
                    ) -> dict[str, SplitRun]:
        scored_runs = {}
        for label, split in splits.items():
            scored_runs[label] = await _score_split(ctx, event, spec, split.manifest, runs[label].result,
                                                    runs[label].output_dir, scored, inference, label=label,
                                                    engine_error=runs[label].error)
            scored_runs[label].resumed_items = await _say_resumed(ctx, label, runs[label])
        return scored_runs

    # Each split's journal, the baselines' included (docs/benchmarks.md, "Resuming an interrupted
    # run"). Test-split answers are kept where the test split's logs are (ftbus_private), validation
    # ones in the workers' cache store: never where the judge or agents read.
    journals: dict[str, SplitJournal] = {}
    for split, manifest in manifests.items():
        for label in (split, f"baseline-{split}"):
            prefix = journal_prefix(event.request_id, label, manifest, device, SAMPLING_SEED, inference)
            journals[label] = SplitJournal(await _cache_store_for(ctx, manifest), prefix)

    candidate = {split: WarmSplit(split, manifests[split], journals[split]) for split in ("validation", "test")}
    candidate_runs = await engine.run(spec, model, list(candidate.values()), ctx.workdir, device=device,
                                      timeout_s=timeout, on_split=announce, seed=SAMPLING_SEED, inference=inference)
    results = await score(candidate, candidate_runs, model)

    baselines: dict[str, BenchmarkScores | None] = {}
    uncached: dict[str, WarmSplit] = {}
    cache_names: dict[str, str] = {}
    for split, manifest in manifests.items():
        if results[split].scores is None:
            continue
        cache_names[split], baselines[split] = await _cached_baseline(ctx, manifest, base_model, device, inference)
        if baselines[split] is None:
            uncached[f"baseline-{split}"] = WarmSplit(f"baseline-{split}", manifest, journals[f"baseline-{split}"])
    if uncached:
        base = select_model(base_model, None)
        base_runs = await engine.run(spec, base, list(uncached.values()), ctx.workdir,
                                     device=device, timeout_s=timeout, on_split=announce, seed=SAMPLING_SEED,
                                     inference=inference)
        for label, run in (await score(uncached, base_runs, base)).items():
            split = uncached[label].manifest.split
            if run.scores is None:
                log.warning("baseline run failed", split=split, error=run.error)
                continue
            store = await _cache_store_for(ctx, uncached[label].manifest)
            await store.put_bytes(cache_names[split], run.scores.model_dump_json().encode())
            baselines[split] = run.scores

    async def score_items(manifest: SplitManifest, who: Scored, label: str) -> BenchmarkScores | None:
        """A pool batch on the warm engine (the base model's pool once, then cached privately)."""
        cache_name = None
        if who == "base":
            cache_name, cached = await _cached_baseline(ctx, manifest, base_model, device, inference)
            if cached is not None:
                return cached
        scored = (select_model(base_model, None) if who == "base" else model if who == "candidate"
                  else await incumbents.model(who))
        split = WarmSplit(label, manifest)
        runs = await engine.run(spec, scored, [split], ctx.workdir, device=device, timeout_s=timeout,
                                on_split=announce, seed=SAMPLING_SEED, inference=inference)
        run = (await score({label: split}, runs, scored))[label]
        if cache_name is not None and run.scores is not None:
            await (await _cache_store_for(ctx, manifest)).put_bytes(cache_name, run.scores.model_dump_json().encode())
        return run.scores

    incumbents = Incumbents(ctx, base_model)
    decided = await with_decision(
        ctx, event, spec,
        [_result(event, ctx, split, results[split], _compare(results[split].scores, baselines.get(split)))
         for split in ("validation", "test")],
        score_items, run_key(device, settings.bench_backend, inference))
    # The request's benchmark is over: its results are about to be stored, its journals not needed
    # (a baseline's too, which a lost attempt may have cached before it was lost).
    for journal in journals.values():
        await journal.clear()
    return decided


async def _say_resumed(ctx: StageContext, label: str, run: WarmRun) -> int | None:
    """Log and show a split that took answers from an interrupted attempt; return its item count."""
    resume = run.resume
    if resume is None or resume["requests"] == resume["generated"]:
        return None
    message = f"resumed the benchmark: {resume['items']} of {resume['of']} items already done"
    log.info(message, split=label, requests=resume["requests"], generated=resume["generated"])
    await ctx.progress(message=f"{label}: {message}")
    return int(resume["items"])


def model_fingerprint(model_dir: Path) -> str:
    """Identifies a base model without hashing gigabytes: configs and tokenizer by content,
    weights by name and size."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        digest.update(path.name.encode())
        if path.suffix in {".json", ".model", ".txt", ".jinja"} and path.stat().st_size < 32 * 2**20:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        else:
            digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()


def baseline_key(model_dir: Path, manifest: SplitManifest, device: str, backend: str = "lm-eval",
                 inference: InferenceConfig | None = None) -> str:
    parts: list[object] = [BASELINE_FORMAT, model_fingerprint(model_dir), manifest.model_dump(mode="json"), device,
                           SAMPLING_SEED]
    # A baseline generated one way (greedy or sampled, with how many runs per item) is never compared
    # with a candidate generated another way.
    parts.append((inference or InferenceConfig(greedy=True)).model_dump(mode="json"))
    if backend != "lm-eval":  # backends score multiple choice differently: never share a baseline
        parts.append(backend)
    payload = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


async def _baseline(
    ctx: StageContext,
    event: TrainResult,
    spec: BenchmarkSpec,
    manifest: SplitManifest,
    base_model: Path,
    device: str,
    inference: InferenceConfig,
) -> BenchmarkScores | None:
    name, cached = await _cached_baseline(ctx, manifest, base_model, device, inference)
    if cached is not None:
        return cached
    store = await _cache_store_for(ctx, manifest)
    run = await _run_split(ctx, event, spec, manifest, select_model(base_model, None), device, inference,
                           label=f"baseline-{manifest.split}")
    if run.scores is None:
        # The candidate's verdict does not depend on it: report it missing, never fail for it.
        log.warning("baseline run failed", split=manifest.split, error=run.error)
        return None
    await store.put_bytes(name, run.scores.model_dump_json().encode())
    return run.scores


async def _cached_baseline(
    ctx: StageContext, manifest: SplitManifest, base_model: Path, device: str, inference: InferenceConfig,
) -> tuple[str, BenchmarkScores | None]:
    """The baseline cache's object name for this split, and the scores cached there, if any."""
    key = await asyncio.to_thread(baseline_key, base_model, manifest, device, ctx.settings.bench_backend, inference)
    name = f"cache/baseline/{key}/scores.json"
    store = await _cache_store_for(ctx, manifest)
    ref = await store.stat(name)
    if ref is None:
        return name, None
    return name, BenchmarkScores.model_validate_json(await store.get_bytes(ref))


async def _store_for(ctx: StageContext, manifest: SplitManifest) -> ArtifactStore:
    """Anything about the hidden test split or the confirmation pool (logs, baselines) goes to the
    private store, which agents and the judge cannot read."""
    return await ctx.bus.private_artifacts() if manifest.split != "validation" else ctx.artifacts


async def _cache_store_for(ctx: StageContext, manifest: SplitManifest) -> ArtifactStore:
    """Baselines are caches: validation ones in the workers-only cache store, test and pool ones private."""
    return await ctx.bus.private_artifacts() if manifest.split != "validation" else await ctx.bus.cache_artifacts()


def _compare(candidate: BenchmarkScores | None, baseline: BenchmarkScores | None) -> BaselineComparison | None:
    if candidate is None or baseline is None:
        return None
    difference = None
    if candidate.primary_value is not None and baseline.primary_value is not None:
        difference = candidate.primary_value - baseline.primary_value
    paired, summary = compare_scores(candidate, baseline)
    return BaselineComparison(
        baseline=baseline,
        primary_metric=candidate.primary_metric,
        candidate_value=candidate.primary_value,
        baseline_value=baseline.primary_value,
        difference=difference,
        paired=paired,
        summary=summary,
    )


SPEC = StageSpec(
    stage=Stage.bench,
    label="benchmark",
    # The test split goes to its own stream, which only the aggregator reads (an Outgoing of its own).
    emits=lambda s: [s.completed("bench"), s.failed("bench"), s.bench_test],
    handler=handle,
    sandboxed=True,
    fair_share=True,  # a GPU stage: campaigns take turns (shared/lanes.py)
    # The worker's warm engine (evaluation/warm.py) stops with it.
    extra_policies=lambda: (EnginePolicy(),),
    result=BenchResult,
    record_name=FailedStage.benchmark,
    words="benchmark",
    grants=Grants(
        note="`ftbus worker bench` (GPU nodes). It PRODUCES the test split's result: it publishes\n"
             "{s.bench_test} (stored by {s.stream_test}, which it never reads back), keeps both\n"
             "BenchResults in its own results bucket, and writes the test split's logs and baseline cache\n"
             "to {s.object_store_private} (and reads the cache back), as it does the hidden confirmation\n"
             "pool's logs, baseline and decisions. The validation split's baseline cache is in\n"
             "{s.object_store_cache} (read and write).",
        artifacts=Grant("artifacts: validation logs out"),
        models=Grant("the trained outputs in, from {s.object_store_models}", write=False),
        private=Grant("the private store: test-split logs out, the test baseline cache in/out"),
        cache=Grant("the workers-only cache store: the validation baseline cache in/out\n"
                    "(`cache/baseline/<key>/scores.json`)"),
        campaigns=Grant("the campaigns ({s.kv_campaigns}), read only: a candidate's campaign's incumbent\n"
                        "(its validation scores and trained outputs), the reference it is confirmed against",
                        write=False),
        owners=Grant("the owners' error budgets ({s.kv_owners}): read an owner's, write it back by\n"
                     "compare-and-set after a confirmation on the hidden pool (services/benchmark/confirm.py)"),
    ),
    # One split's limit; two splits, one after the other.
    timeout=lambda settings: settings.bench_timeout_s,
    serial_runs=2,
    next=Stage.judge,
)
