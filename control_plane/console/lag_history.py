"""A consumer group's recent lag and consume rate, from the looks at its lag page: each look
keeps (when, the sum of its committed offsets, its total lag) per (tenant, group, topic). The
consume rate is the committed offsets' growth since the previous look; the lag chart is the
looks of the last ``MAX_AGE_S``. Kept in this process only, at most ``MAX_SAMPLES`` looks for
each of ``MAX_ENTRIES`` groups (the least recently looked at go first): the page says so."""

from __future__ import annotations

import datetime as dt
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_ENTRIES = 1024
MAX_SAMPLES = 150  # 5 minutes of looks every 2 s (the page's own refresh)
MAX_AGE_S = 300.0

Key = tuple[str, str, str]  # tenant, group, topic


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # on the monotonic clock
    wall: dt.datetime
    committed: int
    lag: int


@dataclass(frozen=True, slots=True)
class Rate:
    msgs_per_s: float
    over_s: float


class LagHistory:
    def __init__(
        self,
        *,
        clock_s: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.clock_s = clock_s
        self.wall = wall
        self._samples: OrderedDict[Key, deque[Sample]] = OrderedDict()

    def observe(self, key: Key, *, committed: int, lag: int) -> tuple[Rate | None, list[Sample]]:
        """Record a look; the rate since the previous one (None: no recent one, or the offsets
        went back, as after a reset) and the looks of the last MAX_AGE_S, this one included."""
        now = self.clock_s()
        samples = self._samples.pop(key, None) or deque(maxlen=MAX_SAMPLES)
        while samples and now - samples[0].at_s > MAX_AGE_S:
            samples.popleft()
        previous = samples[-1] if samples else None
        samples.append(Sample(now, self.wall(), committed, lag))
        self._samples[key] = samples
        while len(self._samples) > MAX_ENTRIES:
            self._samples.popitem(last=False)
        rate = None
        if previous is not None and now > previous.at_s and committed >= previous.committed:
            elapsed = now - previous.at_s
            rate = Rate((committed - previous.committed) / elapsed, elapsed)
        return rate, list(samples)
