"""The campaign's online test levels: a bound on the chance of ANY false acceptance in a campaign.

A campaign tests its candidates one after the other, each against the incumbent of its moment, on
the same validation items. Testing each at 0.05 would accept a pure-noise candidate somewhere in 20
with a chance near 0.2 (docs/benchmarks.md, "Campaigns"). The procedure here is the online
*fallback* procedure of Tian & Ramdas (2021, "Online control of the familywise error rate"):

- the i-th tested candidate gets the one-sided level ``alpha_i = alpha * gamma_i + carried``, with
  ``gamma_i = 6 / (pi^2 i^2)`` (the gammas sum to 1);
- ``carried`` is the previous test's level when that candidate was accepted, else 0.

With nothing accepted this is plain alpha-spending (a union bound: sum alpha_i <= alpha); an
acceptance passes its level on, as in a fixed-sequence "fallback" test. It bounds the family-wise
error rate (the chance of at least one false acceptance) by ``alpha`` under ANY dependence between
the tests, which matters here: every candidate is paired on the same items as the incumbent and the
base, so their p-values are dependent, and procedures that assume independence (ADDIS, LORD++'s
FDR guarantee) do not apply. ``tests/unit/test_online_testing.py`` shows the bound by simulation.

Pure functions and a small frozen state, stored in the campaign record (shared/campaigns.py).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

#: The chance of any false acceptance the procedure allows over a whole campaign.
CAMPAIGN_ALPHA = 0.05
PROCEDURE = "online-fallback"


def gamma(i: int) -> float:
    """The share of alpha spent on the i-th test (1-based): 6 / (pi^2 i^2), summing to 1 over i >= 1."""
    if i < 1:
        raise ValueError(f"tests are numbered from 1, got {i}")
    return 6.0 / (math.pi**2 * i * i)


class OnlineState(BaseModel):
    """Where a campaign's procedure stands: how many candidates it has tested, and the level the last
    test passes on (its own when that candidate was accepted, else 0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(default=CAMPAIGN_ALPHA, gt=0.0, le=0.05)
    tests: int = Field(default=0, ge=0)
    carried: float = Field(default=0.0, ge=0.0)

    def next_index(self) -> int:
        return self.tests + 1

    def next_level(self) -> float:
        """The one-sided level of the next test."""
        return self.alpha * gamma(self.next_index()) + self.carried

    def after(self, accepted: bool) -> OnlineState:
        """The state once the next test is made (at :meth:`next_level`) and its candidate accepted or not."""
        level = self.next_level()
        return self.model_copy(update={"tests": self.tests + 1, "carried": level if accepted else 0.0})


def two_sided_level(one_sided: float) -> float:
    """The confidence level of the two-sided comparison whose "better beyond noise" is a one-sided test at
    ``one_sided``: McNemar's and the sign-flip test are symmetric, so their two-sided p is twice the
    one-sided one, and the interval at 1 - 2 alpha_i excludes 0 on the better side exactly then."""
    return 1.0 - 2.0 * one_sided
