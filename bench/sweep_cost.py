"""The aggregator's sweep against a bucket full of finished requests.

The requests bucket keeps every finished record for ``record_max_age_s`` (30 days). The sweeper
runs every ``sweep_interval_s`` (30 s) and needs only the open records (stuck requests, verdicts a
crash left unpublished, a hidden test split still awaited). This fills a bucket on a real
nats-server with ``--finished`` finished records (each a judged, reported request, about 6 KB)
and ``--open`` records of requests under way, then measures, in CPU milliseconds of the
aggregator's process and of the server:

- the first sweep of an aggregator (it reads every key's latest record once, in one pass);
- a later sweep (it reads only the records written since, then the open records);
- the same bucket read record by record, as the sweep did before records said whether they
  are open (a key listing, then a read and parse of each record).

    .venv/bin/python bench/sweep_cost.py [--finished 5000] [--open 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.standin_pipeline import emit, process_cpu_s, stdout_to_stderr  # noqa: E402


def finished_record(rid: str) -> Any:
    from services.aggregator.verdicts import build_report, verdict_from_judge
    from shared.events import Feedback, JudgeInfo, JudgeResult, RequestContext, TaskSpec, VerdictResult
    from shared.records import RequestRecord

    context = RequestContext(task=TaskSpec(base_model="Qwen/Qwen2.5-0.5B", benchmark="gsm8k"), workspace=[])
    judge = JudgeResult(
        request_id=rid, context=context,
        feedback=Feedback(execution="SUCCESS: data 1,024 samples, training 3 epochs, benchmark 0.41 (base 0.35)",
                          return_checking="the validation score beats the baseline by 0.06 " * 8,
                          code="process_data.py keeps the reasoning chains; train.yaml: LoRA r=16 " * 12,
                          final_decision=True),
        judge=JudgeInfo(kind="rules", rules_decision=True), result=VerdictResult(), expects_test=False,
    )
    record = RequestRecord(request_id=rid, status="completed", stage="judge", task=context.task, judge=judge)
    record.verdict = verdict_from_judge(judge)
    record.report = build_report(record)
    record.verdict_published = record.report_published = True
    return record


async def _cpu_ms(server_pid: int | None, step: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(this process's CPU ms, the server's CPU ms) for ``step``."""
    own, server = time.process_time(), process_cpu_s(server_pid)
    await step()
    return (time.process_time() - own) * 1000, (process_cpu_s(server_pid) - server) * 1000


async def measure(finished: int, open_count: int, root: Path) -> list[dict[str, object]]:
    from ftbus.embedded import EmbeddedServer
    from ftbus.stages import PIPELINE
    from services.aggregator.service import Aggregator
    from shared.bus import Bus
    from shared.events import utcnow
    from shared.kv_scan import list_keys
    from shared.records import RequestRecord
    from shared.settings import Settings

    server = EmbeddedServer(root / "nats", log_file=root / "nats-server.log")
    url = server.start()
    bus = await Bus.connect(Settings(home=root / "home", nats_url=url, log_level="WARNING"), name="bench-sweep")
    try:
        await bus.ensure_topology()
        aggregator = Aggregator(bus, PIPELINE)
        records = await aggregator.store.bucket()
        size = len(finished_record("r0").stored_json())
        batch = 200
        for start in range(0, finished, batch):
            await asyncio.gather(*(records.create(f"done{n:06d}", finished_record(f"done{n:06d}").stored_json())
                                   for n in range(start, min(finished, start + batch))))
        for n in range(open_count):  # requests under way, fresh: nothing for the sweep to do but look
            record = RequestRecord(request_id=f"open{n:04d}", status="running", stage="train", updated_at=utcnow())
            await records.create(record.request_id, record.stored_json())
        print(f"bucket: {finished} finished records ({size} bytes each), {open_count} open", file=sys.stderr)

        async def read_everything() -> None:
            for key in await list_keys(bus.js, bus.subjects.kv_requests):
                await aggregator.store.get(key)

        first = await _cpu_ms(server.pid, aggregator.sweeper.sweep)
        later = await _cpu_ms(server.pid, aggregator.sweeper.sweep)
        before = await _cpu_ms(server.pid, read_everything)
    finally:
        await bus.close()
        server.stop()

    def value(cpu: tuple[float, float]) -> str:
        return f"{cpu[0]:.0f} ms aggregator + {cpu[1]:.0f} ms server"

    what = f"sweep, {finished:,} finished and {open_count} open records"
    return [
        {"measure": f"{what}: an aggregator's first sweep (every key's latest record)", "value": value(first),
         "target": None, "met": None},
        {"measure": f"{what}: each later sweep (CPU every sweep_interval_s)", "value": value(later),
         "target": None, "met": None},
        {"measure": f"{what}: reading every record, as sweeps did before", "value": value(before),
         "target": None, "met": None},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=5000, help="finished records in the bucket")
    parser.add_argument("--open", type=int, default=20, help="records of requests under way")
    parser.add_argument("--json", action="store_true", help="print only the JSON rows on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftbus-sweep-") as tmp, stdout_to_stderr():
        rows = asyncio.run(measure(args.finished, args.open, Path(tmp)))
    emit(rows, args.json, "the aggregator's sweep")


if __name__ == "__main__":
    main()
