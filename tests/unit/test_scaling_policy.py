"""The scaling policy: when a topic's writable queues grow or shrink, to how many, and which
broker groups give queues up."""

from __future__ import annotations

import pytest

from control_plane.scaling_policy import ScalingSettings, decide, queues_for, shrink_plan

S = ScalingSettings(queue_capacity_msgs_per_s=1000, grow_at=0.8, target=0.5, shrink_at=0.25, shrink_after_s=60)


def test_a_rate_past_the_grow_mark_grows_to_the_target_utilisation() -> None:
    assert decide(rate=3_100, writable=4, minimum=4, low_for_s=0, settings=S) is None  # 77 % of 4 queues
    d = decide(rate=3_300, writable=4, minimum=4, low_for_s=0, settings=S)
    assert d is not None
    assert (d.action, d.writable) == ("grow", 7)  # 3300 / 500 per queue
    assert "over 80% of what 4 queues carry" in d.reason
    d = decide(rate=40_000, writable=4, minimum=4, low_for_s=0, settings=S)
    assert d is not None
    assert (d.action, d.writable) == ("grow", 80)


def test_a_grow_adds_at_least_one_queue() -> None:
    tight = ScalingSettings(queue_capacity_msgs_per_s=1000, grow_at=0.9, target=0.85, shrink_at=0.1)
    d = decide(rate=3_700, writable=4, minimum=1, low_for_s=0, settings=tight)
    assert d is not None
    assert d.writable == 5


def test_a_low_rate_shrinks_only_after_it_lasted_and_never_below_the_minimum() -> None:
    assert decide(rate=500, writable=40, minimum=4, low_for_s=59, settings=S) is None
    d = decide(rate=500, writable=40, minimum=4, low_for_s=60, settings=S)
    assert d is not None
    assert (d.action, d.writable) == ("shrink", 4)  # 1 queue carries 500 at 50 %, the minimum is 4
    d = decide(rate=9_000, writable=80, minimum=4, low_for_s=600, settings=S)
    assert d is not None
    assert (d.action, d.writable) == ("shrink", 18)
    assert decide(rate=0, writable=4, minimum=4, low_for_s=3600, settings=S) is None


def test_between_the_marks_nothing_changes() -> None:
    for rate in (2_500, 5_000, 8_000):
        assert decide(rate=rate, writable=10, minimum=4, low_for_s=3600, settings=S) is None, rate


def test_fewer_queues_than_the_minimum_grow_to_it() -> None:
    d = decide(rate=0, writable=2, minimum=4, low_for_s=0, settings=S)
    assert d is not None
    assert (d.action, d.writable) == ("grow", 4)


def test_queues_for_is_at_least_one() -> None:
    assert queues_for(0, S) == 1
    assert queues_for(501, S) == 2


def test_shrink_takes_from_the_groups_holding_most() -> None:
    assert shrink_plan({"broker-a": 6, "broker-b": 2}, 4) == {"broker-a": 4}
    assert shrink_plan({"broker-a": 4, "broker-b": 4}, 3) == {"broker-b": 2, "broker-a": 1}
    assert shrink_plan({"broker-a": 1}, 5) == {"broker-a": 1}


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"queue_capacity_msgs_per_s": 0}, "queue_capacity"), ({"shrink_at": 0.6}, "shrink_at < target"),
     ({"grow_at": 1.2}, "grow_at <= 1"), ({"shrink_after_s": -1}, "shrink_after_s")],
)  # fmt: skip
def test_bad_settings_are_refused_naming_them(changes: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalingSettings(**changes).check()
