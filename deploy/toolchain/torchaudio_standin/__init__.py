"""ftbus stand-in for torchaudio (installed by deploy/toolchain/install.sh): importable, does nothing.

LlamaFactory 0.9.5 imports torchaudio at module level (data/mm_plugin.py) but needs it only for
audio inputs, and the torchaudio build pip brings does not load beside a CPU torch. It has no
dist-info (pip does not see it), but transformers 5.6's is_torchaudio_available() only asks
find_spec and so says True: audio models and pipelines would then reach this module, and any
attribute they ask for fails loudly below. Text fine-tuning and evaluation never touch it.
"""

__version__ = "0.0.0+ftbus.standin"


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torchaudio.{name}: this toolchain has only a stand-in torchaudio (audio is unsupported "
        "on the CPU toolchain; use the GPU image)"
    )
