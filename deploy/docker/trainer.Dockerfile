# syntax=docker/dockerfile:1
# GPU image for the trainer stage: runs the candidate's `llamafactory-cli train train.yaml` (and its
# process_data.py for the data stage) in /workspace, with base models and raw datasets mounted
# read-only at /assets. Build from the repository root:
#
#   docker build -f deploy/docker/trainer.Dockerfile -t ftbus-trainer .
#   docker run --gpus all --network none -v $ASSETS:/assets:ro -v $WS:/workspace ftbus-trainer
#
# torch 2.13.0 from PyPI is the CUDA 13.0 build: its cuda-toolkit 13.0.x wheels bring the CUDA and
# cuDNN libraries, so the small CUDA `base` image is enough (it sets what the NVIDIA container
# toolkit reads); hosts need a driver for CUDA 13. Versions are the ones measured for the CPU
# toolchain (deploy/toolchain/constraints.txt, Python 3.11; this image's Python is Ubuntu 24.04's
# 3.12), so a LoRA adapter trained here loads with the same transformers/peft in the benchmark image.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv socat python3-dev build-essential ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# One virtualenv outside the user's home; pip (not uv): pins below are pip constraints.
ENV VIRTUAL_ENV=/opt/toolchain
ENV PATH=/opt/toolchain/bin:$PATH
RUN python3 -m venv $VIRTUAL_ENV && pip install --no-cache-dir --upgrade pip

COPY deploy/toolchain/constraints.txt /tmp/toolchain/constraints.txt
COPY deploy/toolchain/torchaudio_standin /tmp/toolchain/torchaudio_standin
# torch pinned in the same command as llamafactory (else pip may resolve another torch). The
# constraints also pin torchvision 0.28.0 (built for torch 2.13) and torchaudio.
RUN pip install --no-cache-dir -c /tmp/toolchain/constraints.txt "llamafactory==0.9.5" "torch==2.13.0"
# LlamaFactory imports torchaudio at module level. If the pinned torchaudio does not load beside
# torch 2.13 (its C++ extension is built per torch release), use the stand-in of the CPU toolchain:
# text fine-tuning never calls it. A torchvision that does not load is removed (transformers then
# treats it as absent) rather than left to break `import transformers`.
RUN if ! python -c "import torchaudio" 2>/dev/null; then \
        pip uninstall -y torchaudio \
        && cp -r /tmp/toolchain/torchaudio_standin "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torchaudio"; \
    fi \
    && if ! python -c "import torchvision.ops" 2>/dev/null; then pip uninstall -y torchvision; fi \
    && rm -rf /tmp/toolchain

# Offline by design: training has no network; models and datasets come from /assets.
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    FTBUS_ASSETS_DIR=/assets FT_MODEL_PATH=/assets/models FT_DATASET_PATH=/assets/datasets \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false

# The import chain that fails on a torch/torchvision/torchaudio mismatch, checked at build time.
RUN python -c "import transformers, peft, llamafactory; from llamafactory.train.tuner import run_exp" \
    && llamafactory-cli version

# Non-root: files the candidate writes in /workspace belong to an ordinary user (the reference
# needed an in-container `rm -rf` because its outputs were root-owned).
ARG UID=1000
RUN (userdel -r ubuntu 2>/dev/null || true) \
    && useradd --create-home --uid ${UID} --shell /bin/bash ftbus \
    && mkdir -p /assets /workspace \
    && chmod 755 /root \
    && chown ftbus:ftbus /workspace
USER ftbus
WORKDIR /workspace
VOLUME ["/assets", "/workspace"]

CMD ["llamafactory-cli", "train", "train.yaml"]
