"""`make gpu-check`: the benchmark's GPU path end to end on a small model, in under 10 minutes.

    .venv/bin/python deploy/gpu/gpu_check.py [--toolchain-bin DIR] [--workdir DIR] [--model DIR] ...

Runs where a CUDA GPU is visible and the toolchain (FTBUS_TOOLCHAIN_BIN, else .toolchain/bin) has a
CUDA torch, vLLM, peft, LlamaFactory and lm-eval. Needs no network:

1. builds the offline assets (tiny-llama's tokenizer, tiny-reviews, tiny-sentiment) and a small
   model with 64-dimensional attention heads (or uses --model, a local Hugging Face model folder);
2. trains two LoRA adapters with the real ``llamafactory-cli train`` on one GPU: a plain one
   (``lora_target: all``) and one with ``additional_target: embed_tokens,lm_head``
   (``modules_to_save``, which the reference merges);
3. evaluates the base model and both adapters on both splits of tiny-sentiment on the bench
   worker's warm engine (evaluation/warm.py + engine/ftbus_engine.py, which picks its
   lm-eval model through engine/vllm_support.py): one engine process, one model load per model;
4. checks: lm-eval's vllm model was used with tensor parallelism over the GPUs given (the engine's
   log says what it loaded); one model load served both splits; the plain
   adapter was served unmerged (``lora_local_path``), the modules_to_save one merged; scores came
   back for every split; the served adapter changed the base model's answers (vLLM applied it).

Prints a PASS/FAIL summary with timings. Exit status: 0 PASS, 1 FAIL, 3 could not run here (no GPU,
no toolchain, vLLM or another part missing: the message says what), 2 bad arguments.
``--cpu-rehearsal`` runs the same steps on CPU through lm-eval's hf model (no vLLM): it proves the
plumbing, not the GPU path, and says so.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HERE = Path(__file__).resolve().parent
EXIT_PASS, EXIT_FAIL, EXIT_CANNOT_RUN = 0, 1, 3
BENCHMARK = "tiny-sentiment"
SPLITS = ("validation", "test")
INSTALL_HINT = (
    "a GPU toolchain: a Python environment with a CUDA build of torch, vLLM, peft, LlamaFactory and "
    "lm-eval (e.g. `python -m venv .toolchain-gpu && .toolchain-gpu/bin/pip install vllm "
    "llamafactory==0.9.5 lm-eval==0.4.13 peft`, done where PyPI is reachable), then "
    "FTBUS_TOOLCHAIN_BIN=.toolchain-gpu/bin make gpu-check"
)

PROBE = r"""
import importlib.util, json, shutil, sys
out = {"python": sys.executable}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda
    out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(out["gpus"])]
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
for name in ("vllm", "peft", "lm_eval", "llamafactory", "transformers"):
    if importlib.util.find_spec(name) is None:
        out[name] = None
        continue
    try:
        from importlib.metadata import version
        out[name] = version({"lm_eval": "lm_eval", "llamafactory": "llamafactory"}.get(name, name))
    except Exception:
        out[name] = "installed"
