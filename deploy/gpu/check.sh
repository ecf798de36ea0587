#!/usr/bin/env bash
# `make gpu-check`: the benchmark's GPU path (lm-eval's vLLM model, a LoRA served unmerged and a
# modules_to_save adapter merged, tensor parallelism from the GPUs given) end to end on a small
# model built here, in under 10 minutes. Needs a CUDA GPU and a toolchain with CUDA torch + vLLM
# (FTBUS_TOOLCHAIN_BIN, else .toolchain/bin); no network. Arguments go to deploy/gpu/gpu_check.py
# (--help). Exit status: 0 PASS, 1 FAIL, 3 could not run here (the message says what is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${FTBUS_SERVICES_PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ]; then
  echo "gpu-check: COULD NOT RUN: no services environment at $PY (run \`make install\`)" >&2
  exit 3
fi
exec "$PY" deploy/gpu/gpu_check.py "$@"
