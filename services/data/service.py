"""The data stage: pre-check the workspace, run ``process_data.py``, check and describe ``data.json``.

Consumes ``eval.requested``; returns a ``DataResult``, which its worker publishes on ``data.completed``
or ``data.failed``. The result is cached
by content (process_data.py, dataset_info.json, the declared datasets): a hit skips the run and
says ``cached: true``. Only successes are cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from pathlib import Path

from runners.base import EXIT_TIMEOUT, RunResult
from runners.sandbox import Sandbox
from services.data.cache import data_cache_key
from services.data.env import data_processing_env
from services.data.gateway import Budget, LlmGateway
from services.data.precheck import precheck
from services.data.stats import compute_data_stats
from services.data.validate import DataInvalid, load_data_json
from shared.artifacts import ArtifactStore, materialise
from shared.events import (
    ArtifactRef,
    DataResult,
    DataStats,
    DataSummary,
    EvalRequested,
    FailedStage,
    LlmUsage,
    Stage,
    StageOutcome,
)
from shared.logs import get_logger
from shared.modelpaths import ModelNotFound, resolve_base_model
from shared.paths import UnsafePath, regular_file_in
from shared.runtime import StageContext
from shared.stagespec import Grant, Grants, StageSpec

log = get_logger("ftbus.data")

DATA_FILE = "data.json"
STATS_FILE = "data_stats.json"


def _failed(event: EvalRequested, ctx: StageContext, error: str, summary: DataSummary | None = None,
            outcome: StageOutcome | None = None, *, precheck: bool = False) -> list[DataResult]:
    """The candidate failed here: in its pre-check (``precheck``: nothing ran), else in data processing
    (the stage's record name, which the worker sets)."""
    stage = FailedStage.precheck if precheck else None
    ctx.tell(failed_stage=stage or ctx.record_name, error=error)  # on the handling's `stage finished` line
    return [DataResult(request_id=event.request_id, ok=False, context=event.context, data=summary or DataSummary(),
                       failed_stage=stage, error=error, outcome=outcome)]


async def handle(event: EvalRequested, ctx: StageContext) -> list[DataResult]:
    settings = ctx.settings
    # Whose request it is comes from the subject the server let its publisher use, never from the
    # request's own text: every later stage reads it from here (the bench stage spends its budget).
    event = event.model_copy(update={"context": event.context.model_copy(
        update={"owner": ctx.subjects.owner_of(ctx.subject)})})
    context = event.context
    assets: Path = settings.assets

    problem = precheck(
        context, assets, max_bytes=settings.max_workspace_bytes, max_files=settings.max_workspace_files,
        max_config_bytes=settings.max_train_yaml_bytes,
    )
    if problem:
        return _failed(event, ctx, problem, precheck=True)

    workspace = ctx.workdir / "workspace"
    await materialise(ctx.artifacts, context.workspace, workspace)
    dataset_dirs = [assets / "datasets" / name for name in context.task.involving_datasets]
    key = await asyncio.to_thread(data_cache_key, workspace, dataset_dirs)
    cache_prefix = f"cache/data/{key}"

    cache = await ctx.bus.cache_artifacts()
    cached = await _cache_lookup(cache, cache_prefix)
    if cached is not None:
        cached_ref, stats = cached
        ctx.tell(cached=True, cache_key=key)
        # The request gets its own copy: later stages read only the shared artifact store.
        local = ctx.workdir / "cached-data.json"
        await cache.get_to_file(cached_ref, local)
        data_ref = await ctx.artifacts.put_file(f"{event.request_id}/data/{DATA_FILE}", local)
        stats_ref = await ctx.artifacts.put_bytes(
            f"{event.request_id}/data/{STATS_FILE}", stats.model_dump_json(indent=2).encode()
        )
        summary = DataSummary(data=data_ref, data_stats=stats, data_stats_ref=stats_ref, cached=True, cache_key=key)
        return [DataResult(request_id=event.request_id, ok=True, context=context, data=summary)]

    timeout = ctx.timeout(context)
    log_path = ctx.workdir / "data_processing.log"
    await ctx.progress(message="running process_data.py")
    # The worker's runner takes data_concurrent_runs runs at once (StageSpec.run_limit).
    run, llm_usage = await _run_process_data(
        ctx, workspace, timeout, log_path, [_base_model_dir(assets, context.task.base_model), *dataset_dirs]
    )
    log_ref = await ctx.artifacts.put_file(f"{event.request_id}/logs/data_processing.log", log_path)
    outcome = run.outcome(log_ref)
    summary = DataSummary(cache_key=key, llm_usage=llm_usage)
    if run.timed_out:
        return _failed(event, ctx, f"process_data.py timed out after {timeout:.0f} s (exit code {EXIT_TIMEOUT})",
                       summary, outcome)
    if run.exit_code != 0:
        return _failed(event, ctx, f"process_data.py exited with code {run.exit_code}", summary, outcome)

    try:
        # The sandbox wrote data.json: it must be a regular file of the workspace, not a link
        # that makes this worker read (and publish) a host file the candidate could not see.
        with contextlib.suppress(FileNotFoundError):  # load_data_json says what is missing
            regular_file_in(workspace, DATA_FILE)
        records = await asyncio.to_thread(load_data_json, workspace / DATA_FILE, settings.max_data_json_bytes)
    except UnsafePath as exc:
        return _failed(event, ctx, f"data.json refused: {exc}", summary, outcome)
    except DataInvalid as exc:
        return _failed(event, ctx, str(exc), summary, outcome)

    tokenizer = _tokenizer_of(assets, context.task.base_model)
    stats = await asyncio.to_thread(compute_data_stats, records, tokenizer, run.output_tail)
    stats_bytes = stats.model_dump_json(indent=2).encode()
    rid = event.request_id
    data_ref = await ctx.artifacts.put_file(f"{rid}/data/{DATA_FILE}", workspace / DATA_FILE)
    stats_ref = await ctx.artifacts.put_bytes(f"{rid}/data/{STATS_FILE}", stats_bytes)
    # Written after the request's own copies, and only on success: a failure is never cached.
    await cache.put_file(f"{cache_prefix}/{DATA_FILE}", workspace / DATA_FILE)
    await cache.put_bytes(f"{cache_prefix}/{STATS_FILE}", stats_bytes)
    summary = DataSummary(
        data=data_ref, data_stats=stats, data_stats_ref=stats_ref, cached=False, cache_key=key, llm_usage=llm_usage,
    )
    ctx.tell(samples=stats.total_samples, cached=False, cache_key=key)
    return [DataResult(request_id=rid, ok=True, context=context, data=summary, outcome=outcome)]


async def _run_process_data(
    ctx: StageContext, workspace: Path, timeout_s: float, log_path: Path, readable: list[Path | None]
) -> tuple[RunResult, LlmUsage | None]:
    """``python process_data.py`` in the sandbox, which may read the base model and the raw datasets.

    With an LLM configured and a container runner, the script reaches it only through a gateway
    of this run (services/data/gateway.py): the real key never enters the sandbox."""
    settings = ctx.settings
    assets: Path = settings.assets
    env = data_processing_env(settings, assets)
    mounts = readable
    isolated = ctx.runner.name != "local"
    if not (isolated and settings.openai_api_key and settings.openai_base_url):
        if isolated:  # no LLM configured: no network at all, and no key to hand out
            env.pop("OPENAI_API_KEY", None)
            env.pop("OPENAI_BASE_URL", None)
        sandbox = Sandbox.reading(*mounts)
        run = await ctx.runner.run(["python", "process_data.py"], cwd=workspace, env=env, timeout_s=timeout_s,
                                   log_path=log_path, tail_chars=settings.log_tail_chars, sandbox=sandbox)
        return run, None
    budget = Budget(settings.llm_budget_requests, settings.llm_budget_tokens,
                    min(settings.llm_budget_wall_s, timeout_s))
    # A short folder of its own: a Unix socket path is limited to 107 bytes, and the folder is
    # what the sandbox mounts (nothing else in it).
    socket_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="ftbus-llm-"))
    socket_path = socket_dir / "llm.sock"
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, socket_dir, True)
        gateway = await cleanup.enter_async_context(
            LlmGateway(socket_path, upstream=settings.openai_base_url, api_key=settings.openai_api_key, budget=budget)
        )
        sandbox = Sandbox.reading(*mounts, llm_socket=socket_path)
        env["OPENAI_API_KEY"] = gateway.token
        env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{sandbox.llm_port}/v1"
        run = await ctx.runner.run(["python", "process_data.py"], cwd=workspace, env=env, timeout_s=timeout_s,
                                   log_path=log_path, tail_chars=settings.log_tail_chars, sandbox=sandbox)
        usage = gateway.usage()
    log.info("LLM calls of process_data.py", calls=usage.requests, refused=usage.refused,
             tokens=usage.prompt_tokens + usage.completion_tokens)
    return run, usage


