"""How a base model generates during benchmarks: sampling, token budget, chat template.

The reference samples every model at temperature 0.6, top-p 0.95, top-k 20. A model's entry may
say otherwise: a ``ftbus_inference.yaml`` in its folder (written by whoever installs the model),
then the ``bench_inference`` setting keyed by the model's folder name, which wins::

    # <assets>/models/<name>/ftbus_inference.yaml
    greedy: true            # or temperature / top_p / top_k
    max_gen_toks: 4096      # optional: a cap below the benchmark's own budget, reported as such
    chat_template: true     # optional: force the chat template on or off (default: the tokenizer's)

A fine-tuned candidate generates as its base model does, and its baseline the same way, so the
two are compared under one configuration (the baseline cache keys on it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MODEL_FILE = "ftbus_inference.yaml"


class InferenceError(ValueError):
    """A model's inference entry is malformed; the message names the file or setting."""


class InferenceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=0.6, ge=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=20, ge=0)
    greedy: bool = False
    max_gen_toks: int | None = Field(default=None, gt=0)
    chat_template: bool | None = None
    #: Samples per item, set by the benchmark stage from the request and the benchmark (never by a
    #: model's entry): lm-eval's ``repeats``, generated as one batch per item.
    num_runs: int = Field(default=1, ge=1)

    @property
    def sampling(self) -> bool:
        return not self.greedy and self.temperature > 0

    def generation_kwargs(self) -> dict[str, Any]:
        """lm-eval's generation_kwargs for these settings (the budget and stop words come from the
        benchmark)."""
        if not self.sampling:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    def budget(self, benchmark_budget: int) -> int:
        return min(benchmark_budget, self.max_gen_toks) if self.max_gen_toks else benchmark_budget

    def describe(self) -> str:
        runs = f", {self.num_runs} runs per item" if self.num_runs > 1 else ""
        if not self.sampling:
            return f"greedy decoding{runs}"
        return f"sampling at temperature {self.temperature:g}, top-p {self.top_p:g}, top-k {self.top_k}{runs}"


def inference_for(settings: Any, model_dir: Path) -> InferenceConfig:
    """The model folder's entry, then the ``bench_inference`` setting for its name, over the
    reference's defaults."""
    model_dir = Path(model_dir)
    values: dict[str, Any] = {}
    path = model_dir / MODEL_FILE
    if path.is_file():
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise InferenceError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise InferenceError(f"{path} must be a mapping of inference settings")
        values |= loaded
    values |= dict((getattr(settings, "bench_inference", None) or {}).get(model_dir.name, {}))
    if "num_runs" in values:
        raise InferenceError(f"inference settings of model {model_dir.name} ({path}, bench_inference): num_runs is "
                             "set per benchmark (its benchmark.yaml) or per request (`ftbus submit --num-runs`)")
    try:
        return InferenceConfig.model_validate(values)
    except ValidationError as exc:
        raise InferenceError(f"inference settings of model {model_dir.name} ({path}, bench_inference): {exc}") from exc
