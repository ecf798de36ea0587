# The sandbox image, where a registry and PyPI are reachable: what candidate code runs in
# (docs/sandbox.md). The toolchain (torch, LlamaFactory, lm-eval) and socat (the LLM gateway's
# forwarder), nothing of ftbus, no settings; the runner chooses the user, the mounts and the
# environment. Build from the repository root:
#
#   docker build -f deploy/docker/sandbox.Dockerfile -t ftbus-sandbox .
#
# Where no registry is reachable, deploy/sandbox/build.sh builds the same image offline (Debian by
# debootstrap, the toolchain this host built), and `make images` runs it. Either image is the
# TOOLCHAIN_IMAGE of deploy/docker/services.Dockerfile's `toolchain` target: build that one with
# the same Python (this file with python:3.11-slim: services.Dockerfile with
# BASE_IMAGE=python:3.11-slim).

ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A few toolchain dependencies may build from source on some platforms.
RUN apt-get update \
    && apt-get install -y --no-install-recommends socat build-essential \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/toolchain /src/deploy/toolchain
# One pip command with torch pinned beside llamafactory and lm-eval, then the torchvision/
# torchaudio clean-up and the torchaudio stand-in, then an offline import check.
RUN TOOLCHAIN_PYTHON=python3.11 bash /src/deploy/toolchain/install.sh /opt/toolchain \
    && rm -rf /src \
    && apt-get purge -y build-essential && apt-get autoremove -y \
    && useradd --uid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin ftbus \
    && chmod 755 /root
ENV PATH=/opt/toolchain/bin:$PATH \
    HOME=/tmp \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 1000
WORKDIR /tmp
