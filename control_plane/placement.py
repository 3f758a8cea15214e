"""Placement: how many queues a topic gets, and on which broker groups.

Queue count: ``max(4, ceil(throughput_hint_msgs_per_s / 1000))``, capped by what the tenant's
plan leaves. Spread: one queue at a time to the active broker group with the most free queues
(``max_queues - placed_queues``), ties broken by name — so queues land in proportion to free
capacity and a topic spreads over several groups when they are alike. Pure functions: the
service feeds them rows it locked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from control_plane.errors import InsufficientCapacity

MIN_QUEUES = 4
MSGS_PER_S_PER_QUEUE = 1000


@dataclass(frozen=True, slots=True)
class GroupCapacity:
    name: str
    max_queues: int
    placed_queues: int

    @property
    def free_queues(self) -> int:
        return max(0, self.max_queues - self.placed_queues)


def queue_count_for(throughput_hint_msgs_per_s: int | None) -> int:
    if not throughput_hint_msgs_per_s:
        return MIN_QUEUES
    return max(MIN_QUEUES, math.ceil(throughput_hint_msgs_per_s / MSGS_PER_S_PER_QUEUE))


def spread(queue_count: int, groups: Sequence[GroupCapacity]) -> dict[str, int]:
    """``{broker group: queues}`` for ``queue_count`` new queues; raises InsufficientCapacity."""
    free = {g.name: g.free_queues for g in groups}
    total_free = sum(free.values())
    if queue_count > total_free:
        raise InsufficientCapacity(
            f"the broker fleet has room for {total_free} more queues; {queue_count} are needed",
            free_queues=total_free,
            requested_queues=queue_count,
        )
    placed: dict[str, int] = {}
    for _ in range(queue_count):
        name = min(free, key=lambda n: (-free[n], n))
        free[name] -= 1
        placed[name] = placed.get(name, 0) + 1
    return placed
