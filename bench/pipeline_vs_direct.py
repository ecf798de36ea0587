"""`make bench`: the pipeline's wall time for one example beside the same work run directly.

Direct = what the reference evaluator does, one after another in one workspace:
`python process_data.py`, `llamafactory-cli train train.yaml`, then lm-eval on the validation
split and on the test split. Pipeline = `Client.submit` -> verdict through a real
nats-server and all five services (report included, so both splits are done). The baseline
cache is warmed first so that both sides do the same work; the data cache is defeated by giving
every run its own copy of process_data.py.

    python bench/pipeline_vs_direct.py [--example lora|full] [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.real_tools import real_tool_settings  # noqa: E402
from evaluation.lmeval import prepare_lm_eval_run  # noqa: E402
from evaluation.models import select_model  # noqa: E402
from evaluation.registry import load_benchmark  # noqa: E402
from evaluation.splits import make_split  # noqa: E402
from ftbus.client import Client  # noqa: E402
from ftbus.embedded import EmbeddedServer  # noqa: E402
from services.data.env import data_processing_env  # noqa: E402
from services.trainer.config import prepare_train_yaml  # noqa: E402
from services.trainer.service import OFFLINE_ENV  # noqa: E402
from shared.events import TaskSpec  # noqa: E402
from shared.settings import Settings  # noqa: E402

console = Console(stderr=True)
TASK = TaskSpec(base_model="tiny-llama", benchmark="tiny-sentiment", involving_datasets=["tiny-reviews"])


def fresh_copy(example: Path, dest: Path) -> Path:
    shutil.copytree(example, dest)
    with (dest / "process_data.py").open("a") as fh:
        fh.write(f"\n# bench run {secrets.token_hex(4)}: defeats the data cache\n")
    return dest


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        output = proc.stdout[-3000:] + proc.stderr[-3000:]
        raise RuntimeError(f"{' '.join(argv[:3])} failed ({proc.returncode}):\n{output}")
    return time.perf_counter() - start


def direct(settings: Settings, example: Path, scratch: Path) -> dict[str, float]:
    toolchain = settings.toolchain_path()
    assert toolchain is not None
    ws = fresh_copy(example, scratch / f"direct-{secrets.token_hex(3)}")
    env = {**os.environ, "PATH": f"{toolchain}:{os.environ['PATH']}"}
    times: dict[str, float] = {}
    start = time.perf_counter()
    times["data"] = run(["python", "process_data.py"], ws, {**env, **data_processing_env(settings, settings.assets)})
    prepared = prepare_train_yaml((ws / "train.yaml").read_text(), assets_dir=settings.assets, workspace_dir=ws)
    (ws / "train.yaml").write_text(prepared.yaml_text)
    times["train"] = run(["llamafactory-cli", "train", "train.yaml"], ws, {**env, **OFFLINE_ENV})
    spec = load_benchmark(settings.assets, TASK.benchmark)
    model = select_model(prepared.model_path, ws / "output")
    bench = 0.0
    for split in ("validation", "test"):
        manifest = make_split(spec, split, spec.max_items(settings.bench_max_items))
        lm = prepare_lm_eval_run(spec, manifest, ws / f"bench-{split}", lm_eval="lm_eval", model=model, device="cpu")
        bench += run(lm.argv, ws, {**env, **lm.env})
    times["bench"] = bench
    times["total"] = time.perf_counter() - start
    return times


async def pipeline(client: Client, example: Path, scratch: Path) -> dict[str, float]:
    ws = fresh_copy(example, scratch / f"pipe-{secrets.token_hex(3)}")
    start = time.perf_counter()
    rid = await client.submit(ws, TASK)
    verdict = await client.wait(rid)
    verdict_s = time.perf_counter() - start
    await client.wait_report(rid)
    total = time.perf_counter() - start
    if not verdict.final_decision:
        raise RuntimeError(f"pipeline verdict was negative: {verdict.execution}")
    return {"verdict": verdict_s, "total": total}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", choices=["lora", "full"], default="lora")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each side (default 2)")
    parser.add_argument("--json", action="store_true", help="print rows for bench/table.py on stdout, no table")
    args = parser.parse_args()
    example = REPO / "examples" / args.example

    with tempfile.TemporaryDirectory(prefix="ftbus-bench-") as tmp:
        scratch = Path(tmp)
        settings = real_tool_settings(scratch, console)
        server = EmbeddedServer(scratch / "nats")
        url = server.start()
        settings = settings.model_copy(update={"nats_url": url})
        from ftbus.cli import run_services
        from shared.bus import Bus
        from shared.events import Stage

        bus = await Bus.connect(settings)
        await bus.ensure_topology()
        stop = asyncio.Event()
        services = asyncio.create_task(run_services(bus, list(Stage), None, stop))  # each stage its own
        client = Client.on_bus(bus)
        try:
            console.print("warm-up run (fills the baseline cache; not timed)")
            await pipeline(client, example, scratch)
            pipe_runs, direct_runs = [], []
            for i in range(args.repeat):
                console.print(f"timed run {i + 1}/{args.repeat}: pipeline")
                pipe_runs.append(await pipeline(client, example, scratch))
                console.print(f"timed run {i + 1}/{args.repeat}: direct")
                direct_runs.append(await asyncio.to_thread(direct, settings, example, scratch))
        finally:
            stop.set()
            await asyncio.gather(services, return_exceptions=True)
            await bus.close()
            server.stop()

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    table = Table(title=f"ftbus pipeline vs direct commands, examples/{args.example}, median of {args.repeat}")
    for col in ("what", "seconds", "min", "max"):
        table.add_column(col, justify="right" if col != "what" else "left")
    rows = [
        ("direct: process_data.py", direct_runs, "data"),
        ("direct: llamafactory-cli train", direct_runs, "train"),
        ("direct: lm-eval validation + test", direct_runs, "bench"),
        ("direct: total (sequential)", direct_runs, "total"),
        ("pipeline: submit -> verdict", pipe_runs, "verdict"),
        ("pipeline: submit -> report (both splits)", pipe_runs, "total"),
    ]
    for label, runs, key in rows:
        values = [r[key] for r in runs]
        table.add_row(label, f"{med(runs, key):.1f}", f"{min(values):.1f}", f"{max(values):.1f}")
    ratio = med(pipe_runs, "total") / med(direct_runs, "total")
    table.add_row("ratio pipeline/direct (report vs total)", f"{ratio:.2f}", "", "")
    if args.json:
        tail = f"examples/{args.example}, median of {args.repeat}"
        print(json.dumps([
            {"measure": f"tiny end to end, direct commands ({tail})", "value": f"{med(direct_runs, 'total'):.1f} s",
             "target": None, "met": None},
            {"measure": f"tiny end to end, pipeline submit -> report ({tail})",
             "value": f"{med(pipe_runs, 'total'):.1f} s", "target": None, "met": None},
            {"measure": "tiny end to end, pipeline / direct", "value": f"{ratio:.2f}x", "target": None, "met": None},
        ]))
    else:
        Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
