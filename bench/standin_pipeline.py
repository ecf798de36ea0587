"""The stand: what bench/overhead.py, bench/precheck_burst.py and bench/pipelining.py measure on.

A real embedded nats-server, and every stage as its own ``ftbus worker``-like process (the way a
deployment runs them: one process per stage, its own connection and event loop), running the
real services with the stand-in toolchain (tests/standin/) and ``sandbox: local``. The only
addition is a timer around each stage's handler, so that a bench can tell a stage's own work
(the handler: pre-check, tools, artifacts, judging) from everything around it (consumers, acks,
KV records, progress, the aggregator, the verdict). The aggregator has no handler of its own:
all of its time is orchestration.

    python bench/standin_pipeline.py --worker STAGE|all --timings FILE [--concurrency N]

is that worker process (started by :class:`Stand`, not by hand). Diagnostics: ``BENCH_LOG_LEVEL``
sets the workers' log level (default INFO, as deployed); ``BENCH_PROFILE_DIR`` makes each worker
write its cProfile stats there (``<stage>.prof``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STAGES = ("data", "train", "bench", "judge", "aggregate")
#: The longest a worker's timing line waits in its buffer (the readers wait 0.3 s or more).
FLUSH_S = 0.1


def _stage_default_concurrency() -> bool:
    """Whether this tree's stages declare their own concurrency (then None means 'the stage's own')."""
    from shared.stagespec import StageSpec

    return "concurrency" in {f.name for f in dataclasses.fields(StageSpec)}


async def _worker(stage_name: str, timings: Path, concurrency: int | None) -> None:
    """One stage's worker process; ``all``: every stage in this one process, as ``ftbus up`` runs them."""
    from ftbus import cli
    from shared.bus import Bus
    from shared.events import Stage
    from shared.logs import setup_logging
    from shared.settings import Settings

    settings = Settings()
    setup_logging(settings.log_format, settings.log_level)
    stages = list(Stage) if stage_name == "all" else [Stage(stage_name)]
    # The timing lines are the bench's own cost, not ftbus's: buffered, and flushed within
    # FLUSH_S of the first unflushed one (readers wait longer than that), rather than a write
    # syscall and a json.dumps per handler (2-4% of a light stage's CPU in a burst).
    out = timings.open("a")
    flush_due: list[asyncio.TimerHandle] = []

    def flush() -> None:
        flush_due.clear()
        out.flush()

    # The pipeline run_services runs: ftbus.stages' (cli's own module attribute in older trees).
    base = getattr(cli, "PIPELINE", None)
    if base is None:
        from ftbus.stages import PIPELINE as base
    specs = []
    for spec in base:
        if spec.stage in stages and spec.handler is not None:
            inner, name = spec.handler, spec.stage

            async def timed(event: Any, ctx: Any, inner: Any = inner, name: str = name) -> Any:
                t0 = time.time()
                try:
                    return await inner(event, ctx)
                finally:
                    t1 = time.time()
                    # request ids are [A-Za-z0-9_-] (shared/events.py): no escaping needed
                    out.write(f'{{"rid": "{event.request_id}", "stage": "{name}", "t0": {t0!r}, "t1": {t1!r}}}\n')
                    if not flush_due:
                        flush_due.append(asyncio.get_running_loop().call_later(FLUSH_S, flush))

            spec = dataclasses.replace(spec, handler=timed)
        specs.append(spec)
    if "pipeline" in inspect.signature(cli.run_services).parameters:
        run = functools.partial(cli.run_services, pipeline=tuple(specs))
    else:
        cli.PIPELINE = tuple(specs)  # older trees: run_services reads the module's pipeline
        run = cli.run_services
    if concurrency is None and not _stage_default_concurrency():
        concurrency = 1  # the tree before stages declared their own: its default
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bus = await Bus.connect(settings, name=f"ftbus-{stage_name}")
    try:
        await bus.ensure_topology()
        await run(bus, stages, concurrency, stop)
    finally:
        await bus.close()
        out.close()


async def _connect(settings: Any) -> Any:
    """The tree's client, connected: ``Client`` (one class since issue 35), ``FtbusClient`` before."""
    try:
        from ftbus.bus_client import FtbusClient  # trees before issue 35
    except ImportError:
        from ftbus.client import Client

        return await Client(settings=settings).connect()
    return await FtbusClient.connect(settings)


