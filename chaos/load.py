"""Requests whose outcome is known in advance, submitted by clients that retry through failovers.

Each kind is a workspace for the stand-in tools plus the verdict it must get:

    pass        completed, final_decision true
    data_fail   completed, false, failed_stage data_processing (process_data.py exits 3)
    train_fail  completed, false, failed_stage training (the stand-in trainer raises)
    timeout     completed, false, failed_stage training (a 3 s training timeout, 20 s of training)
    cancel      cancelled (a long training, cancelled a few seconds after submit)
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.events import TaskSpec, Timeouts

TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith")
KINDS = ("pass", "data_fail", "train_fail", "timeout", "cancel")

GOOD_SCRIPT = (
    "import json\n"
    "records = [{'instruction': f'add {i} and {i}', 'input': '', 'output': str(2 * i)} for i in range(40)]\n"
    "json.dump(records, open('data.json', 'w'))\n"
    "print('wrote', len(records), 'records')\n"
)
DATASET_INFO = json.dumps({"processed_data": {"file_name": "data.json", "formatting": "alpaca",
                                              "columns": {"prompt": "instruction", "query": "input",
                                                          "response": "output"}}})


@dataclass(frozen=True)
class Expected:
    status: str
    final_decision: bool
    failed_stage: str | None

    def matches(self, verdict: Any) -> bool:
        stage = verdict.failed_stage if verdict.failed_stage else None
        return (verdict.status == self.status and verdict.final_decision == self.final_decision
                and (self.failed_stage == "*" or stage == self.failed_stage))


EXPECTED = {
    "pass": Expected("completed", True, None),
    "data_fail": Expected("completed", False, "data_processing"),
    "train_fail": Expected("completed", False, "training"),
    "timeout": Expected("completed", False, "training"),
    "cancel": Expected("cancelled", False, "*"),  # failed_stage: where it was when cancelled
    "resume": Expected("completed", True, None),  # only the kill_trainer fault submits it
}


def workspace(root: Path, kind: str, *, step_s: float = 0.05, steps: int = 4, salt: str = "") -> Path:
    """A workspace of ``kind``. ``salt`` changes process_data.py (defeats the data cache)."""
    root.mkdir(parents=True, exist_ok=True)
    train: dict[str, Any] = {"model_name_or_path": "tiny-standin", "stage": "sft", "do_train": True,
                             "finetuning_type": "lora", "dataset": "processed_data", "template": "default",
                             "max_steps": steps, "standin_step_s": step_s}
    script = GOOD_SCRIPT
    if kind == "data_fail":
        script = "print('no data today')\nraise SystemExit(3)\n"
    elif kind == "train_fail":
        train["standin_fail"] = "CUDA out of memory (stand-in)"
    elif kind == "timeout":
        train.update(max_steps=40, standin_step_s=0.5)
    elif kind == "cancel":
        train.update(max_steps=600, standin_step_s=0.5)
    elif kind == "resume":  # its own save_steps: checkpoints every 5 steps, whatever the setting
        train.update(max_steps=60, standin_step_s=0.3, save_steps=5)
    if salt:
        script += f"# {salt}\n"
    (root / "process_data.py").write_text(script)
    (root / "dataset_info.json").write_text(DATASET_INFO)
    (root / "train.yaml").write_text(yaml.safe_dump(train))
    return root


def timeouts_for(kind: str) -> Timeouts:
    return Timeouts(training=3.0) if kind == "timeout" else Timeouts()


@dataclass
class Request:
    rid: str
    kind: str
    submitted_at: float = 0.0
    verdict_at: float | None = None
    verdict: Any = None
    submit_attempts: int = 0
    submit_error: str | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.verdict_at is None else self.verdict_at - self.submitted_at


@dataclass
class Load:
    """Submits ``count`` requests of the given kinds, ``rate_s`` apart, and waits for their verdicts."""

    root: Path
    count: int
    kinds: tuple[str, ...] = KINDS
    weights: tuple[float, ...] | None = None
    rate_s: float = 1.0
    cancel_after_s: float = 4.0
    seed: int = 1
    poll_s: float = 2.0
    requests: list[Request] = field(default_factory=list)
    submitting: bool = False
    _end: float = 0.0

    def plan(self) -> list[Request]:
        rng = random.Random(self.seed)
        kinds = [self.kinds[i % len(self.kinds)] for i in range(self.count)] if self.weights is None else \
            rng.choices(self.kinds, weights=self.weights, k=self.count)
        rng.shuffle(kinds)
        stamp = time.strftime("%H%M%S")
        self.requests = [Request(f"c{stamp}-{i:04d}-{secrets.token_hex(2)}", kind) for i, kind in enumerate(kinds)]
        return self.requests

    async def run(self, client: Any, deadline_s: float) -> None:
        """Submit all (retrying), cancel the cancel kind, wait for every verdict until ``deadline_s``."""
        if not self.requests:
            self.plan()
        loop = asyncio.get_running_loop()
        self._end = loop.time() + deadline_s
        self.submitting = True
        poller = asyncio.create_task(self._poll(client))
        cancels = []
        for i, req in enumerate(list(self.requests)):
            await self._submit(client, req, salt=req.rid if i % 10 == 0 else "")
            if req.kind == "cancel":
                cancels.append(asyncio.create_task(self._cancel_later(client, req)))
            await asyncio.sleep(self.rate_s)
        self.submitting = False
        await asyncio.gather(*cancels, return_exceptions=True)
        await poller

    async def wait_more(self, client: Any, seconds: float) -> None:
        """Poll for the verdicts still missing, for up to ``seconds`` more."""
        self._end = asyncio.get_running_loop().time() + seconds
        self.submitting = False
        await self._poll(client)

    async def extra(self, client: Any, kind: str = "pass") -> str:
        """One more request, outside the plan; returns its id once its submit is acknowledged."""
        req = Request(f"x{time.strftime('%H%M%S')}-{secrets.token_hex(3)}", kind)
        self.requests.append(req)
        await self._submit(client, req, salt="")
        return req.rid

    async def _submit(self, client: Any, req: Request, salt: str) -> None:
        ws = workspace(self.root / req.rid, req.kind, salt=salt)
        req.submitted_at = time.monotonic()
        try:
            req.submit_attempts = await submit_retrying(client, ws, req.rid, timeouts_for(req.kind))
        except Exception as exc:  # reported by the checker
            req.submit_error = f"{type(exc).__name__}: {exc}"

    async def _cancel_later(self, client: Any, req: Request) -> None:
        await asyncio.sleep(self.cancel_after_s)
        for _ in range(60):
            try:
                await client.cancel(req.rid, "chaos: cancelled by the load")
                return
            except Exception:
                await asyncio.sleep(1)

    async def _poll(self, client: Any) -> None:
        """One loop reads the verdicts of all pending requests, every ``poll_s``."""
        loop = asyncio.get_running_loop()
        while loop.time() < self._end:
            pending = [r for r in self.requests if r.verdict is None and r.submitted_at]
            if not pending and not self.submitting:
                return
            for req in pending:
                try:
                    verdict = await asyncio.wait_for(client.get(req.rid), timeout=5)
                except Exception:
                    verdict = None
                if verdict is not None:
                    req.verdict, req.verdict_at = verdict, time.monotonic()
            await asyncio.sleep(self.poll_s)


async def submit_retrying(client: Any, ws: Path, rid: str, timeouts: Timeouts, attempts: int = 20) -> int:
    """``client.submit`` with a fixed request id, retried through failovers; returns the attempts."""
    submit = getattr(client, "submit_retrying", None)
    if submit is not None:
        return await submit(ws, TASK, timeouts, request_id=rid, attempts=attempts)
    for attempt in range(1, attempts + 1):
        try:
            await client.submit(ws, TASK, timeouts, request_id=rid)
            return attempt
        except Exception:
            if attempt == attempts:
                raise
            await asyncio.sleep(min(0.5 * attempt, 3.0))
    return attempts
