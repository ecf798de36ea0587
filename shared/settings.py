"""Settings: ``FTBUS_*`` environment variables, then an optional YAML file, then defaults.

Every setting has a default that works on one machine. The YAML file is named by
``FTBUS_CONFIG`` (or ``--config`` on the CLI); its keys are the field names below.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

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
    client_name: str = Field(
        default="ftbus-client",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Connection name of the CLI and Python client; replies come to _INBOX.<client_name>.>, "
        "so NATS permissions can keep an agent's client from reading a dashboard's (e.g. `dashboard`).",
    )
    ack_wait_s: float = Field(default=60.0, gt=0, description="Redelivery deadline of an unacked message.")
    heartbeat_s: float = Field(default=15.0, gt=0, description="in_progress() interval; keep < ack_wait_s.")
    max_deliver: int = Field(default=5, ge=1, description="Attempts before a message is dead-lettered.")
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
        default_factory=lambda: ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HOME"],
        description="Host variables that candidate processes may see; everything else is scrubbed.",
    )
    train_command: str = Field(default="llamafactory-cli train train.yaml")
    bench_backend: Literal["lm-eval", "opencompass"] = Field(
        default="lm-eval",
        description="Benchmark runner: lm-eval (in the toolchain) or OpenCompass (its own env, `make opencompass`).",
    )
    bench_max_items: int = Field(default=100, gt=0, description="Per subset and split (reference: 100).")
    bench_device: str = Field(default="auto", description="auto | cpu | cuda")
    max_error_samples: int = Field(default=10, ge=0)
    error_sample_seed: int = 0

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
    judge_policy: Literal["both", "llm", "rules"] = Field(
        default="both", description="Who decides when rules pass: both must agree, the LLM, or the rules."
    )

    # ------------------------------------------------------------------ logging
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "INFO"


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

    def resolve_nats_url(self) -> str | None:
        if self.nats_url:
            return self.nats_url
        if self.url_file.is_file():
            return self.url_file.read_text().strip() or None
        return None

    def timeout_for(self, stage: str, requested: float | None) -> float:
        """A request may lower a stage's timeout, never raise it."""
        base = {"data_processing": self.data_timeout_s, "training": self.train_timeout_s,
                "benchmark": self.bench_timeout_s}[stage]
        return min(base, requested) if requested else base


# Set only while load_settings() builds a Settings: a --config flag must not leak into the
# process environment (and so into every later Settings() of the process).
_config_file: ContextVar[str | None] = ContextVar("ftbus_config_file", default=None)


def load_settings(config_file: str | None = None, **overrides: object) -> Settings:
    token = _config_file.set(config_file)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    finally:
        _config_file.reset(token)
