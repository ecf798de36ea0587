"""evaluation/engine/vllm_support.py: which lm-eval model the warm engine loads, and the merge.

The module runs inside the fine-tuning toolchain, beside the engine script, so it is loaded here by
path (as the engine loads it); it must import nothing but the standard library at import time. The
decisions (hf or vllm, served or merged, tensor parallelism, LoRA rank) are pure and tested without
vLLM; the merge runs for real in the toolchain's Python (skipped, saying so, without it).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE_PATH = ROOT / "evaluation" / "engine" / "vllm_support.py"
GPU_CHECK = ROOT / "deploy" / "gpu" / "gpu_check.py"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


vs = _load(MODULE_PATH, "ftbus_test_vllm_support")


def _adapter(tmp_path: Path, name: str = "adapter", *, safetensors: bool = True, **config) -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    base = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
            "modules_to_save": None, "bias": "none", "use_dora": False}
    (folder / "adapter_config.json").write_text(json.dumps(base | config))
    if safetensors:
        _write_safetensors(folder / "adapter_model.safetensors",
                           {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": [8, 64]})
    return folder


def _write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A valid safetensors file (float32 zeros) with these tensor shapes."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def _model(tmp_path: Path, heads: int = 4) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": heads}))
    return folder


# ------------------------------------------------------------------ importable, stdlib only


def test_imports_only_the_standard_library() -> None:
    code = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("m", {str(MODULE_PATH)!r})
        m = importlib.util.module_from_spec(spec); sys.modules["m"] = m; spec.loader.exec_module(m)
        heavy = sorted(n for n in ("torch", "transformers", "peft", "vllm", "lm_eval", "pydantic", "shared",
                                   "evaluation", "services") if n in sys.modules)
        print(",".join(heavy) or "none")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none"


def test_importable_as_a_package_module_too() -> None:
    from evaluation.engine import vllm_support

    assert vllm_support.lm_eval_model.__name__ == "lm_eval_model"
    assert vllm_support.VLLM_LORA_RANKS == vs.VLLM_LORA_RANKS


# ------------------------------------------------------------------ pure decisions


@pytest.mark.parametrize(("gpus", "heads", "tp"), [
    (0, None, 1), (1, None, 1), (2, None, 2), (3, None, 2), (4, 32, 4), (6, 32, 4), (8, 32, 8),
    (8, 4, 4), (8, 12, 4), (8, 14, 2), (4, 7, 1), (16, None, 16),
])
def test_tensor_parallel_size_is_a_power_of_two_dividing_the_heads(gpus: int, heads: int | None, tp: int) -> None:
    assert vs.tensor_parallel_size(gpus, heads) == tp


@pytest.mark.parametrize(("rank", "max_rank"), [
    (1, 1), (2, 8), (8, 8), (9, 16), (16, 16), (64, 64), (65, 128), (300, 320), (512, 512), (513, None),
])
def test_max_lora_rank_is_the_smallest_vllm_accepts(rank: int, max_rank: int | None) -> None:
    assert vs.vllm_max_lora_rank(rank) == max_rank


def test_plain_lora_is_served(tmp_path: Path) -> None:
    info = vs.read_adapter(_adapter(tmp_path))
    assert info.rank == 8 and info.target_modules == ("q_proj", "v_proj") and info.has_safetensors
    assert vs.merge_reasons(info) == []
    assert vs.merge_reasons(info, gpu_name="NVIDIA H200") == []
    assert vs.merge_reasons(vs.read_adapter(_adapter(tmp_path, "all", target_modules="all-linear"))) == []


@pytest.mark.parametrize(("config", "words"), [
    ({"modules_to_save": ["embed_tokens", "lm_head"]}, "modules_to_save"),
    ({"target_modules": ["q_proj", "lm_head"]}, "lm_head"),
    ({"target_modules": ["model.embed_tokens", "v_proj"]}, "embed_tokens"),
    ({"target_modules": r".*\.(q_proj|lm_head)"}, "lm_head"),
    ({"use_dora": True}, "DoRA"),
    ({"bias": "all"}, "biases"),
    ({"lora_bias": True}, "biases"),
    ({"rank_pattern": {"q_proj": 16}}, "rank_pattern"),
    ({"r": 1024}, "rank 1024"),
    ({"peft_type": "IA3"}, "IA3"),
])
def test_merge_reasons(tmp_path: Path, config: dict, words: str) -> None:
    reasons = vs.merge_reasons(vs.read_adapter(_adapter(tmp_path, **config)))
    assert len(reasons) == 1 and words in reasons[0], reasons


def test_blackwell_gpus_merge_as_the_reference_does(tmp_path: Path) -> None:
    info = vs.read_adapter(_adapter(tmp_path))
    assert "B200" in vs.merge_reasons(info, gpu_name="NVIDIA B200")[0]
    assert vs.merge_reasons(info, gpu_name="NVIDIA GB300") != []


def test_visible_gpu_names_follow_cuda_visible_devices() -> None:
    smi = ["NVIDIA H200", "NVIDIA B200", "NVIDIA H200"]
    assert vs.visible_gpu_names(smi, None) == smi
    assert vs.visible_gpu_names(smi, "0,2") == ["NVIDIA H200", "NVIDIA H200"]
    assert vs.visible_gpu_names(smi, "1") == ["NVIDIA B200"]
    assert vs.visible_gpu_names(smi, "") == []
    assert vs.visible_gpu_names(smi, "GPU-5f2c") == smi


def test_read_adapter_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(vs.VllmSupportError, match=r"no adapter_config\.json"):
        vs.read_adapter(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text("{not json")
    with pytest.raises(vs.VllmSupportError, match="cannot be read"):
        vs.read_adapter(tmp_path / "bad")


def test_cpu_plan_is_the_hf_model_as_before(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    plan = vs.plan_model("/m", str(adapter), device="cpu", gpus=0, dtype="float32", scratch=str(tmp_path),
                         vllm_installed=True)
    assert (plan.model, plan.args, plan.merge, plan.notes) == (
        "hf", {"pretrained": "/m", "device": "cpu", "peft": str(adapter), "dtype": "float32"}, None, [])
    # the public entry point, here (no CUDA): the same
    assert vs.lm_eval_model("/m", None, device="cpu", gpus=0, dtype=None, scratch=str(tmp_path)) == (
        "hf", {"pretrained": "/m", "device": "cpu"})


def test_cuda_without_gpus_given_stays_hf(tmp_path: Path) -> None:
    plan = vs.plan_model("/m", None, device="cuda", gpus=0, dtype=None, scratch=str(tmp_path), vllm_installed=True)
    assert plan.model == "hf" and plan.args == {"pretrained": "/m", "device": "cuda"}


def test_cuda_without_vllm_falls_back_to_hf_and_says_so(tmp_path: Path) -> None:
    plan = vs.plan_model("/m", None, device="cuda", gpus=2, dtype="bfloat16", scratch=str(tmp_path),
                         vllm_installed=False)
    assert plan.model == "hf"
    assert plan.args == {"pretrained": "/m", "device": "cuda", "dtype": "bfloat16", "parallelize": True}
    assert len(plan.notes) == 1 and "vLLM is not installed" in plan.notes[0] and "pip install vllm" in plan.notes[0]


def test_vllm_plan_serves_a_plain_lora_unmerged(tmp_path: Path) -> None:
    model, adapter = _model(tmp_path, heads=4), _adapter(tmp_path, r=24)
    plan = vs.plan_model(str(model), str(adapter), device="cuda", gpus=8, dtype=None, scratch=str(tmp_path / "s"),
                         vllm_installed=True, gpu_memory_utilization=0.6, seed=3, max_model_len=2048)
    assert plan.model == "vllm" and plan.merge is None
    assert plan.args == {
        "pretrained": str(model), "dtype": "auto", "tensor_parallel_size": 4, "gpu_memory_utilization": 0.6,
        "seed": 3, "trust_remote_code": False, "enforce_eager": True, "batch_size": "auto", "max_model_len": 2048,
        "lora_local_path": str(adapter), "max_lora_rank": 32,
    }
    assert any("tensor_parallel_size 4 of the 8 GPUs" in n for n in plan.notes)
    assert any("unmerged" in n for n in plan.notes)


def test_vllm_args_are_what_the_installed_lm_eval_vllm_model_takes(tmp_path: Path) -> None:
    """lm-eval's vllm model cannot be imported without vLLM: read its constructor from the source."""
    import ast

    python = _toolchain_python()
    proc = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('lm_eval').origin)"],
                          capture_output=True, text=True, timeout=120)
    source = Path(proc.stdout.strip()).parent / "models" / "vllm_causallms.py"
    if not source.is_file():
        pytest.skip(f"this lm-eval has no vllm model source at {source}")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    init = next(node for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) and cls.name == "VLLM"
                for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    named = {a.arg for a in init.args.args + init.args.kwonlyargs}
    assert init.args.kwarg is not None  # the rest goes to vllm.LLM(**kwargs)
    adapter = _adapter(tmp_path, r=8)
    plan = vs.plan_model(str(_model(tmp_path)), str(adapter), device="cuda", gpus=2, dtype=None,
                         scratch=str(tmp_path), vllm_installed=True, max_model_len=512)
    passed_to_llm = {"gpu_memory_utilization", "enforce_eager"}  # vllm.LLM / EngineArgs fields
    assert set(plan.args) - passed_to_llm <= named, set(plan.args) - passed_to_llm - named


