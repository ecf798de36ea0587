"""The benchmark registry: one folder per benchmark under ``<assets>/benchmarks/``.

Unlike the reference (a name -> OpenCompass config module, no metric or version), a benchmark here
is a descriptor that says what to compare and how (pain point 14)::

    <assets>/benchmarks/<name>/benchmark.yaml
        name: tiny-arith                # equals the folder name
        version: 1                      # bump when items change: split manifests and caches key on it
        description: ...
        kind: generate_until            # or multiple_choice
        primary_metric: exact_match     # generate_until: exact_match; multiple_choice: acc | acc_norm
        higher_is_better: true
        subsets: [{name: addition, file: addition.jsonl}, ...]
        generation: {max_gen_toks: 16, until: ["\\n"]}     # optional, generate_until only
    <assets>/benchmarks/<name>/<subset file>.jsonl
        {"id": "add-000", "question": "What is 1 + 2?", "answer": "3"}
        multiple_choice items add "choices": [...] and "answer" is the text of the right choice.

Items keep their file order, which the splits rely on (see splits.py).
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DESCRIPTOR = "benchmark.yaml"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
BenchmarkKind = Literal["generate_until", "multiple_choice"]

# Metrics the lm-eval backend computes per kind; the primary metric must be one of them.
KIND_METRICS: dict[str, tuple[str, ...]] = {
    "generate_until": ("exact_match",),
    "multiple_choice": ("acc", "acc_norm"),
}


class BenchmarkError(ValueError):
    """A benchmark is unknown or malformed; the message says which and why."""


class BenchmarkNotFoundError(BenchmarkError, LookupError):
    pass


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SubsetSpec(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    file: str = Field(min_length=1)

    @model_validator(mode="after")
    def _file_stays_inside(self) -> SubsetSpec:
        # The file is read relative to the benchmark folder: no escaping it.
        p = Path(self.file)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError(f"subset file {self.file!r} must be a relative path inside the benchmark folder")
        return self


class GenerationConfig(_Model):
    max_gen_toks: int = Field(default=32, gt=0, le=4096)
    until: list[str] = Field(default_factory=lambda: ["\n"])


class BenchmarkItem(_Model):
    id: str = Field(min_length=1)
    question: str
    answer: str
    choices: list[str] | None = None


class BenchmarkSpec(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    version: int = Field(default=1, ge=1)
    description: str = ""
    kind: BenchmarkKind
    primary_metric: str
    higher_is_better: bool = True
    subsets: list[SubsetSpec] = Field(min_length=1)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    root: Path = Field(default=Path("."), exclude=True, description="The benchmark's folder (set by the loader).")

    @model_validator(mode="after")
    def _check(self) -> BenchmarkSpec:
        if self.primary_metric not in KIND_METRICS[self.kind]:
            raise ValueError(
                f"primary_metric {self.primary_metric!r} is not computed for kind {self.kind}; "
                f"choose one of {', '.join(KIND_METRICS[self.kind])}"
            )
        names = [s.name for s in self.subsets]
        if len(set(names)) != len(names):
            raise ValueError(f"subset names repeat: {names}")
        return self

    @property
    def metrics(self) -> tuple[str, ...]:
        return KIND_METRICS[self.kind]

    def subset(self, name: str) -> SubsetSpec:
        for s in self.subsets:
            if s.name == name:
                return s
        raise BenchmarkError(f"benchmark {self.name} has no subset {name!r}")

    def items(self, subset: str) -> list[BenchmarkItem]:
        """The subset's items in file order (cached: the files are immutable for a version)."""
        return list(self._items[subset])

    @cached_property
    def _items(self) -> dict[str, tuple[BenchmarkItem, ...]]:
        return {s.name: tuple(_read_items(self, s)) for s in self.subsets}


def _read_items(spec: BenchmarkSpec, subset: SubsetSpec) -> list[BenchmarkItem]:
    path = spec.root / subset.file
    if not path.is_file():
        raise BenchmarkError(f"benchmark {spec.name}: subset {subset.name} file {path} is missing")
    items: list[BenchmarkItem] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"benchmark {spec.name}: {path.name} line {lineno}"
        try:
            item = BenchmarkItem.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise BenchmarkError(f"{where}: {exc}") from exc
        if item.id in seen:
            raise BenchmarkError(f"{where}: duplicate id {item.id!r}")
        if spec.kind == "multiple_choice" and (not item.choices or item.answer not in item.choices):
            raise BenchmarkError(f"{where}: multiple_choice items need choices that contain the answer")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise BenchmarkError(f"benchmark {spec.name}: subset {subset.name} ({path}) has no items")
    return items


def available_benchmarks(assets_dir: Path) -> list[str]:
    root = Path(assets_dir) / "benchmarks"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / DESCRIPTOR).is_file())


def load_benchmark(assets_dir: Path, name: str) -> BenchmarkSpec:
    """Read and validate ``<assets>/benchmarks/<name>/benchmark.yaml`` and its subset files."""
    if not re.match(NAME_PATTERN, name):
        raise BenchmarkError(f"invalid benchmark name {name!r}")
    folder = Path(assets_dir) / "benchmarks" / name
    descriptor = folder / DESCRIPTOR
    if not descriptor.is_file():
        known = ", ".join(available_benchmarks(assets_dir)) or "none (run `ftbus assets init`)"
        raise BenchmarkNotFoundError(
            f"unknown benchmark {name!r} (no {descriptor}); available benchmarks: {known}"
        )
    try:
        raw = yaml.safe_load(descriptor.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise BenchmarkError(f"benchmark {name}: {descriptor} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise BenchmarkError(f"benchmark {name}: {descriptor} must be a mapping")
    try:
        spec = BenchmarkSpec.model_validate({**raw, "root": folder.resolve()})
    except ValidationError as exc:
        raise BenchmarkError(f"benchmark {name}: invalid {descriptor}:\n{exc}") from exc
    if spec.name != name:
        raise BenchmarkError(f"benchmark folder {name!r} holds a descriptor named {spec.name!r}")
    for subset in spec.subsets:
        spec.items(subset.name)  # validate every item now, not halfway through a run
    return spec
