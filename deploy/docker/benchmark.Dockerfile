# syntax=docker/dockerfile:1
# GPU image for the benchmark stage: runs `lm_eval run --model hf ...` as rendered by
# evaluation/lmeval.py, against a base model from /assets (read-only) plus the candidate's
# adapter or full model and the split's task files in /workspace. Build from the repository root:
#
#   docker build -f deploy/docker/benchmark.Dockerfile -t ftbus-benchmark .
#   docker run --gpus all --network none -v $ASSETS:/assets:ro -v $RUN:/workspace ftbus-benchmark \
#       lm_eval run --model hf --model_args pretrained=/assets/models/M,peft=/workspace/output ...
#
# Same torch/transformers/peft as the trainer image (deploy/toolchain/constraints.txt) so that an
# adapter trained there loads here unchanged. torch 2.13.0 from PyPI is the CUDA 13.0 build and
# brings its CUDA/cuDNN libraries as wheels: the CUDA `base` image is enough; hosts need a CUDA 13
# driver. LlamaFactory is not installed: evaluation needs only lm-eval and the HF stack.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv socat python3-dev build-essential ca-certificates \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/toolchain
ENV PATH=/opt/toolchain/bin:$PATH
RUN python3 -m venv $VIRTUAL_ENV && pip install --no-cache-dir --upgrade pip

COPY deploy/toolchain/constraints.txt /tmp/toolchain/constraints.txt
# torch pinned in the same command as lm-eval; the constraints pin transformers, peft, accelerate,
# datasets to the trainer's versions.
RUN pip install --no-cache-dir -c /tmp/toolchain/constraints.txt \
        "lm-eval[hf]==0.4.13" "torch==2.13.0" transformers peft accelerate datasets \
    && rm -rf /tmp/toolchain

# Offline by design: the benchmark runs without network; models come from /assets and /workspace,
# task data from local json files. HF_DATASETS_CACHE is set per run by the service (inside the run
# folder), HF_HOME only catches anything else.
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    FTBUS_ASSETS_DIR=/assets FT_MODEL_PATH=/assets/models \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false

RUN python -c "import torch, transformers, peft, lm_eval" && lm_eval --help >/dev/null

ARG UID=1000
RUN (userdel -r ubuntu 2>/dev/null || true) \
    && useradd --create-home --uid ${UID} --shell /bin/bash ftbus \
    && mkdir -p /assets /workspace \
    && chmod 755 /root \
    && chown ftbus:ftbus /workspace
USER ftbus
WORKDIR /workspace
VOLUME ["/assets", "/workspace"]

CMD ["lm_eval", "--help"]