print(json.dumps(out))
"""


class CannotRun(Exception):
    """The check cannot run on this machine; the message says what is missing."""


@dataclass
class Summary:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (check, PASS/FAIL/INFO, detail)
    timings: list[tuple[str, float]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.rows.append((name, "PASS" if ok else "FAIL", detail))
        return ok

    def info(self, name: str, detail: str) -> None:
        self.rows.append((name, "INFO", detail))

    @property
    def passed(self) -> bool:
        return all(status != "FAIL" for _, status, _ in self.rows) and any(s == "PASS" for _, s, _ in self.rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu-check", description="The benchmark's GPU path (vLLM, LoRA served and merged) end to end.",
        epilog="Exit status: 0 PASS, 1 FAIL, 3 could not run here (no GPU or a missing part), 2 bad arguments.",
    )
    env_bin = os.environ.get("FTBUS_TOOLCHAIN_BIN")
    parser.add_argument("--toolchain-bin", type=Path, default=Path(env_bin) if env_bin else ROOT / ".toolchain" / "bin",
                        help="folder with the GPU toolchain's python, llamafactory-cli and lm_eval "
                             "(default: $FTBUS_TOOLCHAIN_BIN, else .toolchain/bin)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where assets, adapters and outputs go (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary workdir")
    parser.add_argument("--model", type=Path, default=None,
                        help="a local Hugging Face causal LM folder to use instead of the model built here")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs given to the benchmark (default: all visible); tensor parallelism follows")
    parser.add_argument("--steps", type=int, default=80, help="training steps per adapter (default 80)")
    parser.add_argument("--timeout", type=float, default=570.0, help="give up after this many seconds (default 570)")
    parser.add_argument("--cpu-rehearsal", action="store_true",
                        help="run the same steps on CPU with lm-eval's hf model (no vLLM): checks the plumbing only")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.timeout <= 0:
        parser.error("--steps must be >= 1 and --timeout > 0")
    if args.gpus is not None and args.gpus < 1:
        parser.error("--gpus must be >= 1")
    return args


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, what: str) -> float:
        left = self.end - time.monotonic()
        if left <= 5:
            raise TimeoutError(f"no time left for {what}")
        return left


def toolchain_env() -> dict[str, str]:
    from shared.offline import OFFLINE_ENV

    return {**os.environ, **OFFLINE_ENV, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def run(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float,
        log: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env or toolchain_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}", encoding="utf-8")
    return proc


def probe(toolchain: Path, cpu: bool) -> dict[str, Any]:
    """What the toolchain has; raise CannotRun saying what is missing."""
    python = toolchain / "python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise CannotRun(f"no toolchain python at {python}: install {INSTALL_HINT}")
    proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=180,
                          env=toolchain_env(), check=False)
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise CannotRun(f"probing {python} failed (exit {proc.returncode}): {proc.stderr[-1500:]}") from exc
    if "torch_error" in found:
        raise CannotRun(f"{python} cannot import torch ({found['torch_error']}): install {INSTALL_HINT}")
    missing = [name for name in ("peft", "lm_eval", "llamafactory", "transformers") if not found.get(name)]
    missing += [tool for tool in ("llamafactory-cli",) if not (toolchain / tool).exists()]
    if not cpu:
        if not found.get("gpus"):
            raise CannotRun(
                f"no CUDA GPU visible to {python} (torch {found.get('torch')}, CUDA build "
                f"{found.get('cuda_build') or 'none: a CPU build'}). The GPU check runs only where a GPU is "
                f"present; on this machine it could not run. (--cpu-rehearsal checks the plumbing on CPU.)")
        if not found.get("vllm"):
            missing.insert(0, "vllm")
    if missing:
        raise CannotRun(f"the toolchain at {toolchain} lacks {', '.join(missing)}: install {INSTALL_HINT}")
    return found


def train_yaml(model: Path, out: Path, steps: int, modules_to_save: bool, cpu: bool) -> str:
    lines = [
        f"model_name_or_path: {model}",
        "stage: sft", "do_train: true", "finetuning_type: lora", "lora_target: all",
        "lora_rank: 8", "lora_alpha: 16", "lora_dropout: 0.0",
        "dataset: processed_data", "dataset_dir: .", "template: default", "cutoff_len: 64",
        "overwrite_cache: true", "preprocessing_num_workers: 1", "dataloader_num_workers: 0",
        f"output_dir: {out}", "logging_steps: 10", f"save_steps: {steps + 1}", "overwrite_output_dir: true",
        "report_to: none", "per_device_train_batch_size: 8", "gradient_accumulation_steps: 1",
        "learning_rate: 5.0e-3", f"max_steps: {steps}", "lr_scheduler_type: cosine", "seed: 42",
    ]
    if modules_to_save:
        lines.append("additional_target: embed_tokens,lm_head")
    if cpu:
        lines.append("use_cpu: true")
    return "\n".join(lines) + "\n"


def prepare_data(work: Path, assets: Path, deadline: Deadline) -> Path:
    data = work / "train"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "lora" / "dataset_info.json", data / "dataset_info.json")
    proc = run([sys.executable, str(ROOT / "examples" / "lora" / "process_data.py")], cwd=data,
               env={**toolchain_env(), "FTBUS_ASSETS_DIR": str(assets)}, timeout=deadline.left("data"),
               log=work / "process_data.log")
    if proc.returncode != 0 or not (data / "data.json").is_file():
        raise RuntimeError(f"process_data.py failed: {proc.stderr[-1500:]}")
    return data


def prepare_model(args: argparse.Namespace, work: Path, assets: Path, python: Path, deadline: Deadline) -> Path:
    if args.model is not None:
        if not (args.model / "config.json").is_file():
            raise CannotRun(f"--model {args.model} is not a Hugging Face model folder (no config.json)")
        return args.model.resolve()
    dest = work / "models" / "gpu-llama"
    proc = run([str(python), str(HERE / "build_model.py"), str(assets / "models" / "tiny-llama"), str(dest)],
               timeout=deadline.left("model build"), log=work / "build_model.log")
    if proc.returncode != 0:
        raise RuntimeError(f"building the small model failed: {proc.stderr[-1500:]}")
    return dest


def train(model: Path, data: Path, out: Path, args: argparse.Namespace, modules_to_save: bool,
          deadline: Deadline, work: Path) -> None:
    config = data / f"{out.name}.yaml"
    config.write_text(train_yaml(model, out, args.steps, modules_to_save, args.cpu_rehearsal), encoding="utf-8")
    env = toolchain_env()
    env.pop("FORCE_TORCHRUN", None)
    if not args.cpu_rehearsal:
        # One GPU: with several visible, llamafactory-cli would start a torchrun job over all of them.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    proc = run([str(args.toolchain_bin / "llamafactory-cli"), "train", str(config)], cwd=data, env=env,
               timeout=deadline.left("training"), log=work / f"train-{out.name}.log")
    if proc.returncode != 0 or not (out / "adapter_config.json").is_file():
        raise RuntimeError(f"llamafactory-cli train ({out.name}) failed (exit {proc.returncode}): "
                           f"{(proc.stdout + proc.stderr)[-2000:]}")


def adapter_modules_to_save(adapter: Path) -> list[str]:
    return list(json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8")).get("modules_to_save") or [])


def loaded_model(log_path: Path) -> tuple[str | None, dict[str, Any], float | None]:
    """What the engine loaded, from its lines in the job's first split log:
    ``[engine] loading <name> model: {args}`` and ``[engine] model loaded in <s> s``."""
    name: str | None = None
    margs: dict[str, Any] = {}
    load_s: float | None = None
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, {}, None
    for line in text.splitlines():
        if line.startswith("[engine] loading ") and " model: " in line:
            head, _, tail = line.partition(" model: ")
            name = head.removeprefix("[engine] loading ").strip()
            try:
                margs = ast.literal_eval(tail.strip())
            except (ValueError, SyntaxError):
                margs = {}
        elif line.startswith("[engine] model loaded in "):
            try:
                load_s = float(line.removeprefix("[engine] model loaded in ").split()[0])
            except (ValueError, IndexError):
                pass
    return name, margs, load_s


async def evaluate(args: argparse.Namespace, work: Path, assets: Path, model: Path, adapters: dict[str, Path],
                   deadline: Deadline) -> dict[str, dict[str, Any]]:
    """The three models on the bench worker's warm engine (evaluation/warm.py): one engine
    process, one job (one model load) per model, both splits per job."""
    from evaluation.models import select_model
    from evaluation.registry import load_benchmark
    from evaluation.splits import make_split
    from evaluation.warm import WarmEngine, WarmSplit
    from runners.base import LocalRunner
    from shared.settings import Settings

    settings = Settings(
        assets_dir=assets, work_dir=work / "workers", toolchain_bin=args.toolchain_bin, sandbox="local",
        bench_device="cpu" if args.cpu_rehearsal else "cuda",
        passthrough_env=["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "HF_HOME", "CUDA_VISIBLE_DEVICES",
                         "LD_LIBRARY_PATH", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"],
    )
    runner = LocalRunner(settings.passthrough_env, path_prefix=[args.toolchain_bin])
    engine = WarmEngine(runner, settings, work / "engine")
    spec = load_benchmark(assets, BENCHMARK)
    manifests = {split: make_split(spec, split) for split in SPLITS}
    out: dict[str, dict[str, Any]] = {}
    try:
        for name in ("base", "lora", "lora-mts"):
            runs = await engine.run(
                spec, select_model(model, adapters.get(name)), [WarmSplit(s, manifests[s]) for s in SPLITS],
                work / "bench" / name, device=settings.bench_device,
                timeout_s=deadline.left(f"evaluating {name}"), seed=0,
            )
            out[name] = {"runs": runs, "manifests": manifests, "spec": spec, "starts": engine.starts}
    finally:
        await engine.kill()
    return out


def judge_model(name: str, result: dict[str, Any], args: argparse.Namespace, summary: Summary,
                gpus: int) -> dict[str, Any] | None:
    """Check one model's runs; return its scores per split (None when a split failed)."""
    from evaluation.lmeval import parse_lm_eval_output

    runs, spec, manifests = result["runs"], result["spec"], result["manifests"]
    failed = [f"{s}: {runs[s].error or 'exit ' + str(runs[s].result.exit_code)}\n{runs[s].result.output_tail[-1500:]}"
              if s in runs else f"{s}: not run" for s in SPLITS if s not in runs or runs[s].result.exit_code != 0]
    if failed:
        summary.check(f"{name}: evaluated on the warm engine", False, "\n".join(failed))
        return None
    loads = [runs[s].loads for s in SPLITS]
    summary.check(f"{name}: one model load for both splits", loads == [1, 1],
                  f"loads after each split: {loads}; engine starts so far: {result['starts']}")
    lm_name, margs, load_s = loaded_model(runs[SPLITS[0]].log_path)
    want = "hf" if args.cpu_rehearsal else "vllm"
    summary.check(f"{name}: lm-eval model {want}", lm_name == want, f"{lm_name} {margs}")
    if not args.cpu_rehearsal:
        tp = margs.get("tensor_parallel_size")
        summary.check(f"{name}: tensor_parallel_size from the GPUs given", isinstance(tp, int) and 1 <= tp <= gpus,
                      f"tp={tp} of {gpus} GPUs")
        if name == "lora":
            summary.check("lora: served unmerged (lora_local_path)",
                          bool(margs.get("lora_local_path")) and "merged" not in str(margs.get("pretrained")),
                          f"lora_local_path={margs.get('lora_local_path')} max_lora_rank={margs.get('max_lora_rank')}")
        if name == "lora-mts":
            summary.check("lora-mts: merged (modules_to_save), then loaded as a full model",
                          "lora_local_path" not in margs and str(margs.get("pretrained", "")).endswith("/merged"),
                          str(margs.get("pretrained")))
    what = ("merge + " if name == "lora-mts" and not args.cpu_rehearsal else "") + "load"
    loaded = f" {load_s:.1f}" if load_s is not None else ""
    summary.timings.append((f"  {name}: {SPLITS[0]} (incl. {what}{loaded})", runs[SPLITS[0]].result.duration_s))
    for s in SPLITS[1:]:
        summary.timings.append((f"  {name}: {s} (same load)", runs[s].result.duration_s))
    try:
        scores = {s: parse_lm_eval_output(runs[s].output_dir, spec, manifests[s]) for s in SPLITS}
    except Exception as exc:  # a FAIL row with the reason
        summary.check(f"{name}: scores parsed", False, f"{type(exc).__name__}: {exc}")
        return None
    values = {s: r.primary_value for s, r in scores.items()}
    summary.check(f"{name}: scores for both splits", all(isinstance(v, float) for v in values.values()),
                  ", ".join(f"{s} {v:.3f}" if v is not None else f"{s} -" for s, v in values.items()))
    return scores


