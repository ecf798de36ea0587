"""Two requests compared on their shared validation items: ``ftbus compare ID1 ID2``, ``Client.compare``.

The comparison is paired (``shared.paired.compare_scores``, the call the benchmark stage makes against
the base model): each validation item's primary metric, averaged over its runs, of one request against
the other's on the very same item. The decision function (``shared.decision.decide``, the benchmark
stage's) gives its validation answer beside it: worse, not distinguishable, or screened in for the
hidden pool. It reads the two verdicts only, the validation split an agent may see; the hidden test
split and the pool are never read here.

Two requests are refused, saying why, when one has no verdict or no per-item outcomes yet, when they
ran different benchmarks or a different number of runs per item, or when their item sets differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from shared.decision import SCREEN_LEVEL, OwnerState, decide, paired_outcomes
from shared.paired import BOOTSTRAP_SEED, DEFAULT_LEVEL, compare_scores
from shared.statistics import PairedComparison

if TYPE_CHECKING:
    from ftbus.client import Client
    from shared.events import BenchmarkScores, Verdict
    from shared.records import RequestStatusView


class NotComparable(ValueError):
    """The two requests cannot be compared; the message says why and what to do."""


class RequestComparison(BaseModel):
    """``first`` against ``second``: ``paired.difference`` is first minus second on their shared items."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: str
    second: str
    benchmark: str
    base_models: tuple[str, str]
    primary_metric: str | None
    num_runs: int
    paired: PairedComparison
    #: In words: "ID1 is better than ID2 by +0.12 (95% CI +0.05 to +0.19, p = 0.002, 60 items)".
    summary: str
    #: The decision function's answer on these validation items (shared/decision.py, the one the
    #: benchmark stage calls): "worse", "indistinguishable", or "screened" (it would go on to the hidden
    #: confirmation pool, which only the benchmark stage reads), with its words.
    decision: Literal["worse", "indistinguishable", "screened"]
    decision_summary: str


def _scores(request_id: str, verdict: Verdict | None, view: RequestStatusView | None) -> BenchmarkScores:
    if verdict is None:
        if view is None:
            raise NotComparable(f"unknown request {request_id}: nothing was submitted under that id (or it was "
                                "forgotten, record_max_age_s after it ended)")
        raise NotComparable(f"{request_id} has no verdict yet (it is {view.status}): wait for it "
                            f"(`ftbus status {request_id}`), then compare")
    bench = verdict.result.benchmark
    if bench is None:
        where = f" (it failed at {verdict.failed_stage})" if verdict.failed_stage else ""
        raise NotComparable(f"{request_id} has no validation scores: its verdict is {verdict.status}{where}")
    if not bench.item_scores:
        raise NotComparable(f"{request_id}'s verdict has no per-item outcomes (a verdict from before ftbus kept "
                            "them, or a scorer that gives none): resubmit it to compare")
    return bench


def compare_verdicts(
    first: tuple[str, Verdict | None, RequestStatusView | None],
    second: tuple[str, Verdict | None, RequestStatusView | None],
    *,
    level: float = DEFAULT_LEVEL,
    seed: int = BOOTSTRAP_SEED,
) -> RequestComparison:
    """Compare two requests from their ids, verdicts and status views (None where there is none);
    raises NotComparable saying why they cannot be compared."""
    if not 0.0 < level < 1.0:
        raise NotComparable(f"level {level}: a confidence level between 0 and 1 (exclusive), e.g. 0.95")
    (id1, verdict1, view1), (id2, verdict2, view2) = first, second
    if id1 == id2:
        raise NotComparable(f"{id1} twice: compare two different requests")
    a, b = _scores(id1, verdict1, view1), _scores(id2, verdict2, view2)
    task1, task2 = (view1.task if view1 else None), (view2.task if view2 else None)
    for rid, task in ((id1, task1), (id2, task2)):
        if task is None:
            raise NotComparable(f"which benchmark {rid} ran is no longer known (its record is older than "
                                "record_max_age_s): only requests on the same benchmark are compared")
    assert task1 is not None and task2 is not None
    if task1.benchmark != task2.benchmark:
        raise NotComparable(f"{id1} ran benchmark {task1.benchmark}, {id2} ran {task2.benchmark}: only requests "
                            "on the same benchmark (and split) are compared")
    if a.primary_metric != b.primary_metric:
        raise NotComparable(f"{id1} was scored by {a.primary_metric}, {id2} by {b.primary_metric} (a benchmark "
                            "changed between them): resubmit the older one to compare")
    if a.num_runs != b.num_runs:
        raise NotComparable(f"{id1} ran {a.num_runs} runs per item, {id2} ran {b.num_runs}: an average over more "
                            "runs is less noisy, so they are not paired; resubmit one with --num-runs "
                            f"{max(a.num_runs, b.num_runs)}")
    paired, words = compare_scores(a, b, level=level, seed=seed, other_name=id2)
    if paired is None:
        reason = words.split(": ", 1)[1] if ": " in words else words
        raise NotComparable(f"{id1} and {id2} cannot be paired: {reason}; compare requests scored on the same "
                            "validation items (the same benchmark version)")
    cand, ref, strata = paired_outcomes(a, b)
    decided = decide(cand, ref, OwnerState(owner="ftbus compare"), benchmark=task1.benchmark, pool=None,
                     strata=strata, reference_name=id2)
    if decided.screened:
        answer, said = "screened", (
            f"screened in against {id2} on validation ({decided.validation_difference:+.3f}, one-sided p = "
            f"{decided.screen_p:.2g}, below the screen's {SCREEN_LEVEL:g}): the benchmark stage would go on to "
            "confirm it on the hidden pool, which compare does not read")
    else:
        answer, said = decided.answer, decided.summary
    return RequestComparison(
        first=id1, second=id2, benchmark=task1.benchmark, base_models=(task1.base_model, task2.base_model),
        primary_metric=a.primary_metric, num_runs=a.num_runs, paired=paired, summary=f"{id1} is {words}",
        decision=answer, decision_summary=f"decision: {said}",
    )


def describe_details(result: RequestComparison) -> str:
    """What the sentence rests on: the means, the test, the seed (the terminal's second line)."""
    p = result.paired
    metric = result.primary_metric or "score"
    test = p.method
    if p.test == "mcnemar":
        test += f", on {p.candidate_only} items only {result.first} got right, {p.baseline_only} only {result.second}"
    models = result.base_models[0] if result.base_models[0] == result.base_models[1] else " vs ".join(
        result.base_models)
    runs = "1 run" if result.num_runs == 1 else f"{result.num_runs} runs"
    return (f"{result.benchmark} validation, {metric} ({'higher' if p.higher_is_better else 'lower'} is better), "
            f"base model {models}: {result.first} {p.candidate_mean:.4f}, {result.second} {p.baseline_mean:.4f} "
            f"over {p.items} shared items, {runs} per item; {test}")


async def compare_requests(client: Client, first: str, second: str, *, level: float = DEFAULT_LEVEL,
                           seed: int = BOOTSTRAP_SEED) -> RequestComparison:
    """Read both verdicts (never a report) and status views, and compare them."""
    sides = [(rid, await client.get(rid), await client.status(rid)) for rid in (first, second)]
    return compare_verdicts(sides[0], sides[1], level=level, seed=seed)
