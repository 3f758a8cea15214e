"""Scaling policy: how many writable queues a topic's publish rate asks for. Pure functions of
the rate, the queues and the settings; the autoscaler (``autoscaler.py``) feeds them and carries
their decisions out.

A queue sustains ``queue_capacity_msgs_per_s`` (``benchmarks`` measure it; a setting). A topic
grows when its rate passes ``grow_at`` of what its writable queues sustain, to the queues that
put it at ``target`` of that; it shrinks when the rate has stayed below ``shrink_at`` for
``shrink_after_s``, to the same target, never below its minimum (the queues its throughput hint
asks for). The gap between ``grow_at`` and ``shrink_at`` keeps a steady load from flapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class ScalingSettings:
    queue_capacity_msgs_per_s: float = 1000.0
    grow_at: float = 0.8
    target: float = 0.5
    shrink_at: float = 0.25
    shrink_after_s: float = 60.0

    def check(self) -> None:
        if self.queue_capacity_msgs_per_s <= 0:
            raise ValueError("queue_capacity_msgs_per_s must be above 0")
        if not 0 < self.shrink_at < self.target < self.grow_at <= 1:
            raise ValueError(
                f"want 0 < shrink_at < target < grow_at <= 1, not {self.shrink_at}, {self.target}, {self.grow_at}"
            )
        if self.shrink_after_s < 0:
            raise ValueError("shrink_after_s must be 0 or more")


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["grow", "shrink"]
    writable: int  # the writable queues wanted
    reason: str


def queues_for(rate: float, settings: ScalingSettings) -> int:
    """The writable queues that carry ``rate`` at the target utilisation (at least 1)."""
    return max(1, math.ceil(rate / (settings.queue_capacity_msgs_per_s * settings.target)))


def decide(*, rate: float, writable: int, minimum: int, low_for_s: float, settings: ScalingSettings) -> Decision | None:
    """What ``writable`` queues publishing ``rate`` msgs/s should become (None: stay).
    ``low_for_s``: how long the rate has been below the shrink mark (0: it is not)."""
    capacity = settings.queue_capacity_msgs_per_s
    if writable < minimum:
        return Decision("grow", minimum, f"{writable} writable queues, fewer than the topic's minimum {minimum}")
    if rate > settings.grow_at * capacity * writable:
        wanted = max(writable + 1, queues_for(rate, settings))
        return Decision(
            "grow", wanted, f"{rate:.0f} msgs/s is over {settings.grow_at:.0%} of what {writable} queues carry"
        )
    if writable > minimum and is_low(rate, writable, settings) and low_for_s >= settings.shrink_after_s:
        wanted = max(minimum, queues_for(rate, settings))
        if wanted < writable:
            return Decision(
                "shrink",
                wanted,
                f"{rate:.0f} msgs/s, under {settings.shrink_at:.0%} of what {writable} queues carry for "
                f"{low_for_s:.0f} s",
            )
    return None


def is_low(rate: float, writable: int, settings: ScalingSettings) -> bool:
    return rate < settings.shrink_at * settings.queue_capacity_msgs_per_s * writable


def shrink_plan(writable_by_group: dict[str, int], remove: int) -> dict[str, int]:
    """Which groups give up ``remove`` writable queues: one at a time from the group with the
    most (ties: the later name), so a topic stays spread; every group keeps what is not taken."""
    left = dict(writable_by_group)
    taken: dict[str, int] = {}
    for _ in range(min(remove, sum(left.values()))):
        name = max(left, key=lambda n: (left[n], n))
        left[name] -= 1
        taken[name] = taken.get(name, 0) + 1
    return taken
