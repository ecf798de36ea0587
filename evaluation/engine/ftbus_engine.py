"""The warm benchmark engine: lm-eval imported once, one model load per job, splits one at a time.

Runs inside the fine-tuning toolchain (the sandbox image's Python), started by a bench worker:

    python ftbus_engine.py <exchange folder>

It imports nothing from ftbus: only the standard library, the toolchain's packages (lm-eval,
torch) and ``vllm_support`` beside it. It talks to its worker through files in the exchange
folder, never the network; every file is written to a hidden temporary name and renamed, so a
reader never sees half of one:

- ``engine.json`` (engine): written once the harness is imported: ``{"pid", "imported_s"}``.
- ``job-<n>.json`` (worker): one model and the labels of its splits, in order:
  ``{"model": {"pretrained", "peft"}, "device", "gpus", "dtype", "batch_size", "seed",
  "apply_chat_template", "vllm": {"gpu_memory_utilization", "max_model_len", "enforce_eager"},
  "splits": [label, ...]}`` (``vllm`` matters on the GPU path only).
- ``split-<n>-<i>.json`` (worker): the i-th split of job n is now in the exchange folder:
  ``{"label", "run_dir", "tasks", "include_path", "output_path", "log_path", "journal", "subset_of"}``
  (``journal``, optional: the split's journal file, journal.py, which the engine reads and appends
  to; ``subset_of``: task name -> subset, how it counts items). The worker puts
  each split's run folder there only for its own run and removes it before the next one, so the
  engine never sees two splits' data at once.
- ``result-<n>-<i>.json`` (engine): ``{"ok", "error", "loads", "listing", "seconds", "pid", "resume"}``;
  ``resume`` (with a journal) what the journal answered: ``{"items", "of", "requests", "generated"}``;
  ``listing`` is what the exchange folder held while the split ran (the worker's proof, in tests,
  that one split was visible at a time); ``loads`` how many times this job loaded its model.
- ``end-<n>.json`` (worker): job n is over early (a split could not be prepared): drop the model.

While a split runs, the engine's stdout, stderr and logging go to that split's ``log_path``
only (file descriptors 1 and 2 are redirected), so a split's log holds nothing of another split.
The model is loaded during the job's first split, in that split's log. The candidate's weights
are data: ``trust_remote_code`` is never set, and the worker has removed pickle files.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

POLL_S = 0.05
HERE = Path(__file__).resolve().parent


def write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    return data


class Output:
    """Points file descriptors 1 and 2 at a split's log, and back at the engine's own output."""

    def __init__(self) -> None:
        self._saved = (os.dup(1), os.dup(2))

    @contextlib.contextmanager
    def into(self, log_path: str) -> Any:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self._saved[0], 1)
            os.dup2(self._saved[1], 2)


def _cache_env_info() -> None:
    """lm-eval records the environment in every results file (torch's collect_env: pip, lscpu and
    friends, seconds of subprocesses). It does not change while the engine lives: gather it once."""
    import lm_eval.evaluator

    original = lm_eval.evaluator.add_env_info
    cached: dict[str, Any] = {}

    def add_env_info(storage: dict[str, Any]) -> None:
        if not cached:
            original(cached)
        storage.update(cached)

    lm_eval.evaluator.add_env_info = add_env_info


class Engine:
    def __init__(self, exchange: Path) -> None:
        self.exchange = exchange
        self.output = Output()
        started = time.monotonic()
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        import datasets  # noqa: F401  (imported once, here: that is the point)
        import lm_eval
        import lm_eval.api.registry
        from lm_eval.loggers import EvaluationTracker
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import handle_non_serializable, make_table, setup_logging

        sys.path.insert(0, str(HERE))
        from resuming import ResumingLM
        from vllm_support import lm_eval_model, release

        setup_logging()
        _cache_env_info()
        self.lm_eval = lm_eval
        self.registry = lm_eval.api.registry
        self.tracker_cls = EvaluationTracker
        self.task_manager_cls = TaskManager
        self.non_serializable = handle_non_serializable
        self.make_table = make_table
        self.lm_eval_model = lm_eval_model
        self.release = release
        self.resuming = ResumingLM
        write_json(exchange / "engine.json", {"pid": os.getpid(), "imported_s": round(time.monotonic() - started, 3)})
        print(f"[engine] harness imported in {time.monotonic() - started:.1f} s", flush=True)

    # ------------------------------------------------------------------ jobs

    def serve(self) -> None:
        while True:
            jobs = sorted(self.exchange.glob("job-*.json"), key=lambda p: int(p.stem.split("-")[1]))
            if not jobs:
                time.sleep(POLL_S)
                continue
            n = int(jobs[0].stem.split("-")[1])
            job = read_json(jobs[0])
            try:
                self.run_job(n, job)
            finally:
                gc.collect()

    def _next(self, n: int, i: int) -> dict[str, Any] | None:
        split = self.exchange / f"split-{n}-{i}.json"
        end = self.exchange / f"end-{n}.json"
        while True:
            if split.exists():
                return read_json(split)
            if end.exists():
                end.unlink()
                return None
            time.sleep(POLL_S)

    def run_job(self, n: int, job: dict[str, Any]) -> None:
        lm: Any = None
        load_error: str | None = None
        loads = 0
        model_args: dict[str, Any] = {}
        for i in range(len(job["splits"])):
            request = self._next(n, i)
            if request is None:
                break
            started = time.monotonic()
            listing = sorted(os.listdir(self.exchange))
            error: str | None = None
            resume: dict[str, int] | None = None
            with self.output.into(request["log_path"]):
                try:
                    if lm is None and load_error is None:
                        lm, model_args = self._load(n, job)
                        loads += 1
                    if lm is None:
                        raise RuntimeError(f"the model could not be loaded: {load_error}")
                    resume = self._evaluate(lm, model_args, job, request)
                except Exception as exc:  # the harness failed: a result to report, not a crash
                    traceback.print_exc()
                    error = f"{type(exc).__name__}: {exc}"
                    if lm is None and load_error is None:
                        load_error = error
            write_json(self.exchange / f"result-{n}-{i}.json", {
                "ok": error is None, "error": error, "loads": loads, "listing": listing,
                "seconds": round(time.monotonic() - started, 3), "pid": os.getpid(), "resume": resume,
            })
        if lm is not None:
            # vLLM holds GPU memory and tensor-parallel state until shut down: free them before
            # the next job loads its model (for hf this drops the model and empties the cache).
            self.release(lm)
        del lm

    def _load(self, n: int, job: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        model = job["model"]
        scratch = self.exchange / f"scratch-{n}"
        name, args = self.lm_eval_model(
            model["pretrained"], model.get("peft"), device=job["device"], gpus=int(job.get("gpus") or 0),
            dtype=job.get("dtype"), scratch=str(scratch), seed=int(job.get("seed") or 0),
            **{k: v for k, v in (job.get("vllm") or {}).items()
               if k in ("gpu_memory_utilization", "max_model_len", "enforce_eager")},
        )
        args.pop("trust_remote_code", None)  # weights are data
        print(f"[engine] loading {name} model: {args}", flush=True)
        started = time.monotonic()
        # As simple_evaluate does for the CLI, minus what the model's own arguments already say.
        extra = {"batch_size": job.get("batch_size", 1), "max_batch_size": None, "device": job["device"]}
        lm = self.registry.get_model(name).create_from_arg_obj(
            args, {k: v for k, v in extra.items() if k not in args}
        )
        print(f"[engine] model loaded in {time.monotonic() - started:.1f} s", flush=True)
        return lm, args

    def _evaluate(self, lm: Any, model_args: dict[str, Any], job: dict[str, Any], request: dict[str, Any],
                  ) -> dict[str, int] | None:
        """One split, as ``lm_eval run --log_samples --seed <seed>`` does it, saved the same way; with
        a journal, through it (resuming.py): returns what the journal answered."""
        if not request.get("journal"):
            self._simple_evaluate(lm, model_args, job, request)
            return None
        from journal import Journal

        resuming = self.resuming(lm, Journal(Path(request["journal"]), request.get("subset_of")))
        try:
            self._simple_evaluate(resuming, model_args, job, request)
        finally:
            resuming.release()
        summary = resuming.journal.summary()
        print(f"[engine] journal: {summary['items']} of {summary['of']} items recorded by an earlier attempt; "
              f"{summary['generated']} of {summary['requests']} requests generated", flush=True)
        return summary

    def _simple_evaluate(self, lm: Any, model_args: dict[str, Any], job: dict[str, Any], request: dict[str, Any],
                         ) -> None:
        import datasets

        run_dir = Path(request["run_dir"])
        cache = run_dir / "hf_datasets_cache"  # the split's converted data stays in its own folder
        os.environ["HF_DATASETS_CACHE"] = str(cache)
        datasets.config.HF_DATASETS_CACHE = cache
        seed = int(job.get("seed", 0))
        tracker = self.tracker_cls(output_path=request["output_path"])
        task_manager = self.task_manager_cls(
            include_path=request["include_path"], include_defaults=False, metadata=dict(model_args)
        )
        results = self.lm_eval.simple_evaluate(
            model=lm,
            model_args=model_args,
            tasks=list(request["tasks"]),
            batch_size=job.get("batch_size", 1),
            device=job["device"],
            log_samples=True,
            evaluation_tracker=tracker,
            apply_chat_template=bool(job.get("apply_chat_template")),
            task_manager=task_manager,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            metadata=dict(model_args),
        )
        if results is None:
            raise RuntimeError("lm-eval returned no results")
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
        print(f"{job.get('model_label', 'hf')} ({model_args}), batch_size: {job.get('batch_size', 1)}")
        print(self.make_table(results))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: ftbus_engine.py <exchange folder>")
    exchange = Path(sys.argv[1]).resolve()
    if not exchange.is_dir():
        sys.exit(f"the exchange folder {exchange} does not exist")
    Engine(exchange).serve()


if __name__ == "__main__":
    main()
