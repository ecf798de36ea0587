"""Fixtures shared by integration and e2e tests: one real nats-server per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import hypothesis  # noqa: F401  (see below)
import pytest

# Imported here, at collection, on purpose: otherwise hypothesis's pytest plugin imports it in the
# terminal summary, deep in pluggy's call stack, where CPython 3.11.7's ast.parse (run by pytest's
# assertion rewriting) can fail with "SystemError: AST constructor recursion depth mismatch" and
# turn a green run of a few test files red.

# Integration and delivery tests run the stand-in tools (tests/standin/) on the host: they are
# about the bus, not isolation, so their workers use the local runner, chosen explicitly as a
# deployment must. The sandbox's own tests (tests/integration/test_sandbox*.py) and the e2e tests
# with the real toolchain set sandbox="docker" themselves.
os.environ.setdefault("FTBUS_SANDBOX", "local")
# The stand-in `lm_eval` is a command, not a harness a warm engine can import: those tests run the
# benchmark cold (a process per split). The warm engine has its own tests with the real lm-eval
# (tests/e2e/test_bench_engine.py, and tests/e2e/test_examples.py sets it explicitly).
os.environ.setdefault("FTBUS_BENCH_ENGINE", "cold")
# Four test workers share two cores, each with trainings, engines and lm-eval runs of its own: one
# thread per candidate run (its container limited to one CPU: settings.sandbox_cpus) and per process
# the tests start themselves. With torch's default, a thread per core in every process, the pools
# spin at their barriers while their siblings wait for a core: the three example trainings side by
# side took 247 s that way, 130 s with one thread each (docs/operations.md, "CPU nodes").
os.environ.setdefault("FTBUS_SANDBOX_CPUS", "1")
# Most tests are about delivery, sandboxes and scores, not about what "better" means: their tiny
# benchmarks have no confirmation pool, under which the default policy (`better`) refuses every
# candidate. They run under `llm`, the reference evaluator's meaning ("it ran, the judge liked it").
# The default's own tests set judge_policy="better" themselves (tests/unit/test_judge_decide.py,
# tests/unit/test_campaigns.py, tests/integration/test_decision_pipeline.py, tests/e2e/test_examples.py's
# refusal).
os.environ.setdefault("FTBUS_JUDGE_POLICY", "llm")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ftbus.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("nats")
    server = EmbeddedServer(store, log_file=store / "server.log")
    server.start()
    yield server
    server.stop()
