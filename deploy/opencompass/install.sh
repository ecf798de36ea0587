#!/usr/bin/env bash
# Builds the OpenCompass benchmark backend's virtualenv (opencompass + CPU torch + transformers/peft),
# apart from the services' .venv and the fine-tuning .toolchain.
# Usage: deploy/opencompass/install.sh [DEST]   (DEST defaults to <repo>/.opencompass;
#        OPENCOMPASS_ENV=DIR does the same as DEST)
#
# Not part of `make test`: ~1.5-2 min and ~2.1 GB. The benchmark service finds the env through the
# `opencompass_bin` setting (default <repo>/.opencompass/bin); its e2e test skips when it is absent.
#
# Idempotent: a stamp keyed on the hash of this script, requirements.txt and the interpreter version
# makes a second run return at once. Facts behind each step (measured, see requirements.txt):
#  - its own env: opencompass 0.5.4 pins numpy<2 and datasets<4, which break the toolchain;
#  - pip, not uv/poetry: only pip sees the CPU torch wheel that lies on the machine's disk, and
#    torch is pinned in the same pip command, else pip takes torch 2.14 + CUDA wheels;
#  - pyarrow<20: later pyarrow needs numpy 2 and `import datasets` fails.
# Environment: OPENCOMPASS_PYTHON (interpreter, default python3.11), OPENCOMPASS_FORCE=1 (rebuild).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DEST="${1:-${OPENCOMPASS_ENV:-$REPO/.opencompass}}"
PYTHON="${OPENCOMPASS_PYTHON:-python3.11}"
REQ="$HERE/requirements.txt"
STAMP="$DEST/.ftbus-opencompass.stamp"

log() { printf '[opencompass] %s\n' "$*" >&2; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "interpreter '$PYTHON' not found (set OPENCOMPASS_PYTHON)"; exit 2
fi

# What the env is built from; any change to it means a rebuild.
key="$( {
    cat "${BASH_SOURCE[0]}" "$REQ"
    "$PYTHON" -c 'import sys; print(sys.version)'
} | sha256sum | cut -d' ' -f1)"

if [ "${OPENCOMPASS_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] \
    && [ -x "$DEST/bin/opencompass" ] && [ -x "$DEST/bin/python" ]; then
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
# ~2.1 GB that must never be committed, wherever DEST lies (Python 3.13's venv does the same).
echo '*' > "$DEST/.gitignore"

log "pip install -r $REQ"
"$PY" -m pip install --disable-pip-version-check --no-input -r "$REQ"

# Smoke test, offline as the benchmark stage runs it: everything a ftbus config imports, with the
# CPU torch, then the entry point itself.
log "checking opencompass offline"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
"$PY" - <<'PYEOF'
import importlib.metadata as md

import datasets
import numpy
import torch
import transformers
from opencompass.datasets.base import BaseDataset  # noqa: F401
from opencompass.models import HuggingFaceBaseModel, HuggingFacewithChatTemplate  # noqa: F401
from opencompass.openicl.icl_evaluator import BaseEvaluator  # noqa: F401
from opencompass.openicl.icl_inferencer import GenInferencer, PPLInferencer  # noqa: F401
from opencompass.tasks import OpenICLEvalTask, OpenICLInferTask  # noqa: F401

print("opencompass", md.version("opencompass"), "torch", torch.__version__, "transformers",
      transformers.__version__, "peft", md.version("peft"), "numpy", numpy.__version__,
      "datasets", datasets.__version__, "pyarrow", md.version("pyarrow"))
PYEOF
"$DEST/bin/opencompass" --help >/dev/null

echo "$key" > "$STAMP"
log "done in $(( $(date +%s) - start )) s: $DEST"
