"""Which lm-eval model the warm benchmark engine loads for one model: ``hf`` on CPU, ``vllm`` on GPU.

Runs inside the fine-tuning toolchain (the sandbox image's Python), beside the engine script: it
imports nothing from ftbus, only the standard library (and, lazily, the toolchain's packages).

    name, model_args = lm_eval_model(pretrained, peft, device="cpu", gpus=0, dtype=None, scratch=...)
    lm = lm_eval.api.registry.get_model(name).create_from_arg_obj(model_args)
"""

from __future__ import annotations

from typing import Any


def lm_eval_model(
    pretrained: str, peft: str | None, *, device: str, gpus: int, dtype: str | None, scratch: str
) -> tuple[str, dict[str, Any]]:
    """The lm-eval model type and its arguments for ``pretrained`` (plus a LoRA adapter ``peft``).

    ``gpus``: how many GPUs this worker was given; ``scratch``: a folder the engine may write to
    (for a merged model). On CPU (or CUDA without vLLM) this is lm-eval's ``hf`` model, exactly
    what the per-split ``lm_eval`` command loads.
    """
    if device == "cuda" and gpus > 0:
        raise RuntimeError("the vLLM path of the warm engine is not built yet: run the benchmark on device hf")
    args: dict[str, Any] = {"pretrained": pretrained, "device": device}
    if peft:
        args["peft"] = peft
    if dtype:
        args["dtype"] = dtype
    return "hf", args
