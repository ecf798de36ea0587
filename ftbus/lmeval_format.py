"""A verdict's validation results in lm-eval's results-file schema (`ftbus get ID --format lm-eval`).

The keys and shapes are lm-eval's own (lm_eval/result_schema.py, ``EvalResults``; what
``simple_evaluate`` writes to ``results_<date>.json``): ``results`` (per task: ``name``, ``alias``,
``sample_len``, and ``<metric>,<filter>`` / ``<metric>_stderr,<filter>`` values), ``groups`` and
``group_subtasks`` (the benchmark over all its subsets), ``configs``, ``versions``, ``n-shot``,
``higher_is_better``, ``n-samples`` and ``config`` (the model), so that scripts written for lm-eval's
files (its own ``make_table``, leaderboards) read them. Each subset is a task, named as ftbus names
it for lm-eval (``ftbus_<benchmark>_<subset>``); the filter is ``none``. Only the validation split:
the hidden test split is never the agent's.
"""

from __future__ import annotations

import re
from typing import Any

from evaluation.lmeval import TASK_PREFIX, task_name
from shared.events import Verdict
from shared.records import RequestStatusView

FILTER = "none"
#: What lm-eval writes where a metric has no standard error.
NO_STDERR = "N/A"


class NoResults(ValueError):
    """The verdict has no validation results to write."""


def lm_eval_results(verdict: Verdict, view: RequestStatusView | None, version: int | None = None) -> dict[str, Any]:
    """``verdict``'s validation scores as an lm-eval results file; ``view`` (the public status)
    names the base model and benchmark, ``version`` is the benchmark's (benchmark.yaml)."""
    bench = verdict.result.benchmark
    if bench is None or not bench.accuracy_summary:
        raise NoResults(f"{verdict.request_id} has no validation results (status {verdict.status}"
                        + (f", failed at {verdict.failed_stage}" if verdict.failed_stage else "") + ")")
    task = view.task if view is not None else None
    benchmark = task.benchmark if task else "benchmark"
    base_model = task.base_model if task else None
    group = re.sub(r"\W+", "_", f"{TASK_PREFIX}_{benchmark}").lower()  # the subsets' tasks' prefix
    results: dict[str, dict[str, Any]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for subset, metrics in bench.accuracy_summary.items():
        name = task_name(benchmark, subset)
        n = len(bench.item_ids.get(subset, []))
        stats = bench.run_stats.get(subset)
        row: dict[str, Any] = {"name": name, "alias": subset, "sample_len": n}
        for metric, value in metrics.items():
            row[f"{metric},{FILTER}"] = value
            # lm-eval's own "N/A" where there is none: another metric, or one item (no spread to measure).
            stderr = stats.stderr if stats is not None and metric == bench.primary_metric else None
            row[f"{metric}_stderr,{FILTER}"] = NO_STDERR if stderr is None else stderr
        results[name] = row
        configs[name] = {
            "task": name, "task_alias": subset, "num_fewshot": 0, "repeats": bench.num_runs,
            "metadata": {"version": version, "ftbus_benchmark": benchmark, "ftbus_subset": subset,
                         "ftbus_scorer": bench.scorer},
        }
    groups: dict[str, dict[str, Any]] = {}
    if bench.primary_metric and bench.primary_value is not None:
        overall = bench.overall
        groups[group] = {
            "name": group, "alias": benchmark, "sample_len": sum(r["sample_len"] for r in results.values()),
            f"{bench.primary_metric},{FILTER}": bench.primary_value,
            f"{bench.primary_metric}_stderr,{FILTER}": (overall.stderr if overall is not None and overall.stderr
                                                        is not None else NO_STDERR),
        }
    tasks = sorted(results)
    model_name = f"{base_model}+{verdict.request_id}" if base_model else verdict.request_id
    return {
        "results": dict(sorted(results.items())),
        **({"groups": groups} if groups else {}),
        "group_subtasks": {group: tasks} if groups else {},
        "configs": dict(sorted(configs.items())),
        "versions": {name: version for name in tasks},
        "n-shot": {name: 0 for name in tasks},
        "higher_is_better": {name: {metric: bench.higher_is_better for metric in bench.accuracy_summary[
            results[name]["alias"]]} for name in tasks},
        "n-samples": {name: {"original": results[name]["sample_len"], "effective": results[name]["sample_len"]}
                      for name in tasks},
        "config": {
            "model": "ftbus",
            "model_args": f"request_id={verdict.request_id}" + (f",base_model={base_model}" if base_model else ""),
            "batch_size": None, "batch_sizes": [], "device": None, "use_cache": None, "limit": None,
            "bootstrap_iters": 0, "gen_kwargs": None,
            "random_seed": bench.seed, "numpy_seed": bench.seed, "torch_seed": bench.seed, "fewshot_seed": bench.seed,
        },
        "date": verdict.emitted_at.timestamp(),
        "model_source": "ftbus",
        "model_name": model_name,
        "model_name_sanitized": model_name.replace("/", "__"),
    }
