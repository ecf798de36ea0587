#!/usr/bin/env bash
# Builds the fine-tuning toolchain virtualenv (LlamaFactory + torch CPU + lm-eval), apart from the
# services' .venv. Usage: deploy/toolchain/install.sh [DEST]   (DEST defaults to <repo>/.toolchain)
#
# Idempotent: a stamp file keyed on the hash of this script, requirements.txt, constraints.txt and
# the interpreter version makes a second run return at once, so `make test` stays fast.
# Facts behind each step (measured on this project's machines; docs/dependencies.md):
#  - pip, not uv/poetry: only pip sees the CPU torch wheel that lies on the machine's disk;
#  - torch pinned in the same pip command as llamafactory, else pip takes torch 2.14 + CUDA wheels;
#  - torchvision/torchaudio come along as CUDA builds that break `import transformers` next to a
#    CPU torch: they are removed, and a tiny torchaudio stand-in lets LlamaFactory import.
# Environment: TOOLCHAIN_PYTHON (interpreter, default python3.11), TOOLCHAIN_FORCE=1 (rebuild).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DEST="${1:-$REPO/.toolchain}"
PYTHON="${TOOLCHAIN_PYTHON:-python3.11}"
REQ="$HERE/requirements.txt"
CONSTRAINTS="$HERE/constraints.txt"
STAMP="$DEST/.ftbus-toolchain.stamp"

log() { printf '[toolchain] %s\n' "$*" >&2; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "interpreter '$PYTHON' not found (set TOOLCHAIN_PYTHON)"; exit 2
fi

# What the env is built from; any change to it means a rebuild.
key="$( {
    cat "${BASH_SOURCE[0]}" "$REQ" "$HERE/torchaudio_standin/__init__.py"
    [ -f "$CONSTRAINTS" ] && cat "$CONSTRAINTS"
    "$PYTHON" -c 'import sys; print(sys.version)'
} | sha256sum | cut -d' ' -f1)"

if [ "${TOOLCHAIN_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] \
    && [ -x "$DEST/bin/llamafactory-cli" ] && [ -x "$DEST/bin/lm_eval" ] && [ -x "$DEST/bin/python" ]; then
    log "up to date: $DEST"
    exit 0
fi

start=$(date +%s)
rm -f "$STAMP"
if [ ! -x "$DEST/bin/python" ]; then
    log "creating virtualenv $DEST"
    "$PYTHON" -m venv "$DEST"
fi
PY="$DEST/bin/python"

constraint_args=()
[ -f "$CONSTRAINTS" ] && constraint_args=(-c "$CONSTRAINTS")

log "pip install -r $REQ ${constraint_args[*]}"
"$PY" -m pip install --disable-pip-version-check --no-input -r "$REQ" "${constraint_args[@]}"

# CUDA builds of these break `import transformers` beside the CPU torch (torchvision::nms).
log "removing torchvision/torchaudio (CUDA builds that do not match the CPU torch)"
"$PY" -m pip uninstall --disable-pip-version-check -y torchvision torchaudio >/dev/null 2>&1 || true

# LlamaFactory 0.9.5 imports torchaudio unconditionally (data/mm_plugin.py) but uses it only for
# audio inputs: a plain package (see torchaudio_standin/__init__.py) lets it import. transformers
# 5.6 then reports torchaudio available (it only asks find_spec), which matters only to audio
# models and pipelines: those fail with the stand-in's message instead of an import error.
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/torchaudio"
cp -r "$HERE/torchaudio_standin" "$site/torchaudio"
rm -rf "$site/torchaudio/__pycache__"

# Smoke test, offline as the stages run it: both entry points must start without the network.
log "checking llamafactory-cli and lm_eval offline"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
"$PY" - <<'PYEOF'
import importlib.metadata as md

import torch
import transformers  # noqa: F401  (fails on a torchvision/torch mismatch)
import llamafactory
import lm_eval  # noqa: F401
from llamafactory.train.tuner import run_exp  # noqa: F401  (the import chain that pulls torchaudio)

print("torch", torch.__version__, "transformers", transformers.__version__,
      "llamafactory", llamafactory.__version__, "lm_eval", md.version("lm_eval"))
PYEOF
"$DEST/bin/llamafactory-cli" version >/dev/null
"$DEST/bin/lm_eval" --help >/dev/null

echo "$key" > "$STAMP"
log "done in $(( $(date +%s) - start )) s: $DEST"
