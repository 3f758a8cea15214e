"""A consumer group's consume rate, from the offsets it committed: each look at a group's lag
keeps (when, the sum of its committed offsets) per (tenant, group, topic), and the next look
within ``MAX_AGE_S`` divides the difference by the time between them. Kept in this process only,
for at most ``MAX_ENTRIES`` groups (the oldest go first): the rate is since the previous look at
the page, which the page says."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_ENTRIES = 1024
MAX_AGE_S = 300.0


@dataclass(frozen=True, slots=True)
class Rate:
    msgs_per_s: float
    over_s: float


class ConsumeRates:
    def __init__(self, *, clock_s: Callable[[], float] = time.monotonic) -> None:
        self.clock_s = clock_s
        self._last: OrderedDict[tuple[str, str, str], tuple[float, int]] = OrderedDict()

    def observe(self, key: tuple[str, str, str], committed: int) -> Rate | None:
        """Record ``committed`` now; the rate since the previous record (None: none recent, or
        the offsets went back, as after a reset)."""
        now = self.clock_s()
        previous = self._last.pop(key, None)
        self._last[key] = (now, committed)
        while len(self._last) > MAX_ENTRIES:
            self._last.popitem(last=False)
        if previous is None:
            return None
        at, before = previous
        elapsed = now - at
        if not 0 < elapsed <= MAX_AGE_S or committed < before:
            return None
        return Rate((committed - before) / elapsed, elapsed)