def _base_model_dir(assets: Path, base_model: str) -> Path | None:
    try:
        return resolve_base_model(assets, base_model)
    except ModelNotFound:
        return None


async def _cache_lookup(cache: ArtifactStore, prefix: str) -> tuple[ArtifactRef, DataStats] | None:
    data_ref = await cache.stat(f"{prefix}/{DATA_FILE}")
    stats_ref = await cache.stat(f"{prefix}/{STATS_FILE}")
    if data_ref is None or stats_ref is None:
        return None
    stats = DataStats.model_validate(json.loads(await cache.get_bytes(stats_ref)))
    return data_ref, stats


def _tokenizer_of(assets: Path, base_model: str) -> Path | None:
    model_dir = _base_model_dir(assets, base_model)
    candidate = model_dir / "tokenizer.json" if model_dir is not None else None
    return candidate if candidate is not None and candidate.is_file() else None


#: Its NATS user, for the comment above its rules (deploy/nats/accounts.conf).
_NATS_USER = (
    "`ftbus worker data`. NOTE: it runs the candidate's process_data.py as a child process (in the\n"
    "sandbox of docs/sandbox.md, or with the same uid and network), and a child can read its\n"
    "parent's environment (/proc/<ppid>/environ), FTBUS_NATS_URL included: treat this user as no\n"
    "more trusted than an agent. Same for train and bench (LlamaFactory/lm-eval run the\n"
    "candidate's config and model).\n"
    "\n"
    "`_INBOX.ftbus-wait-topology.>` (here and for every worker user): the init container of\n"
    "deploy/k8s (python -m ftbus.topology wait) connects as the worker's user under that name.\n"
    "Its only requests are STREAM.INFO, which every user may make anyway, so sharing that inbox\n"
    "between users shows nobody anything new. Nothing else may connect under that name."
)

SPEC = StageSpec(stage=Stage.data, label="data", handler=handle, sandboxed=True,
                 consumes=lambda s, pipeline: [s.eval_requested, s.eval_requested_by()], accepts=(EvalRequested,),
                 disk_quota=lambda settings: settings.data_disk_quota_bytes,
                 # Pre-checks and cache hits wait on the server, not the CPU; runs are limited apart.
                 concurrency=32, run_limit=lambda settings: settings.data_concurrent_runs,
                 result=DataResult, record_name=FailedStage.data_processing, words="data processing",
                 grants=Grants(
                     note=_NATS_USER,
                     artifacts=Grant("artifacts: read the workspace (metadata get + ordered consumer on the chunks) "
                                     "and write\ndata.json, data_stats.json (a cache hit's copies too) and logs; "
                                     "purge: replaced or\nfailed uploads"),
                     cache=Grant("the workers-only cache store: the data cache in/out (`cache/data/<key>/...`)")),
                 timeout=lambda settings: settings.data_timeout_s, next=Stage.train)
