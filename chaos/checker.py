"""The checker: every request sorted into ok, lost, duplicated or wrong, one table, an exit status.

    lost        no verdict in the verdict stream (after a submit that was acknowledged)
    duplicated  the verdict stream holds more than one verdict for it, or two verdicts that
                differ were published for it (identical republications are counted apart: the
                stream's one-message-per-subject rule absorbs them)
    wrong       a verdict that is not the one its kind must get
    errors      an error verdict (counted by stage and reason): no request may get one, not even
                after its stage used up max_deliver; partitions and kills use up no attempt of a
                request whose handling went on (shared/attempts.py), and the run kills no worker
                more than max_deliver times on one request
    unsubmitted every submit attempt failed (the client was told: not a lost request, but reported)
    leftovers   processes of the run (candidates, workers, undertakers, servers) alive after it, and
                its network namespaces or links still there
    not resumed a request whose trainer the kill_trainer fault killed after a checkpoint of step N was
                uploaded, and whose verdict does not say "resumed from step M" with M >= N
    stale views a request with a verdict whose public view (`ftbus status`) does not show it: two
                aggregators write one request's views, and an older one must never land last
"""

from __future__ import annotations

import re
import statistics
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.load import EXPECTED, Request


@dataclass
class Result:
    requests: int = 0
    ok: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    republished: int = 0
    wrong: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    unsubmitted: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)  # workers that exited on their own
    stale_views: list[str] = field(default_factory=list)
    not_resumed: list[str] = field(default_factory=list)
    resumed: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    max_submit_attempts: int = 0
    network: str = ""  # where the nodes ran: their namespaces, or loopback and why

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.duplicated or self.wrong or self.errors or self.unsubmitted or self.leftovers
                    or self.crashed or self.stale_views or self.not_resumed)

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1]

    def table(self) -> str:
        p50, p99 = self.percentile(50), self.percentile(99)
        rows = [
            ("requests", f"{self.requests} (" + ", ".join(f"{k} {v}" for k, v in sorted(self.by_kind.items())) + ")"),
            ("faults", ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"),
            *([("network", self.network)] if self.network else []),
            ("ok", str(self.ok)),
            ("lost", f"{len(self.lost)} {self.lost[:5] if self.lost else ''}"),
            ("duplicated", f"{len(self.duplicated)} {self.duplicated[:5] if self.duplicated else ''}"),
            ("identical republications", f"{self.republished} (absorbed by the verdict stream)"),
            ("wrong", f"{len(self.wrong)} {self.wrong[:5] if self.wrong else ''}"),
            ("error verdicts", ", ".join(f"{k}: {v}" for k, v in self.errors.items()) or "0"),
            ("unsubmitted", f"{len(self.unsubmitted)} {self.unsubmitted[:5] if self.unsubmitted else ''}"),
            ("leftovers", f"{len(self.leftovers)} {self.leftovers[:5] if self.leftovers else ''}"),
            ("workers that crashed", f"{len(self.crashed)} {self.crashed[:5] if self.crashed else ''}"),
            ("stale public views", f"{len(self.stale_views)} {self.stale_views[:5] if self.stale_views else ''}"),
            ("killed trainings resumed", f"{self.resumed}" + (f", NOT resumed: {self.not_resumed[:5]}"
                                                             if self.not_resumed else "")),
            ("latency p50 / p99", f"{p50:.1f} s / {p99:.1f} s" if p50 is not None and p99 is not None else "-"),
            ("most submit attempts", str(self.max_submit_attempts)),
            ("result", "FAIL" if self.failed else "PASS"),
        ]
        width = max(len(k) for k, _ in rows)
        cols = min(max(len(v) for _, v in rows), 120)
        line = "+" + "-" * (width + 2) + "+" + "-" * (cols + 2) + "+"
        out = [line, f"| {'chaos check':<{width}} | {'':<{cols}} |", line]
        for k, v in rows:  # a long value goes on over more lines
            for i, part in enumerate(textwrap.wrap(v, cols) or [""]):
                out.append(f"| {k if i == 0 else '':<{width}} | {part:<{cols}} |")
        out.append(line)
        return "\n".join(out)


def check(requests: list[Request], stream_counts: dict[str, int], published: dict[str, set[tuple[str, bool]]],
          published_counts: Counter[str], leftovers: list[tuple[int, str]], faults: Counter[str],
          verdict_subject: Any) -> Result:
    result = Result(requests=len(requests), faults=faults)
    result.leftovers = [f"{pid} {cmd}" for pid, cmd in leftovers]
    for req in requests:
        result.by_kind[req.kind] += 1
        result.max_submit_attempts = max(result.max_submit_attempts, req.submit_attempts)
        in_stream = stream_counts.get(verdict_subject(req.rid), 0)
        if req.verdict is None and in_stream == 0:
            (result.unsubmitted if req.submit_error else result.lost).append(req.rid)
            continue
        if in_stream > 1 or len(published.get(req.rid, set())) > 1:
            result.duplicated.append(req.rid)
            continue
        result.republished += max(0, published_counts.get(req.rid, 0) - 1)
        verdict = req.verdict
        if verdict is None:  # in the stream, but the client's deadline passed first
            result.lost.append(req.rid)
            continue
        if req.latency_s is not None:
            result.latencies.append(req.latency_s)
        if verdict.status == "error":
            reason = "max_deliver" if "max_deliver" in verdict.execution else verdict.execution[:60]
            result.errors[f"{verdict.failed_stage or '?'} {reason}"] += 1
            continue
        if EXPECTED[req.kind].matches(verdict):
            result.ok += 1
        else:
            stage = verdict.failed_stage if verdict.failed_stage else None
            result.wrong.append(f"{req.rid} ({req.kind}: {verdict.status}/{verdict.final_decision}/{stage})")
    return result


def check_resumes(result: Result, requests: list[Request], resumes: dict[str, int]) -> None:
    """Each request whose trainer was killed after its checkpoint of step N resumed from N or later."""
    verdicts = {req.rid: req.verdict for req in requests}
    for rid, step in resumes.items():
        verdict = verdicts.get(rid)
        found = re.search(r"resumed from step (\d+)", verdict.execution) if verdict is not None else None
        if found is not None and int(found[1]) >= step:
            result.resumed += 1
        else:
            said = verdict.execution[-120:] if verdict is not None else "no verdict"
            result.not_resumed.append(f"{rid} (checkpoint of step {step}; the verdict: {said})")
