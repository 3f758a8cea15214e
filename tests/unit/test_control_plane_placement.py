"""Placement: queue counts from throughput hints, and spreading queues by free capacity."""

from __future__ import annotations

import random

import pytest

from control_plane.errors import InsufficientCapacity
from control_plane.placement import GroupCapacity, queue_count_for, spread


def test_queue_count_is_four_at_least_and_one_per_thousand_msgs_per_s() -> None:
    assert queue_count_for(None) == 4
    assert queue_count_for(1) == 4
    assert queue_count_for(4000) == 4
    assert queue_count_for(4001) == 5
    assert queue_count_for(16_000) == 16


def test_queues_go_to_the_group_with_most_free_capacity() -> None:
    groups = [GroupCapacity("a", 100, 90), GroupCapacity("b", 100, 0), GroupCapacity("c", 100, 50)]
    assert spread(4, groups) == {"b": 4}


def test_alike_groups_share_a_topic() -> None:
    groups = [GroupCapacity("a", 100, 0), GroupCapacity("b", 100, 0), GroupCapacity("c", 100, 0)]
    assert spread(6, groups) == {"a": 2, "b": 2, "c": 2}


def test_queues_land_in_proportion_to_free_capacity() -> None:
    groups = [GroupCapacity("a", 30, 0), GroupCapacity("b", 10, 0)]
    placed = spread(24, groups)
    assert placed == {"a": 22, "b": 2}  # levelled: both end with 8 free


def test_a_full_fleet_refuses_with_the_numbers() -> None:
    with pytest.raises(InsufficientCapacity) as e:
        spread(5, [GroupCapacity("a", 4, 0), GroupCapacity("b", 10, 10)])
    assert e.value.details == {"free_queues": 4, "requested_queues": 5}
    with pytest.raises(InsufficientCapacity):
        spread(1, [])


def test_random_fleets_never_overfill_and_place_everything(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        groups = [
            GroupCapacity(f"g{i}", rng.randrange(0, 50), rng.randrange(0, 60)) for i in range(rng.randrange(1, 6))
        ]
        free = sum(g.free_queues for g in groups)
        wanted = rng.randrange(1, 40)
        if wanted > free:
            with pytest.raises(InsufficientCapacity):
                spread(wanted, groups)
            continue
        placed = spread(wanted, groups)
        assert sum(placed.values()) == wanted
        for g in groups:
            assert placed.get(g.name, 0) <= g.free_queues
        # levelled: no group got a queue while another had two or more free queues more
        left = {g.name: g.free_queues - placed.get(g.name, 0) for g in groups}
        for name, n in placed.items():
            if n:
                assert all(left[other] <= left[name] + 1 for other in left)
