"""ftbus stand-in for torchaudio (installed by deploy/toolchain/install.sh): importable, does nothing.

LlamaFactory 0.9.5 imports torchaudio at module level (data/mm_plugin.py) but needs it only for
audio inputs, and the torchaudio build pip brings does not load beside a CPU torch. This package has
no dist-info on purpose: transformers' is_torchaudio_available() reads package metadata, so it
still reports torchaudio absent and never takes an audio code path. Any real use fails loudly.
"""

__version__ = "0.0.0+ftbus.standin"


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torchaudio.{name}: this toolchain has only a stand-in torchaudio (audio is unsupported "
        "on the CPU toolchain; use the GPU image)"
    )
