"""What the models store's retention sweep writes beside a request's trained outputs, and the one
rule that says which candidate leads a leaderboard (the dashboard's and the sweep's).

``<request_id>/ranking.json``: where the request stands (base model, benchmark, its validation
score), written once its verdict is out, so that a leader's place outlives its record.
``<request_id>/expired.json``: the outputs were removed, when and why (`ftbus pull` says so).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

RANKING = "ranking.json"
EXPIRED_MARKER = "expired.json"


class Ranking(BaseModel):
    request_id: str
    base_model: str
    benchmark: str
    primary_metric: str | None = None
    higher_is_better: bool = True
    #: The validation split's primary value; None: the request has no score (it cannot lead).
    value: float | None = None
    submitted_at: datetime | None = None


class ExpiredMarker(BaseModel):
    expired_at: datetime
    trained_at: datetime
    max_age_s: float

    def describe(self, request_id: str) -> str:
        days = self.max_age_s / 86400
        return (
            f"the trained outputs of {request_id} expired on {self.expired_at:%Y-%m-%d %H:%M} UTC: trained "
            f"{self.trained_at:%Y-%m-%d %H:%M} UTC, kept {days:g} days (artifact_max_age_s); only each "
            "leaderboard's best candidate is kept longer. Submit the workspace again to train it again"
        )


def rank_key(value: float, higher_is_better: bool, submitted_at: str, request_id: str) -> tuple[float, str, str]:
    """Sort key of a leaderboard row: the best validation score first, then the earliest submitted
    (``submitted_at`` as ISO text, "" when unknown), then the request id."""
    return (-value if higher_is_better else value, submitted_at, request_id)


def leaders(rankings: list[Ranking]) -> dict[tuple[str, str], str]:
    """(base model, benchmark) -> the request that leads it, among ``rankings`` with a score."""
    best: dict[tuple[str, str], Ranking] = {}
    for r in rankings:
        if r.value is None:
            continue
        key = (r.base_model, r.benchmark)
        current = best.get(key)
        if current is None or _key(r) < _key(current):
            best[key] = r
    return {key: r.request_id for key, r in best.items()}


def _key(r: Ranking) -> tuple[float, str, str]:
    assert r.value is not None
    return rank_key(r.value, r.higher_is_better, r.submitted_at.isoformat() if r.submitted_at else "", r.request_id)
