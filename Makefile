# ftbus: `make demo` and `make test` are all the set-up there is; each installs what is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLCHAIN := .toolchain
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: install toolchain opencompass assets demo test test-unit test-integration test-e2e bench lint up clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# The fine-tuning toolchain (torch CPU, LlamaFactory, lm-eval) in its own environment.
toolchain:
	bash deploy/toolchain/install.sh $(TOOLCHAIN)

# Optional: the OpenCompass backend (FTBUS_BENCH_BACKEND=opencompass), in an environment of its own.
# Not part of `make test`; its e2e tests run when it exists and are skipped, saying why, when not.
opencompass:
	bash deploy/opencompass/install.sh .opencompass

assets: install toolchain
	$(BIN)/ftbus assets init

demo: install toolchain
	$(BIN)/python -m shared.demo

test: install toolchain
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: install toolchain
	$(BIN)/python -m pytest tests/e2e $(PYTEST_ARGS)

bench: install toolchain
	$(BIN)/python bench/pipeline_vs_direct.py

lint: install
	$(BIN)/ruff check .

up: install
	$(BIN)/ftbus up

clean:
	rm -rf $(VENV) $(TOOLCHAIN) .opencompass .pytest_cache .ruff_cache
