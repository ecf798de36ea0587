"""Which lm-eval model the warm benchmark engine loads for one model: ``hf`` on CPU, ``vllm`` on GPU.

Runs inside the fine-tuning toolchain (the sandbox image's Python), beside the engine script: it
imports nothing from ftbus, only the standard library at import time; the toolchain's packages
(torch, transformers, peft, vllm) are imported inside the functions that need them.

    name, model_args = lm_eval_model(pretrained, peft, device="cpu", gpus=0, dtype=None, scratch=...)
    lm = lm_eval.api.registry.get_model(name).create_from_arg_obj(model_args)
    ...
    release(lm)          # before the next model: frees the GPU memory vLLM holds

The decision is split from the work so that it can be tested without vLLM or a GPU:

- ``plan_model`` (pure): the lm-eval model type, its arguments, and whether an adapter is merged.
- ``merge_reasons`` (pure): why an adapter cannot be served by vLLM as a LoRA (empty: it can).
- ``tensor_parallel_size`` / ``vllm_max_lora_rank`` (pure): the numbers vLLM is given.
- ``merge_adapter``: the merge itself (peft ``merge_and_unload``), as the reference evaluator does.

On ``device="cuda"`` with GPUs given and vLLM installed, generation goes through lm-eval's ``vllm``
model. A LoRA adapter is served unmerged (``lora_local_path``) where vLLM can serve it, and merged
into a full model under ``scratch`` where the reference merges (``modules_to_save`` set, e.g. a
trained ``embed_tokens``/``lm_head``; or a Blackwell GPU) and where vLLM cannot serve it as a LoRA
(embedding/output layers as LoRA targets, DoRA, trained biases, per-layer rank or alpha patterns, a
rank above vLLM's largest). Candidate weights are data: ``trust_remote_code`` stays off everywhere
and weights are read from safetensors only (nothing is unpickled).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG = logging.getLogger("ftbus.benchmark.vllm_support")

#: The ranks vLLM's LoRAConfig accepts for ``max_lora_rank`` (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Module names of input embeddings and output heads across model families. vLLM serves LoRA on
#: linear layers; LoRA on these (and, in every version, their full copies in ``modules_to_save``)
#: it either rejects or supports only in some versions, so such adapters are merged instead.
EMBEDDING_MODULES: frozenset[str] = frozenset({
    "embed_tokens", "lm_head", "wte", "wpe", "embed_in", "embed_out", "word_embeddings",
    "tok_embeddings", "embeddings", "shared",
})
#: Of those, the layers with one row per token (a resized vocabulary changes them).
VOCAB_MODULES: frozenset[str] = EMBEDDING_MODULES - {"wpe", "embeddings"}
#: The reference evaluator merges on these GPUs (its check of nvidia-smi's names).
MERGE_GPUS: tuple[str, ...] = ("B100", "B200", "B300")
#: lm-eval's ``vllm`` default is 0.9 as in the reference; the engine may pass its own.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
MERGED_DIR = "merged"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
INSTALL_VLLM = "install vLLM into the fine-tuning toolchain (`pip install vllm`, or lm-eval's `lm-eval[vllm]` extra)"


class VllmSupportError(RuntimeError):
    """A model or adapter the engine cannot load on the chosen path; the message says why."""


# ------------------------------------------------------------------ reading files (stdlib only)


@dataclass(frozen=True)
class AdapterInfo:
    """What ``adapter_config.json`` says about a PEFT adapter, as far as serving it matters."""

    path: str
    peft_type: str
    rank: int
    target_modules: tuple[str, ...] | str  # a list in the file, or one regex string
    modules_to_save: tuple[str, ...] = ()
    use_dora: bool = False
    bias: str = "none"
    lora_bias: bool = False
    rank_pattern: bool = False   # non-empty per-module rank overrides
    alpha_pattern: bool = False  # non-empty per-module alpha overrides
    has_safetensors: bool = True


def read_adapter(adapter: str | Path) -> AdapterInfo:
    """Read ``<adapter>/adapter_config.json``; raise ``VllmSupportError`` when it is missing or not PEFT's."""
    path = Path(adapter)
    config_file = path / ADAPTER_CONFIG
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise VllmSupportError(f"{path} is not a PEFT adapter: it has no {ADAPTER_CONFIG}") from exc
    except (OSError, ValueError) as exc:
        raise VllmSupportError(f"{config_file} cannot be read as JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise VllmSupportError(f"{config_file} is not a JSON object")
    targets = config.get("target_modules") or ()
    return AdapterInfo(
        path=str(path),
        peft_type=str(config.get("peft_type") or "LORA").upper(),
        rank=int(config.get("r") or 8),
        target_modules=targets if isinstance(targets, str) else tuple(str(t) for t in targets),
        modules_to_save=tuple(str(m) for m in (config.get("modules_to_save") or ())),
        use_dora=bool(config.get("use_dora")),
        bias=str(config.get("bias") or "none"),
        lora_bias=bool(config.get("lora_bias")),
        rank_pattern=bool(config.get("rank_pattern")),
        alpha_pattern=bool(config.get("alpha_pattern")),
        has_safetensors=(path / ADAPTER_SAFETENSORS).is_file(),
    )


def read_model_config(pretrained: str | Path) -> dict[str, Any]:
    """The model's ``config.json`` ({} when absent or unreadable: the caller decides without it)."""
    try:
        config = json.loads((Path(pretrained) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def safetensors_shapes(path: str | Path) -> dict[str, list[int]]:
    """Tensor name -> shape, read from a safetensors file's JSON header (no tensor is loaded)."""
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > 100_000_000:
            raise VllmSupportError(f"{path}: safetensors header of {length} bytes is not plausible")
        header = json.loads(fh.read(length))
    return {name: list(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}


def adapter_vocab_size(adapter: str | Path) -> int | None:
    """Rows of the embedding (or output head) an adapter saves in full (``modules_to_save``), or
    None. LlamaFactory's ``resize_vocab`` grows them past the base model's vocabulary: the base must
    then be resized the same way before the adapter loads onto it."""
    file = Path(adapter) / ADAPTER_SAFETENSORS
    if not file.is_file():
        return None
    for name, shape in sorted(safetensors_shapes(file).items()):
        parts = name.split(".")
        if (len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in VOCAB_MODULES and len(shape) == 2
                and not any(part.startswith("lora_") for part in parts)):
            return int(shape[0])
    return None


# ------------------------------------------------------------------ pure decisions


def tensor_parallel_size(gpus: int, num_attention_heads: int | None = None) -> int:
    """The largest power of two <= ``gpus`` (the reference's ``auto``) that divides the model's
    attention heads (vLLM shards heads evenly across GPUs); 1 without GPUs."""
    if gpus < 1:
        return 1
    tp = 1
    while tp * 2 <= gpus:
        tp *= 2
    if num_attention_heads:
        while tp > 1 and num_attention_heads % tp:
            tp //= 2
    return tp


def vllm_max_lora_rank(rank: int) -> int | None:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``; None when none does."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def _module_names(target_modules: tuple[str, ...] | str) -> set[str]:
    if isinstance(target_modules, str):
        # "all-linear" or a regex over module paths: look for embedding names in it.
        return {name for name in EMBEDDING_MODULES if name in target_modules}
    return {t.rsplit(".", 1)[-1] for t in target_modules}


def merge_reasons(adapter: AdapterInfo, gpu_name: str | None = None) -> list[str]:
    """Why this adapter is merged before vLLM loads it; an empty list means vLLM serves it as a LoRA."""
    reasons: list[str] = []
    if adapter.peft_type != "LORA":
        reasons.append(f"peft_type {adapter.peft_type}: vLLM serves only LoRA adapters")
    if adapter.modules_to_save:
        reasons.append(f"modules_to_save {list(adapter.modules_to_save)}: vLLM requires modules_to_save to be None "
                       "(the reference merges these adapters)")
    embedding_targets = sorted(_module_names(adapter.target_modules) & EMBEDDING_MODULES)
    if embedding_targets:
        reasons.append(f"LoRA on {embedding_targets}: vLLM serves LoRA on linear layers, not on embeddings "
                       "or the output head in every version")
    if adapter.use_dora:
        reasons.append("DoRA: vLLM does not serve DoRA adapters")
    if adapter.bias != "none" or adapter.lora_bias:
        reasons.append(f"trained biases (bias={adapter.bias!r}, lora_bias={adapter.lora_bias}): vLLM ignores them")
    if adapter.rank_pattern or adapter.alpha_pattern:
        reasons.append("per-module rank_pattern/alpha_pattern: vLLM reads one rank and alpha per adapter")
    if vllm_max_lora_rank(adapter.rank) is None:
        reasons.append(f"rank {adapter.rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")
    if gpu_name and any(tag in gpu_name.upper() for tag in MERGE_GPUS):
        reasons.append(f"GPU {gpu_name}: the reference merges on {'/'.join(MERGE_GPUS)} GPUs")
    return reasons


@dataclass(frozen=True)
class MergeJob:
    """Merge ``adapter`` into ``base`` and save the full model at ``dest``."""

    base: str
    adapter: str
    dest: str
    reasons: tuple[str, ...]


@dataclass
class ModelPlan:
    """What the engine loads: lm-eval's model type and arguments, and a merge to do first (or None)."""

    model: str                       # "hf" or "vllm"
    args: dict[str, Any]
    merge: MergeJob | None = None
    notes: list[str] = field(default_factory=list)  # what was chosen and why, for the engine's log


def plan_model(
    pretrained: str,
    peft: str | None,
    *,
    device: str,
    gpus: int,
    dtype: str | None,
    scratch: str,
    vllm_installed: bool,
    gpu_name: str | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    seed: int = 0,
    max_model_len: int | None = None,
    enforce_eager: bool = True,
) -> ModelPlan:
    """Decide the lm-eval model for ``pretrained`` (+ adapter ``peft``); reads only JSON files.

    - CPU, or CUDA without GPUs given: lm-eval's ``hf`` model, exactly what the per-split
      ``lm_eval`` command loads.
    - CUDA, GPUs given, no vLLM: ``hf`` on cuda (``parallelize`` over several GPUs), with a note.
    - CUDA, GPUs given, vLLM: ``vllm`` with ``tensor_parallel_size`` from the GPUs; a LoRA adapter as
      ``lora_local_path``, or merged into ``<scratch>/merged`` (see ``merge_reasons``).
    """
    notes: list[str] = []
    if device != "cuda" or gpus < 1 or not vllm_installed:
        args: dict[str, Any] = {"pretrained": pretrained, "device": device}
        if peft:
            args["peft"] = peft
        if dtype:
            args["dtype"] = dtype
        if device == "cuda" and gpus > 1:
            args["parallelize"] = True  # accelerate's device_map over the GPUs given
        if device == "cuda" and gpus >= 1 and not vllm_installed:
            notes.append(f"vLLM is not installed: evaluating with lm-eval's hf model on cuda ({INSTALL_VLLM})")
        return ModelPlan("hf", args, notes=notes)

    config = read_model_config(pretrained)
    heads = config.get("num_attention_heads")
    tp = tensor_parallel_size(gpus, int(heads) if isinstance(heads, int) else None)
    if tp != gpus:
        notes.append(f"tensor_parallel_size {tp} of the {gpus} GPUs given "
                     f"(a power of two dividing the model's {heads} attention heads)")
    args = {
        "pretrained": pretrained,
        "dtype": dtype or "auto",
        "tensor_parallel_size": tp,
        "gpu_memory_utilization": float(gpu_memory_utilization),
        "seed": int(seed),
        "trust_remote_code": False,  # candidate weights are data
        "enforce_eager": bool(enforce_eager),
        "batch_size": "auto",  # vLLM schedules its own batches; an engine's batch_size 1 would serialise them
    }
    if max_model_len:
        args["max_model_len"] = int(max_model_len)
    merge: MergeJob | None = None
    if peft:
        adapter = read_adapter(peft)
        if not adapter.has_safetensors:
            raise VllmSupportError(
                f"{peft} has no {ADAPTER_SAFETENSORS}: candidate weights are loaded from safetensors only "
                "(save the adapter with safe_serialization, LlamaFactory's default)")
        reasons = merge_reasons(adapter, gpu_name)
        if reasons:
            dest = str(Path(scratch) / MERGED_DIR)
            merge = MergeJob(base=pretrained, adapter=peft, dest=dest, reasons=tuple(reasons))
            args["pretrained"] = dest
            notes.append("merging the adapter before vLLM loads it: " + "; ".join(reasons))
        else:
            rank = vllm_max_lora_rank(adapter.rank)
            args["lora_local_path"] = peft
            args["max_lora_rank"] = rank
            notes.append(f"serving the LoRA adapter unmerged (rank {adapter.rank}, max_lora_rank {rank})")
    return ModelPlan("vllm", args, merge=merge, notes=notes)


# ------------------------------------------------------------------ the toolchain side


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (found, not imported: importing it is slow)."""
    return importlib.util.find_spec("vllm") is not None


def visible_gpu_names(smi_names: list[str], cuda_visible_devices: str | None) -> list[str]:
    """Of the names ``nvidia-smi`` lists (by index), those this process may use."""
    if cuda_visible_devices is None or not cuda_visible_devices.strip():
        return list(smi_names) if cuda_visible_devices is None else []
    picked: list[str] = []
    for item in cuda_visible_devices.split(","):
        item = item.strip()
        if item.isdigit() and int(item) < len(smi_names):
            picked.append(smi_names[int(item)])
        elif item and not item.isdigit():
            return list(smi_names)  # UUIDs or MIG ids: any of them may be ours
    return picked


def detect_gpu_name() -> str | None:
    """The visible GPUs' names from ``nvidia-smi`` (as the reference reads them), joined; None when
    it cannot tell. Not through torch: that would create a CUDA context in the engine's process,
    holding GPU memory and forcing vLLM to spawn rather than fork its workers."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    names = visible_gpu_names([line.strip() for line in proc.stdout.splitlines() if line.strip()],
                              os.environ.get("CUDA_VISIBLE_DEVICES"))
    return ", ".join(names) or None


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _TOKENIZER_FILES)


def merge_adapter(base: str | Path, adapter: str | Path, dest: str | Path, *, dtype: str | None = None) -> Path:
    """Merge a PEFT adapter into its base model and save a full model at ``dest``, as the reference does.

    peft's ``merge_and_unload`` on CPU (the GPU stays free for vLLM), weights read from and written
    to safetensors only, ``trust_remote_code`` off, nothing from the network. The tokenizer comes
    from the adapter folder when it has one (LlamaFactory saves it there), else from the base. A
    vocabulary the adapter grew (``resize_vocab``) is grown on the base first. Built in a sibling
    folder and renamed into place: ``dest`` is either whole or absent.
    """
    import inspect

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, adapter, dest = Path(base), Path(adapter), Path(dest)
    info = read_adapter(adapter)
    if not info.has_safetensors:
        raise VllmSupportError(f"{adapter} has no {ADAPTER_SAFETENSORS}: candidate weights are loaded from "
                               "safetensors only")
    torch_dtype: Any = "auto" if dtype in (None, "auto") else getattr(torch, str(dtype))
    load = {"trust_remote_code": False, "local_files_only": True, "use_safetensors": True,
            "low_cpu_mem_usage": True}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch_dtype, **load)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch_dtype, **load)
    vocab = adapter_vocab_size(adapter)
    if vocab and vocab != model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(vocab)
    merged = PeftModel.from_pretrained(model, str(adapter), is_trainable=False).merge_and_unload()

    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    save_kwargs: dict[str, Any] = {}
    if "safe_serialization" in inspect.signature(merged.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4; 5 writes only safetensors
    merged.save_pretrained(str(partial), **save_kwargs)
    tokenizer_source = adapter if _has_tokenizer(adapter) else base
    AutoTokenizer.from_pretrained(str(tokenizer_source), trust_remote_code=False,
                                  local_files_only=True).save_pretrained(str(partial))
    if not any(partial.glob("*.safetensors")) or any(partial.glob("*.bin")):
        raise VllmSupportError(f"the merged model in {partial} was not saved as safetensors only")
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def _visible_log() -> None:
    """Our notes reach the engine's output (a split's log) even when nothing configured logging."""
    if not LOG.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)


