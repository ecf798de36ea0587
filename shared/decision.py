"""The one decision: is a candidate better than its reference, with error control per owner.

``decide`` is the public, documented function (docs/benchmarks.md, "The decision"): the per-item
outcomes of the candidate and its reference on the validation split, the owner's state (its
``OwnerState``), and the hidden confirmation pool (a ``Pool``: what the candidate and the reference
score on pool items, drawn on demand) give a ``Decision``, and the owner's next state. Users can
simulate their own search policy against it (bench/search_power.py does).

How it decides:

1. **Screen on validation** (what the agent sees). The candidate goes on only when it beats the
   reference on the validation items at the one-sided SCREEN_LEVEL. The screen spends no error
   budget and has no guarantee of its own: it only saves pool items. Validation beyond noise at 95%
   on the worse side answers "worse".
2. **Confirm on the pool.** A screened candidate is tested on fresh pool items by the betting test
   of shared/confirmation.py, at the owner's next level: the owner's i-th confirmation gets
   ``alpha * 6 / (pi^2 i^2)``, plus the previous confirmation's level when that one confirmed
   (online fallback, Tian & Ramdas 2021). The levels sum to at most ``alpha`` over the owner's
   whole history, whatever it submits, in whichever campaigns.
3. **Fresh items after each acceptance.** The owner's pool cursor (per benchmark) moves past every
   item a confirmed candidate used (its confirmation and its estimate): later confirmations never
   reuse them. Until an acceptance, an owner learns one bit per confirmation ("not confirmed": no
   pool number is reported), so the candidates it sends between two acceptances are, on the path
   where none is confirmed, fixed before the pool's items are looked at; each test then holds at
   its level, and a union over them gives the owner's ``alpha`` (docs/benchmarks.md says the
   argument in full).
4. **An estimate selection did not touch.** A confirmed candidate's gain is estimated on the next
   ESTIMATE_ITEMS pool items after its confirmation, neither screened nor stopped on.

Pure: no bus, no clock. The judge will call it, as will ``ftbus compare`` and the simulations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from shared.confirmation import (
    BATCH,
    BUDGET,
    POWER_GAIN,
    Confirmation,
    confirm,
    largest_possible_wealth,
    pool_power,
)
from shared.events import BenchmarkScores
from shared.online_testing import gamma
from shared.paired_tests import betting_interval, upper_tail
from shared.statistics import MIN_ITEMS, equal_weights, stratum_weights

#: The chance, over an owner's whole history, that any "better" it was told is false.
OWNER_ALPHA = 0.05
#: The validation screen's one-sided level: a candidate goes to the pool when it beats its
#: reference on validation at this level (bench/search_power.py measured 0.1 to 0.5; 0.3 keeps
#: the power at every position and the items per candidate low).
SCREEN_LEVEL = 0.3
#: Pool items after a confirmation that estimate the accepted candidate's gain.
ESTIMATE_ITEMS = 200
#: The level at which validation says "worse".
WORSE_LEVEL = 0.95

Answer = Literal["better", "indistinguishable", "worse"]

#: What a true ``final_decision`` means under each ``judge_policy`` (services/judge/decide.py): what
#: every view of a verdict says beside it.
POLICY_MEANING: dict[str, str] = {
    "better": "better than the base model, confirmed on hidden items",
    "both": "every check passed, the LLM accepted, and validation is not below the base model (not: better)",
    "llm": "every check passed and the LLM accepted (not: better than the base model)",
    "rules": "every check passed (not: better than the base model)",
    "significant": "better than the base model beyond noise on validation alone (not confirmed on hidden items)",
}


class CandidateFailedOnPool(RuntimeError):
    """The candidate's own run on pool items failed (it timed out, its engine exited with an error, its
    output could not be read): raised by a ``Pool``'s ``differences``. The decision reads it as "not
    confirmed", at the level's cost, and tells the owner no more than that (the module's point 3: how a
    model fails on hidden items is information about them)."""


class Pool(Protocol):
    """The hidden confirmation pool of one benchmark, as a decision sees it."""

    #: How many items the pool holds.
    size: int

    def differences(self, start: int, stop: int) -> Sequence[float]:
        """The candidate's score minus the reference's on pool items [start, stop) in the pool's hidden
        order (fewer at the pool's end): the stage that serves it scores both on those items. Raises
        ``CandidateFailedOnPool`` where the candidate's run on them failed."""
        ...


class OwnerState(BaseModel):
    """An owner's (a submitting identity's) error budget: how many confirmations it has had, the level
    the last one passes on, and where each benchmark's pool starts for its next confirmation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owner: str
    alpha: float = Field(default=OWNER_ALPHA, gt=0.0, le=0.05)
    confirmations: int = Field(default=0, ge=0)
    carried: float = Field(default=0.0, ge=0.0)
    accepted: int = Field(default=0, ge=0)
    #: benchmark -> the first pool position a confirmation may use (every earlier one served an acceptance).
    cursors: dict[str, int] = Field(default_factory=dict)

    def next_level(self) -> float:
        return self.alpha * gamma(self.confirmations + 1) + self.carried

    def spent(self) -> float:
        """The error budget spent so far (the union bound over the levels given out)."""
        return sum(self.alpha * gamma(i) for i in range(1, self.confirmations + 1))


class Decision(BaseModel):
    """A decision, and what it cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer: Answer
    #: The words a verdict shows.
    summary: str
    validation_items: int
    validation_difference: float
    #: The screen's one-sided p-value on validation; None with too few items.
    screen_p: float | None
    screened: bool
    #: The pool test's state, and the pool items this decision used (its confirmation and, when
    #: confirmed, its estimate). For the operator's records only when not confirmed: what goes back to
    #: the owner then is the answer and ``summary``, never these (the module's point 3).
    confirmation: Confirmation | None = None
    pool_items: int = 0
    #: A confirmed candidate's gain on fresh pool items, with its 95% interval.
    estimate: float | None = None
    estimate_low: float | None = None
    estimate_high: float | None = None
    #: Why the pool could not confirm (too small for the level, none at all); None otherwise.
    pool_note: str | None = None
    #: Why the candidate's run on pool items failed, for the operator only: the owner reads
    #: "not confirmed", as for any confirmation that did not reach its level.
    pool_failure: str | None = None
    owner_after: OwnerState

    @property
    def better(self) -> bool:
        return self.answer == "better"

    @property
    def items_used(self) -> int:
        return self.validation_items + self.pool_items


def _weighted(candidate: Mapping[str, float], reference: Mapping[str, float],
              strata: Mapping[str, str] | None) -> tuple[np.ndarray, np.ndarray]:
    if candidate.keys() != reference.keys():
        raise ValueError("a decision needs the candidate and its reference scored on the same validation items")
    ids = sorted(candidate)
    d = np.array([float(candidate[i]) - float(reference[i]) for i in ids])
    w = np.array(stratum_weights([strata[i] if strata else "" for i in ids]))
    return d, w


def item_outcomes(scores: BenchmarkScores) -> dict[str, float]:
    """``<subset>/<item>`` -> the item's mean score, higher better (a lower-is-better metric flipped)."""
    means = scores.item_means()
    return means if scores.higher_is_better else {k: 1.0 - v for k, v in means.items()}


def paired_outcomes(candidate: BenchmarkScores, reference: BenchmarkScores,
                    ) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """What ``decide`` takes from two validation results: each one's ``item_outcomes`` on the items both
    scored, and each item's subset (its stratum)."""
    cand, ref = item_outcomes(candidate), item_outcomes(reference)
    common = sorted(cand.keys() & ref.keys())
    return ({k: cand[k] for k in common}, {k: ref[k] for k in common}, {k: k.split("/", 1)[0] for k in common})


def screen_p(diffs: np.ndarray, weights: np.ndarray) -> float:
    """The one-sided p-value of "the candidate is better" on validation: McNemar's exact one-sided test
    for items right or wrong of equal weight, else the normal approximation of the weighted mean
    difference (the screen only decides which candidates use pool items, so an approximation costs
    power, never the guarantee)."""
    if equal_weights(list(weights)) and np.isin(diffs, (-1.0, 0.0, 1.0)).all():
        wins, losses = int((diffs > 0).sum()), int((diffs < 0).sum())
        return upper_tail(wins, wins + losses, 0.5) if wins + losses else 1.0
    w = weights / weights.sum()
    mean = float(w @ diffs)
    spread = math.sqrt(float(((w * diffs) ** 2).sum()))
    if spread == 0.0:
        return 1.0
    return 1.0 - NormalDist().cdf(mean / spread)


def decide(candidate: Mapping[str, float], reference: Mapping[str, float], owner: OwnerState, *,
           benchmark: str, pool: Pool | None, strata: Mapping[str, str] | None = None,
           reference_name: str = "the base model") -> Decision:
    """Better than, not distinguishable from, or worse than the reference; see the module's text.

    ``candidate``/``reference``: item id -> validation score in [0, 1] (higher is better).
    ``pool``: the benchmark's confirmation pool with this pair's scores, or None where the benchmark
    has no spare items (then nothing is called better: the verdict says why)."""
    diffs, weights = _weighted(candidate, reference, strata)
    n = diffs.size
    difference = float((weights / weights.sum()) @ diffs) if n else 0.0
    common = {"validation_items": n, "validation_difference": difference}
    if n < MIN_ITEMS:
        return Decision(answer="indistinguishable", screen_p=None, screened=False, owner_after=owner, **common,
                        summary=f"too few validation items to say ({n}, fewer than {MIN_ITEMS})")
    p = screen_p(diffs, weights)
    worse_p = screen_p(-diffs, weights)
    if worse_p < (1.0 - WORSE_LEVEL) / 2:
        return Decision(answer="worse", screen_p=p, screened=False, owner_after=owner, **common,
                        summary=(f"worse than {reference_name} on validation by {difference:+.3f} "
                                 f"(one-sided p = {worse_p:.2g}, {n} items)"))
    if p >= SCREEN_LEVEL:
        return Decision(answer="indistinguishable", screen_p=p, screened=False, owner_after=owner, **common,
                        summary=(f"not distinguishable from {reference_name}: on validation {difference:+.3f}, "
                                 f"one-sided p = {p:.2g}, not below the screen's {SCREEN_LEVEL:g}; no pool "
                                 f"item or error budget spent"))
    level = owner.next_level()
    start = owner.cursors.get(benchmark, 0)
    left = (pool.size - start) if pool is not None else 0
    if pool is None or left <= 0 or largest_possible_wealth(min(left, BUDGET)) < math.log(1.0 / level):
        note = ("this benchmark has no confirmation pool (every item is in its validation or test split)"
                if pool is None else
                f"the confirmation pool has {max(left, 0)} unused items for this owner, too few to reach the "
                f"level {level:.3g} even if the candidate won every one")
        return Decision(answer="indistinguishable", screen_p=p, screened=True, owner_after=owner, pool_note=note,
                        **common, summary=f"not confirmed: {note}; on validation {difference:+.3f}, p = {p:.2g}")
    power_note = None
    if left < BUDGET:
        # A pool smaller than one confirmation's budget: the verdict states what it can confirm.
        power_note = (f"the confirmation pool has {left} unused items for this owner (a confirmation may use "
                      f"{BUDGET}): at level {level:.3g} it confirms a real +{POWER_GAIN:.2f} gain with a chance "
                      f"of about {pool_power(left, level):.2f}")
    said_power = f"; {power_note}" if power_note else ""
    drawn: list[float] = []
    result = confirm([], level)
    failure = None
    while result.stop == "going on":
        stop = min(start + len(drawn) + BATCH, start + BUDGET, pool.size)
        try:
            batch = list(pool.differences(start + len(drawn), stop))
        except CandidateFailedOnPool as exc:
            # Not confirmed, and the level is spent: a failure is one of the owner's outcomes, and it
            # depends on the hidden items as much as a futile test does.
            failure = str(exc)
            result = result.model_copy(update={"stop": "candidate failed"})
            break
        drawn.extend(batch)
        result = confirm(drawn, level, pool_left=bool(batch) and start + len(drawn) < pool.size)
    used = result.items
    after = owner.model_copy(update={"confirmations": owner.confirmations + 1,
                                     "carried": level if result.confirmed else 0.0})
    if not result.confirmed:
        # No pool number goes back to the owner: one bit per confirmation (the module's point 3). The
        # words are the same whether the test did not reach its level or the candidate's run failed.
        return Decision(answer="indistinguishable", screen_p=p, screened=True, confirmation=result, pool_items=used,
                        owner_after=after, pool_failure=failure, pool_note=power_note, **common,
                        summary=(f"not confirmed on the hidden pool at level {level:.3g} (screened in on "
                                 f"validation: {difference:+.3f}, p = {p:.2g}){said_power}"))
    est_start = start + used
    est = np.asarray(list(pool.differences(est_start, min(est_start + ESTIMATE_ITEMS, pool.size))), dtype=float)
    if est.size >= MIN_ITEMS:
        # The betting interval holds its 95% whatever the differences' shape (a normal one covered far
        # less when nearly every fresh item is a win: shared/paired_tests.py).
        mean, _, low, high = betting_interval(est, np.ones(est.size), seed=0, level=0.95)
        estimate = mean
        said = f"{mean:+.3f} (95% CI {low:+.3f} to {high:+.3f}, {est.size} fresh pool items)"
    else:
        estimate, low, high = result.mean, None, None
        said = f"{result.mean:+.3f} on the confirmation's own items (no fresh items left: biased up by the stop)"
    cursor = est_start + int(est.size)
    after = after.model_copy(update={"accepted": owner.accepted + 1,
                                     "cursors": {**owner.cursors, benchmark: cursor}})
    return Decision(answer="better", screen_p=p, screened=True, confirmation=result,
                    pool_items=used + int(est.size), estimate=estimate, estimate_low=low, estimate_high=high,
                    owner_after=after, pool_note=power_note, **common,
                    summary=(f"better than {reference_name}: confirmed on {used} hidden pool items at level "
                             f"{level:.3g} (e-value {result.wealth:.3g}); its gain {said}{said_power}"))