def check(args: argparse.Namespace, work: Path, summary: Summary) -> None:
    deadline = Deadline(args.timeout)
    t0 = time.monotonic()
    found = probe(args.toolchain_bin, args.cpu_rehearsal)
    gpus = 0 if args.cpu_rehearsal else min(args.gpus or found["gpus"], found["gpus"])
    if gpus and args.gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(found["gpus"])]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:gpus])  # the GPUs given to the bench worker
    summary.info("toolchain", f"torch {found.get('torch')} (CUDA {found.get('cuda_build')}), vllm {found.get('vllm')}, "
                              f"peft {found.get('peft')}, lm-eval {found.get('lm_eval')}, "
                              f"llamafactory {found.get('llamafactory')}")
    names = ", ".join(found.get("gpu_names") or []) or "-"
    summary.info("gpus", f"{gpus} given of {found.get('gpus', 0)} visible: {names}")
    summary.timings.append(("probe", time.monotonic() - t0))
    python = args.toolchain_bin / "python"

    t0 = time.monotonic()
    from ftbus.assets import build_assets

    assets = work / "assets"
    build_assets(assets, python, timeout_s=deadline.left("assets"))
    model = prepare_model(args, work, assets, python, deadline)
    data = prepare_data(work, assets, deadline)
    summary.timings.append(("assets + model", time.monotonic() - t0))
    summary.info("model", str(model))

    adapters = {"lora": work / "adapters" / "lora", "lora-mts": work / "adapters" / "lora-mts"}
    for key, out in adapters.items():
        t0 = time.monotonic()
        train(model, data, out, args, key == "lora-mts", deadline, work)
        summary.timings.append((f"train {key} ({args.steps} steps)", time.monotonic() - t0))
    summary.check("plain adapter has no modules_to_save", not adapter_modules_to_save(adapters["lora"]))
    mts = adapter_modules_to_save(adapters["lora-mts"])
    summary.check("additional_target adapter has modules_to_save", bool(mts), str(mts))

    t0 = time.monotonic()
    results = asyncio.run(evaluate(args, work, assets, model, adapters, deadline))
    summary.timings.append(("warm engine: 3 models x 2 splits, one engine", time.monotonic() - t0))
    scores = {name: judge_model(name, result, args, summary, gpus) for name, result in results.items()}
    base_scores, lora_scores = scores.get("base"), scores.get("lora")
    if base_scores and lora_scores:
        def answers(per_split: dict[str, Any]) -> dict[str, Any]:
            return {s: (r.primary_value, [e.model_output for e in r.error_samples]) for s, r in per_split.items()}

        base, lora = answers(base_scores), answers(lora_scores)
        summary.check("lora changed the base model's answers (the adapter was applied)", base != lora,
                      f"base {[v for v, _ in base.values()]} vs lora {[v for v, _ in lora.values()]}")


