"""The confirmation pool's sequential test: an anytime-valid test, by betting, that a candidate is
better than its reference on items drawn fresh from a hidden pool (docs/benchmarks.md, "Confirming
on a hidden pool").

Each pool item gives a paired difference ``d`` in [-1, 1] (the candidate's score minus the
reference's on that item; graded scores included). The null hypothesis is "not better": the
differences' mean over the benchmark's items is at most 0. The test bets against it
(Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by betting"; Shafer &
Vovk's testing by betting): a wealth that starts at 1 and multiplies by ``1 + lambda_t d_t`` with a
bet ``lambda_t`` in [0, MAX_BET] chosen from the items before t only (aGRAPA, their eq. (26)). Under
the null ``E[1 + lambda_t d_t | past] <= 1``, so the wealth is a nonnegative supermartingale and, by
Ville's inequality, the chance that it EVER reaches ``1 / level`` is at most ``level``: the test may
look after every batch, stop for futility, or stop at the budget, and the level still holds
(Howard et al. 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences").

The pool's items come in a fixed hidden random order (each draw picks its subset uniformly, so the
mean difference is the headline's mean of the subsets' means): pool draws are random draws of the
benchmark's items, which is what the null is about.

Pure numpy on one array: ``confirm`` takes the differences drawn so far and says whether to stop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

#: The largest bet: the wealth can fall by at most half on one item (d = -1).
MAX_BET = 0.5
#: The prior variance the bets start from (a difference in [-1, 1] of two models that differ on a
#: quarter to a half of the items).
PRIOR_VARIANCE = 0.25
#: Items drawn at a time from the pool (one engine job on the GPU stage); the test looks after each.
BATCH = 64
#: Items before the test may stop for futility: from then on, a batch end where the candidate has not
#: gained at all on the pool so far stops it (a stop that can only refuse keeps the level).
FUTILITY_AFTER = 128
#: The most pool items one confirmation draws.
BUDGET = 1_000

Stop = Literal["confirmed", "futile", "budget", "pool exhausted", "candidate failed", "going on"]


def log_wealth(diffs: Sequence[float] | np.ndarray) -> np.ndarray:
    """The log of the betting wealth after each item: log prod_{i<=t} (1 + lambda_i d_i), with the
    aGRAPA bet lambda_i = clip(mu / (var + mu^2), 0, MAX_BET) from the items before i (a prior
    item of mean 0 and variance PRIOR_VARIANCE to start)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return np.zeros(0)
    seen = np.arange(d.size, dtype=np.float64) + 1.0  # items before i, plus the prior's one
    total = np.concatenate(([0.0], np.cumsum(d)[:-1]))
    squares = np.concatenate(([0.0], np.cumsum(d * d)[:-1]))
    mean = total / seen
    variance = np.maximum(PRIOR_VARIANCE + squares - seen * mean * mean, 0.0) / seen
    bet = np.clip(mean / np.maximum(variance + mean * mean, 1e-12), 0.0, MAX_BET)
    return np.cumsum(np.log1p(bet * d))


class Confirmation(BaseModel):
    """Where a confirmation stands after the items drawn so far."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: float
    items: int
    #: The largest wealth reached (the e-value at the stop; confirmed when >= 1 / level).
    wealth: float
    stop: Stop
    #: The mean difference over the items drawn (biased upwards by the stop; the verdict's estimate
    #: comes from fresh items after it).
    mean: float

    @property
    def confirmed(self) -> bool:
        return self.stop == "confirmed"


def confirm(diffs: Sequence[float] | np.ndarray, level: float, *, budget: int = BUDGET, pool_left: bool = True,
            batch: int = BATCH, futility_after: int = FUTILITY_AFTER) -> Confirmation:
    """The test after ``diffs`` (the pool items drawn so far, in draw order), looked at after each
    ``batch``: "confirmed" at the first batch end where the wealth reached 1 / level, "futile" at the
    first one from ``futility_after`` items where the mean difference so far is at most 0, "budget"
    once ``budget`` items are drawn, "pool exhausted" when ``pool_left`` is false, else "going on"
    (draw the next batch)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confirmation's level must be in (0, 1), got {level}")
    d = np.clip(np.asarray(diffs, dtype=np.float64)[:budget], -1.0, 1.0)
    path = log_wealth(d)
    threshold = math.log(1.0 / level)
    ends = list(range(batch, d.size + 1, batch))
    if d.size % batch and (d.size == budget or not pool_left):
        ends.append(d.size)  # the last, partial batch: the pool or the budget ended inside it
    total = np.cumsum(d)
    for end in ends:
        best = float(path[:end].max())
        if best >= threshold:
            return _at(d, end, level, "confirmed", best)
        if end >= futility_after and total[end - 1] <= 0.0:
            return _at(d, end, level, "futile", best)
    best = float(path.max()) if d.size else 0.0
    if d.size >= budget:
        return _at(d, d.size, level, "budget", best)
    if not pool_left:
        return _at(d, d.size, level, "pool exhausted", best)
    return _at(d, d.size, level, "going on", best)


def _at(d: np.ndarray, end: int, level: float, stop: Stop, best_log: float) -> Confirmation:
    mean = float(d[:end].mean()) if end else 0.0
    return Confirmation(level=level, items=end, wealth=math.exp(min(best_log, 700.0)), stop=stop, mean=mean)


def largest_possible_wealth(items: int) -> float:
    """The log-wealth a pool of ``items`` items reaches at best (every difference +1, the bets growing
    from 0): whether a pool that small can confirm anything at a level."""
    return float(log_wealth(np.ones(items)).max()) if items else 0.0


#: The candidate a pool's power is stated for: it gains POWER_GAIN over its reference and differs from
#: it on POWER_DIFFERING of the items (bench/search_power.py's real candidates).
POWER_GAIN = 0.10
POWER_DIFFERING = 0.20


def pool_power(items: int, level: float, *, gain: float = POWER_GAIN, differing: float = POWER_DIFFERING,
               runs: int = 400, seed: int = 0) -> float:
    """The chance that a confirmation on ``items`` pool items (at most BUDGET are drawn) confirms, at
    ``level``, a candidate that truly gains ``gain`` and differs from its reference on ``differing`` of
    the items (right where the reference is wrong on (differing + gain) / 2 of them): seeded simulation
    of ``confirm`` itself, so the statement a verdict makes is the test's own."""
    items = min(items, BUDGET)
    if items <= 0 or largest_possible_wealth(items) < math.log(1.0 / level):
        return 0.0
    rng = np.random.default_rng(seed)
    up, down = (differing + gain) / 2, (differing - gain) / 2
    draws = rng.random((runs, items))
    diffs = np.where(draws < up, 1.0, np.where(draws < up + down, -1.0, 0.0))
    return float(np.mean([confirm(d, level, pool_left=False).confirmed for d in diffs]))
