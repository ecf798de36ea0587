# The sandbox image with the stand-in llamafactory-cli and lm_eval (tests/standin/) in place of the
# real ones, for `make cluster`: candidate containers start through the engine exactly as in
# production, and a training takes a second instead of minutes on 2 cores. Built FROM the image
# `make images` made; context: tests/standin.
ARG SANDBOX_IMAGE=ftbus-sandbox:latest
FROM ${SANDBOX_IMAGE}
COPY llamafactory-cli lm_eval /opt/toolchain/bin/