def lm_eval_model(
    pretrained: str,
    peft: str | None,
    *,
    device: str,
    gpus: int,
    dtype: str | None,
    scratch: str,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    seed: int = 0,
    max_model_len: int | None = None,
    enforce_eager: bool = True,
) -> tuple[str, dict[str, Any]]:
    """The lm-eval model type and its arguments for ``pretrained`` (plus a LoRA adapter ``peft``).

    ``gpus``: how many GPUs this worker was given (``CUDA_VISIBLE_DEVICES`` already limits them to
    those); ``scratch``: a folder the engine may write to (the merged model goes to
    ``<scratch>/merged``). On CPU (or CUDA without vLLM, with a logged warning) this is lm-eval's
    ``hf`` model, exactly what the per-split ``lm_eval`` command loads. Merges, when needed, happen
    here, before returning.
    """
    on_gpu = device == "cuda" and gpus > 0
    installed = vllm_installed() if on_gpu else False
    plan = plan_model(
        pretrained, peft, device=device, gpus=gpus, dtype=dtype, scratch=scratch,
        vllm_installed=installed, gpu_name=detect_gpu_name() if on_gpu and installed and peft else None,
        gpu_memory_utilization=gpu_memory_utilization, seed=seed, max_model_len=max_model_len,
        enforce_eager=enforce_eager,
    )
    _visible_log()
    for note in plan.notes:
        (LOG.warning if note.startswith("vLLM is not installed") else LOG.info)("%s", note)
    if plan.merge is not None:
        merge_adapter(plan.merge.base, plan.merge.adapter, plan.merge.dest, dtype=dtype)
    return plan.model, plan.args


def release(lm: Any) -> None:
    """Free what a loaded lm-eval model holds before the next one loads (a warm engine loads many).

    For ``vllm``: shut down its engine (and its worker processes), tear down the distributed state
    that tensor parallelism set up, and empty the CUDA cache; without this the next ``LLM`` finds
    the GPU memory still taken. For ``hf``: drop the model and empty the cache.
    """
    import gc

    llm = getattr(lm, "model", None)  # vllm: the vllm.LLM; hf: the torch model (a property)
    engine = getattr(llm, "llm_engine", None)
    for owner in (engine, getattr(engine, "engine_core", None)):
        shutdown = getattr(owner, "shutdown", None)
        if callable(shutdown):
            shutdown()
            break
    for attr in ("model", "_model"):  # the instance's own references (not properties)
        if attr in vars(lm):
            delattr(lm, attr)
    del llm, engine
    if importlib.util.find_spec("vllm") is not None and "vllm" in str(type(lm).__module__):
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