class Stand:
    """nats-server + one worker process per stage (``one_process``: one for all stages, as
    ``ftbus up``) + a client connection, under ``root``."""

    def __init__(self, root: Path, *, concurrency: dict[str, int] | None = None, log_level: str = "INFO",
                 one_process: bool = False, settings: dict[str, object] | None = None) -> None:
        self.root = root
        self.extra_settings = settings or {}
        self.one_process = one_process
        self.concurrency = concurrency or {}
        self.log_level = log_level
        self.server: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client: Any = None
        self.settings: Any = None
        self.timings = root / "timings.jsonl"

    async def __aenter__(self) -> Stand:
        from chaos.services import service_env, standin_assets, standin_toolchain
        from ftbus.embedded import EmbeddedServer
        from shared.settings import Settings

        self.root.mkdir(parents=True, exist_ok=True)
        self.server = EmbeddedServer(self.root / "nats", log_file=self.root / "nats-server.log")
        url = self.server.start()
        values: dict[str, object] = {
            "home": str(self.root / "home"),
            "assets_dir": str(standin_assets(self.root / "assets")),
            "toolchain_bin": str(standin_toolchain(self.root / "bin")),
            "nats_url": url,
            "sandbox": "local",
            "log_format": "json",
            "log_level": os.environ.get("BENCH_LOG_LEVEL", self.log_level),
            **self.extra_settings,
        }
        if "bench_engine" in Settings.model_fields:
            values["bench_engine"] = "cold"  # the stand-in lm_eval is a command, one process per split
        self.settings = Settings(**values)  # type: ignore[arg-type]
        env = service_env(values)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.client = await _connect(self.settings)  # creates the topology first
        self._start_workers(env)
        await self._wait_for_consumers()
        return self

    @property
    def worker_names(self) -> tuple[str, ...]:
        """The ``--worker`` of each worker process, in start order."""
        return ("all",) if self.one_process else STAGES

    def _start_workers(self, env: dict[str, str]) -> None:
        for stage in self.worker_names:
            argv = [sys.executable, str(Path(__file__).resolve()), "--worker", stage, "--timings", str(self.timings)]
            if stage in self.concurrency:
                argv += ["--concurrency", str(self.concurrency[stage])]
            with (self.root / f"{stage}.log").open("ab") as log:
                self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                                   start_new_session=True))

    async def _wait_for_consumers(self, timeout_s: float = 60.0) -> None:
        s = self.client.bus.subjects
        from shared.events import Stage

        wanted = [s.durable(Stage(stage)) for stage in STAGES]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = 0
            for durable in wanted:
                with contextlib.suppress(Exception):
                    info = await self.client.bus.js.consumer_info(s.stream_events, durable)
                    ready += 1 if info.num_waiting else 0
            if ready == len(wanted):
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a worker exited at start: see {self.root}/*.log")
            await asyncio.sleep(0.2)
        raise RuntimeError(f"workers not ready in {timeout_s} s: see {self.root}/*.log")

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.server is not None:
            self.server.stop()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each worker process has used so far, and the server's."""
        pids = dict(zip(self.worker_names, (p.pid for p in self.procs), strict=True))
        if self.server is not None and self.server.pid:
            pids["nats-server"] = self.server.pid
        out = {}
        for name, pid in pids.items():
            with contextlib.suppress(OSError):
                out[name] = process_cpu_s(pid)
        return out

    # ------------------------------------------------------------------ requests

    async def upload(self, workspace: Path, rid: str, campaign: str | None = None) -> Any:
        """The request event for ``workspace``, its files uploaded (what `submit` does before publishing)."""
        try:
            from ftbus.submitting import exclude_outputs
        except ImportError:  # trees before issue 35
            from ftbus.bus_client import _exclude_outputs as exclude_outputs  # type: ignore[no-redef]
        from shared.artifacts import upload_dir
        from shared.events import EvalRequested, RequestContext, TaskSpec

        settings = self.settings
        files = await upload_dir(await self.client.bus.artifacts(), f"{rid}/workspace", workspace,
                                 max_bytes=settings.max_workspace_bytes, max_files=settings.max_workspace_files,
                                 exclude=exclude_outputs)
        task = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith",
                        **({"campaign": campaign} if campaign else {}))
        return EvalRequested(request_id=rid, context=RequestContext(task=task, workspace=files))

    async def publish(self, event: Any) -> None:
        from shared.subjects import msg_id

        bus = self.client.bus
        await bus.publish(bus.subjects.eval_requested, event, msg_id(event.request_id, "submit", "requested"))

    async def verdicts(self) -> tuple[Any, asyncio.Queue[tuple[str, float, bytes]]]:
        """A core subscription to every verdict: (request id, arrival time, payload) in a queue."""
        bus = self.client.bus
        queue: asyncio.Queue[tuple[str, float, bytes]] = asyncio.Queue()

        async def on_msg(msg: Any) -> None:
            queue.put_nowait((msg.subject.rsplit(".", 1)[-1], time.time(), msg.data))

        sub = await bus.nc.subscribe(bus.subjects.verdict("*"), cb=on_msg)
        await bus.nc.flush()
        return sub, queue

    def stage_times(self) -> dict[str, dict[str, float]]:
        """rid -> stage -> handler seconds (summed over attempts)."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        if self.timings.is_file():
            for line in self.timings.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    row = json.loads(line)
                    out[row["rid"]][row["stage"]] += row["t1"] - row["t0"]
        return out

    def spans(self) -> dict[str, dict[str, tuple[float, float]]]:
        """rid -> stage -> (start, end) of its handler (the last attempt)."""
        out: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
        if self.timings.is_file():
            for line in self.timings.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    row = json.loads(line)
                    out[row["rid"]][row["stage"]] = (row["t0"], row["t1"])
        return out


def workspace(root: Path, *, kind: str = "pass", data_sleep_s: float = 0.0, steps: int = 2,
              step_s: float = 0.01, salt: str = "") -> Path:
    """A stand-in workspace: ``pass`` runs every stage; ``precheck`` has no train.yaml."""
    from chaos.load import workspace as chaos_workspace

    ws = chaos_workspace(root, "pass", step_s=step_s, steps=steps, salt=salt)
    if data_sleep_s:
        script = ws / "process_data.py"
        script.write_text(f"import time\ntime.sleep({data_sleep_s})\n" + script.read_text())
    if kind == "precheck":
        (ws / "train.yaml").unlink()
    return ws


def process_cpu_s(pid: int | None) -> float:
    """CPU time (user + system) process ``pid`` has used so far; 0 without a pid."""
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything written to stdout meanwhile (child processes included) goes to stderr: with
    ``--json``, stdout carries only the rows."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def simulation_main(doc: str, count: str, default: int, rows: Callable[[int, int], list[dict[str, Any]]],
                    title: str) -> None:
    """A seeded simulation's command line: ``--<count> N`` simulated runs, ``--seed``, ``--json``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(f"--{count}", type=int, default=default, help=f"simulated {count} per measure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()
    emit(rows(getattr(args, count), args.seed), args.json, title)


def emit(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    """Print the rows: a rich table, or (``--json``) only the JSON list on stdout."""
    if as_json:
        print(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("measure", "value", "target", "met"):
        table.add_column(col)
    for row in rows:
        met = row["met"]
        table.add_row(row["measure"], row["value"], row["target"] or "",
                      "" if met is None else ("[green]yes[/]" if met else "[red]no[/]"))
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=(*STAGES, "all"), required=True)
    parser.add_argument("--timings", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=None)
    args = parser.parse_args()
    from shared.loop import run
    from shared.settings import Settings

    # The loop `ftbus worker` runs on; BENCH_EVENT_LOOP=asyncio|uvloop sets it for an A/B (the
    # stand gives its workers only the FTBUS_* settings it chose).
    event_loop = os.environ.get("BENCH_EVENT_LOOP") or Settings().event_loop
    profile_dir = os.environ.get("BENCH_PROFILE_DIR")  # a folder: each worker's cProfile stats go there
    if not profile_dir:
        run(_worker(args.worker, args.timings, args.concurrency), event_loop)
        return
    import cProfile

    with cProfile.Profile() as prof:
        run(_worker(args.worker, args.timings, args.concurrency), event_loop)
    prof.dump_stats(str(Path(profile_dir) / f"{args.worker}.prof"))


if __name__ == "__main__":
    main()
