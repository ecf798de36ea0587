"""The fair-share pick (shared/lanes.py): which lane a worker serves next, without a server. The
lanes as the server would list them are plain values here; tests/integration/test_fair_share.py runs
the same picks through real lane consumers."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from shared.events import Stage
from shared.lanes import NO_CAMPAIGN, Lane, Lanes, lane_of
from shared.settings import Settings
from shared.subjects import Subjects
from tests.fakes.judge_events import data_failed


def lanes_of(**settings: object) -> Lanes:
    bus = SimpleNamespace(subjects=Subjects("t"), settings=Settings(**settings))  # type: ignore[arg-type]
    return Lanes(bus, Stage.train)


def serve(lanes: Lanes, queue: list[Lane], picks: int) -> list[str]:
    """``picks`` turns, each message done before the next pick (one worker, one slot)."""
    order: list[str] = []
    for _ in range(picks):
        candidates = [lane for lane in lanes.order(queue) if lane.waiting]
        if not candidates:
            break
        lane = candidates[0]
        lanes.served(lane.name)
        lane.waiting -= 1
        order.append(lane.name)
    return order


def test_two_waiting_campaigns_take_turns() -> None:
    order = serve(lanes_of(), [Lane("alpha", 10, 0), Lane("beta", 10, 0)], 20)
    assert order == ["alpha", "beta"] * 10


def test_a_campaign_of_weight_two_is_served_twice_as_often_while_both_wait() -> None:
    order = serve(lanes_of(fair_share_weights={"alpha": 2.0}), [Lane("alpha", 40, 0), Lane("beta", 40, 0)], 30)
    counts = Counter(order)
    assert abs(counts["alpha"] - 20) <= 1 and abs(counts["beta"] - 10) <= 1, order
    # Never more than two of alpha's in a row once both are served: a weight is a share, not a burst.
    assert "alpha,alpha,alpha" not in ",".join(order[2:])


def test_a_campaign_that_arrives_late_is_served_next_and_banks_no_credit() -> None:
    lanes = lanes_of()
    queue = [Lane("alpha", 30, 0)]
    assert serve(lanes, queue, 5) == ["alpha"] * 5
    queue.append(Lane("beta", 3, 0))
    # beta's first turn comes at once; then the two alternate (beta is not owed alpha's five turns).
    assert serve(lanes, queue, 6) == ["beta", "alpha", "beta", "alpha", "beta", "alpha"]


def test_a_lane_at_its_cap_waits_while_others_are_served() -> None:
    lanes = lanes_of(fair_share_caps={"alpha": 1})
    queue = [Lane("alpha", 5, 1), Lane("beta", 2, 0)]
    assert [lane.name for lane in lanes.order(queue)] == ["beta"]
    queue[0].working = 0
    assert {lane.name for lane in lanes.order(queue)} == {"alpha", "beta"}


def test_a_lane_with_fewer_in_work_goes_first_on_equal_turns() -> None:
    lanes = lanes_of()
    queue = [Lane("alpha", 5, 1), Lane("beta", 5, 0)]
    assert lanes.order(queue)[0].name == "beta"


def test_idle_lanes_are_forgotten() -> None:
    lanes = lanes_of()
    serve(lanes, [Lane("alpha", 3, 0)], 3)
    lanes.order([Lane("beta", 1, 0)])
    assert set(lanes.turns) == {"beta"}


def test_a_request_is_in_its_campaigns_lane() -> None:
    event = data_failed()
    with_campaign = event.model_copy(update={"request_id": "r-1", "context": event.context.model_copy(
        update={"task": event.context.task.model_copy(update={"campaign": "sft-search"})})})
    from shared import codec

    assert lane_of(codec.encode(with_campaign)) == "sft-search"
    assert lane_of(codec.encode(event)) == NO_CAMPAIGN
    assert lane_of(b"\x00not msgpack") == NO_CAMPAIGN
