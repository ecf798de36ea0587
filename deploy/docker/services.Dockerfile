# syntax=docker/dockerfile:1
# The ftbus services' image: the `ftbus` command (workers, CLI) in its own virtualenv, non-root.
# Build from the repository root. Two targets:
#
#   docker build -f deploy/docker/services.Dockerfile -t ftbus-services .
#       (default target `services`) python:3.11-slim + ftbus. For `ftbus worker judge`,
#       `ftbus worker aggregate`, the CLI (`ftbus submit`, `get`, `watch`, ...) and the topology job.
#
#   docker build -f deploy/docker/services.Dockerfile --target toolchain -t ftbus-toolchain .
#       The same plus the fine-tuning toolchain (torch, LlamaFactory, lm-eval) in a SECOND
#       virtualenv, /opt/toolchain, built by deploy/toolchain/install.sh with the measured pins.
#       For `ftbus worker data|train|bench`: the services run candidate code as subprocesses
#       (LocalRunner), and FTBUS_TOOLCHAIN_BIN=/opt/toolchain/bin puts llamafactory-cli, lm_eval and
#       the toolchain's python first on the children's PATH. torch 2.13.0 from PyPI is a CUDA build
#       that carries its CUDA libraries as wheels: a GPU host needs only the NVIDIA driver and
#       container toolkit (docker `--gpus`, or the Kubernetes device plugin).
#
# Two environments, never one (docs/dependencies.md): the toolchain's gradio caps pydantic at
# 2.12.3, the services pin 2.14.4. The services never import torch/llamafactory/lm_eval.
#
# The images deploy/docker/trainer.Dockerfile and benchmark.Dockerfile are toolchain-only images
# (Ubuntu 24.04, Python 3.12) for running a stage's command in a container by hand; ftbus's
# services (Python 3.11 only, see pyproject.toml) run from the `toolchain` target here.

ARG PYTHON_IMAGE=python:3.11-slim

# ----------------------------------------------------------------------------- services venv
FROM ${PYTHON_IMAGE} AS services-venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ftbus
WORKDIR /src
# Only what the distribution is built from (pyproject.toml: packages shared*, services*).
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY ftbus ./ftbus
# A regular (not editable) install: the exact pins of pyproject.toml, nothing from the source tree
# is needed at run time except the judge prompts, copied below.
RUN /opt/ftbus/bin/pip install . \
    && /opt/ftbus/bin/ftbus --help >/dev/null

# ----------------------------------------------------------------------------- toolchain venv
FROM ${PYTHON_IMAGE} AS toolchain-venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A few toolchain dependencies may build from source on some platforms.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/toolchain /src/deploy/toolchain
# One pip command with torch pinned beside llamafactory and lm-eval, then the torchvision/
# torchaudio clean-up and the torchaudio stand-in, then an offline import check.
RUN TOOLCHAIN_PYTHON=python3.11 bash /src/deploy/toolchain/install.sh /opt/toolchain \
    && rm -rf /src

# ----------------------------------------------------------------------------- runtime base
FROM ${PYTHON_IMAGE} AS base
ARG UID=10001
RUN useradd --uid ${UID} --user-group --create-home --home-dir /var/lib/ftbus --shell /usr/sbin/nologin ftbus \
    && mkdir -p /assets \
    && chown ftbus:ftbus /var/lib/ftbus
COPY --from=services-venv /opt/ftbus /opt/ftbus
# The judge's prompt templates are read at run time; outside the repository they are found
# through FTBUS_JUDGE_PROMPTS_FILE.
COPY prompts /opt/ftbus/prompts
ENV PATH=/opt/ftbus/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FTBUS_HOME=/var/lib/ftbus \
    FTBUS_ASSETS_DIR=/assets \
    FTBUS_LOG_FORMAT=json \
    FTBUS_JUDGE_PROMPTS_FILE=/opt/ftbus/prompts/judge.yaml
WORKDIR /var/lib/ftbus
# /var/lib/ftbus: the ftbus home (worker scratch under work/). /assets: models/, datasets/,
# benchmarks/, mounted read-only on workers.
VOLUME ["/var/lib/ftbus"]
USER ftbus
ENTRYPOINT ["ftbus"]
CMD ["--help"]

# ----------------------------------------------------------------------------- toolchain target
# data, train, bench workers.
FROM base AS toolchain
COPY --from=toolchain-venv /opt/toolchain /opt/toolchain
ENV FTBUS_TOOLCHAIN_BIN=/opt/toolchain/bin \
    HF_HOME=/var/lib/ftbus/hf \
    TOKENIZERS_PARALLELISM=false \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# (still USER ftbus, ENTRYPOINT ftbus)

# ----------------------------------------------------------------------------- services target
# judge, aggregate, CLI, topology job. Last, so that it is the default target.
FROM base AS services

# The sandbox: what candidate code runs in (docs/sandbox.md). The toolchain and socat (the LLM
# gateway's forwarder), nothing of ftbus, no settings; the runner chooses the user, the mounts and
# the environment. Built with `docker compose --profile build build sandbox-image`.
FROM ${PYTHON_IMAGE} AS sandbox
RUN apt-get update \
    && apt-get install -y --no-install-recommends socat \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin sandbox \
    && chmod 755 /root
COPY --from=toolchain-venv /opt/toolchain /opt/toolchain
ENV PATH=/opt/toolchain/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 1000
WORKDIR /tmp