def test_vllm_plan_merges_a_modules_to_save_adapter(tmp_path: Path) -> None:
    model = _model(tmp_path)
    adapter = _adapter(tmp_path, modules_to_save=["embed_tokens", "lm_head"])
    scratch = tmp_path / "scratch"
    plan = vs.plan_model(str(model), str(adapter), device="cuda", gpus=1, dtype="bfloat16", scratch=str(scratch),
                         vllm_installed=True)
    assert plan.model == "vllm"
    assert plan.merge == vs.MergeJob(base=str(model), adapter=str(adapter), dest=str(scratch / "merged"),
                                     reasons=plan.merge.reasons)
    assert "modules_to_save" in plan.merge.reasons[0]
    assert plan.args["pretrained"] == str(scratch / "merged") and plan.args["dtype"] == "bfloat16"
    assert "lora_local_path" not in plan.args and "max_lora_rank" not in plan.args
    assert plan.args["tensor_parallel_size"] == 1 and plan.args["trust_remote_code"] is False


def test_vllm_plan_refuses_pickled_adapters(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path, safetensors=False)
    (adapter / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(vs.VllmSupportError, match="safetensors only"):
        vs.plan_model(str(_model(tmp_path)), str(adapter), device="cuda", gpus=1, dtype=None,
                      scratch=str(tmp_path), vllm_installed=True)


def test_adapter_vocab_size_reads_the_saved_embedding(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path, modules_to_save=["embed_tokens", "lm_head"])
    _write_safetensors(adapter / "adapter_model.safetensors", {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": [8, 64],
        "base_model.model.lm_head.weight": [2112, 64],
        "base_model.model.model.embed_tokens.weight": [2112, 64],
    })
    assert vs.safetensors_shapes(adapter / "adapter_model.safetensors")["base_model.model.lm_head.weight"] == [2112, 64]
    assert vs.adapter_vocab_size(adapter) == 2112
    assert vs.adapter_vocab_size(_adapter(tmp_path, "plain")) is None


def test_release_shuts_vllm_down_and_drops_the_model() -> None:
    calls: list[str] = []

    class Core:
        def shutdown(self) -> None:
            calls.append("core")

    class LLM:  # vllm.LLM's shape: llm_engine (with engine_core in v1)
        def __init__(self) -> None:
            self.llm_engine = type("Engine", (), {"engine_core": Core()})()

    class VllmLike:
        def __init__(self) -> None:
            self.model = LLM()

    lm = VllmLike()
    vs.release(lm)
    assert calls == ["core"] and not hasattr(lm, "model")

    class HFLike:  # lm-eval's HFLM: ``model`` is a property over ``_model``
        def __init__(self) -> None:
            self._model = object()

        @property
        def model(self) -> object:
            return self._model

    hf = HFLike()
    vs.release(hf)
    assert "_model" not in vars(hf)


# ------------------------------------------------------------------ the merge, for real


def _toolchain_python() -> Path:
    from shared.settings import Settings

    toolchain = Settings().toolchain_path()
    python = toolchain / "python" if toolchain else None
    if python is None or not python.exists():
        pytest.skip("the fine-tuning toolchain is not installed: run `make toolchain` (make test does)")
    probe = subprocess.run([str(python), "-c", "import torch, transformers, peft"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{python} lacks torch/transformers/peft: run `make toolchain`")
    return python


MERGE_SCRIPT = r"""
import importlib.util, json, sys
from pathlib import Path
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

module_path, work = sys.argv[1], Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("vs", module_path)
vs = importlib.util.module_from_spec(spec); sys.modules["vs"] = vs; spec.loader.exec_module(vs)

torch.manual_seed(0)
vocab = {f"w{i}": i for i in range(60)} | {"<unk>": 60, "<s>": 61, "</s>": 62, "<pad>": 63}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
base_dir = work / "base"
fast.save_pretrained(base_dir)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
LlamaForCausalLM(config).save_pretrained(base_dir)

# An adapter trained the way LlamaFactory's resize_vocab + additional_target leaves one: the
# vocabulary grown to 72, embed_tokens and lm_head saved in full, LoRA on q_proj/v_proj.
model = AutoModelForCausalLM.from_pretrained(base_dir)
model.resize_token_embeddings(72)
peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                               modules_to_save=["embed_tokens", "lm_head"], init_lora_weights=False))
with torch.no_grad():
    for name, p in peft_model.named_parameters():
        if "modules_to_save" in name:
            p.add_(torch.randn_like(p) * 0.5)
adapter_dir = work / "adapter"
peft_model.save_pretrained(adapter_dir)
fast.save_pretrained(adapter_dir)
assert (adapter_dir / "adapter_model.safetensors").is_file()

ids = torch.tensor([[61, 3, 70, 5, 9]])
peft_model.eval()
with torch.no_grad():
    expected = peft_model(ids).logits

dest = vs.merge_adapter(base_dir, adapter_dir, work / "scratch" / "merged")
merged = AutoModelForCausalLM.from_pretrained(dest)
with torch.no_grad():
    got = merged(ids).logits
base = AutoModelForCausalLM.from_pretrained(base_dir)
print(json.dumps({
    "dest": str(dest),
    "files": sorted(p.name for p in dest.iterdir()),
    "vocab": merged.config.vocab_size,
    "max_diff": float((got - expected).abs().max()),
    "differs_from_base": float((got[..., :64] - base(torch.tensor([[61, 3, 1, 5, 9]])).logits).abs().max()) > 1e-3,
    "vocab_read": vs.adapter_vocab_size(adapter_dir),
    "no_partial": not (work / "scratch" / "merged.partial").exists(),
}))
"""


def test_merge_adapter_for_real(tmp_path: Path) -> None:
    python = _toolchain_python()
    script = tmp_path / "merge_check.py"
    script.write_text(MERGE_SCRIPT)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([str(python), str(script), str(MODULE_PATH), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dest"] == str(tmp_path / "scratch" / "merged") and out["no_partial"]
    assert "model.safetensors" in out["files"] and "tokenizer.json" in out["files"]
    assert not any(name.endswith(".bin") for name in out["files"])
    assert out["vocab"] == 72 and out["vocab_read"] == 72
    # the merged model computes what base + adapter computes, and not what the base alone does
    assert out["max_diff"] < 1e-4, out
    assert out["differs_from_base"]


# ------------------------------------------------------------------ make gpu-check, where there is no GPU


def test_gpu_check_arguments() -> None:
    check = _load(GPU_CHECK, "ftbus_test_gpu_check")
    args = check.parse_args(["--toolchain-bin", "/x/bin", "--gpus", "2", "--steps", "5", "--cpu-rehearsal"])
    assert (args.toolchain_bin, args.gpus, args.steps, args.cpu_rehearsal) == (Path("/x/bin"), 2, 5, True)
    assert check.parse_args([]).timeout < 600  # under the 10 minutes the check promises
    with pytest.raises(SystemExit) as exc:
        check.parse_args(["--gpus", "0"])
    assert exc.value.code == 2
    text = check.train_yaml(Path("/m"), Path("/o"), 7, True, False)
    assert "additional_target: embed_tokens,lm_head" in text and "max_steps: 7" in text and "use_cpu" not in text


def test_gpu_check_help() -> None:
    proc = subprocess.run(["bash", str(ROOT / "deploy" / "gpu" / "check.sh"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--cpu-rehearsal" in proc.stdout and "3 could not run" in proc.stdout


def test_gpu_check_says_it_could_not_run_without_a_toolchain(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "deploy" / "gpu" / "check.sh"), "--toolchain-bin", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "COULD NOT RUN" in proc.stderr and f"no toolchain python at {tmp_path}/python" in proc.stderr


def test_gpu_check_says_it_could_not_run_without_a_gpu() -> None:
    python = _toolchain_python()
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() == "True":
        pytest.skip("a CUDA GPU is visible here: run `make gpu-check` itself")
    proc = subprocess.run(["bash", str(ROOT / "deploy" / "gpu" / "check.sh"), "--toolchain-bin", str(python.parent)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "COULD NOT RUN: no CUDA GPU visible" in proc.stderr
    assert "COULD NOT RUN" in proc.stdout and "PASS" not in proc.stdout