def print_summary(summary: Summary, args: argparse.Namespace, work: Path, total: float) -> None:
    mode = "CPU REHEARSAL (lm-eval hf, no vLLM: not a GPU check)" if args.cpu_rehearsal else "GPU"
    print(f"\n== gpu-check [{mode}] ==")
    width = max((len(n) for n, _, _ in summary.rows), default=10)
    for name, status, detail in summary.rows:
        first, *rest = (detail or "").splitlines() or [""]
        print(f"{status:4}  {name:<{width}}  {first}")
        for line in rest[:20]:
            print(f"      {'':<{width}}  {line}")
    print("-- timings (s)")
    for name, secs in summary.timings:
        print(f"  {secs:7.1f}  {name}")
    print(f"  {total:7.1f}  total")
    kept = not (summary.passed and args.workdir is None and not args.keep)
    print(f"-- work folder: {work}" + (" (logs: *.log, bench/*/bench-*/lm_eval.log, engine/engine.log)" if kept
                                       else " (removed: PASS; --keep keeps it)"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.toolchain_bin = args.toolchain_bin.resolve()
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="ftbus-gpu-check-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    summary = Summary()
    t0 = time.monotonic()
    status = EXIT_FAIL
    try:
        check(args, work, summary)
        status = EXIT_PASS if summary.passed else EXIT_FAIL
    except CannotRun as exc:
        print(f"gpu-check: COULD NOT RUN: {exc}", file=sys.stderr)
        print("gpu-check: COULD NOT RUN (see above); nothing was checked.")
        if args.workdir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return EXIT_CANNOT_RUN
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired, OSError) as exc:
        summary.check("run", False, f"{type(exc).__name__}: {exc}")
    print_summary(summary, args, work, time.monotonic() - t0)
    print(f"gpu-check: {'PASS' if status == EXIT_PASS else 'FAIL'}"
          + (" (CPU rehearsal: the GPU path was not exercised)" if args.cpu_rehearsal else ""))
    if status == EXIT_PASS and args.workdir is None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
