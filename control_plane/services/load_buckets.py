"""Load buckets: brokers' load samples turned into time buckets of rates and backlogs.

Each broker reports a counter that only grows (a topic's ``appended`` messages, a group's
``committed`` offsets) and a gauge (a group's ``backlog``). Per broker the last sample of each
bucket is kept; the rate of a bucket is the counter's growth from the broker's previous kept
sample to this one over the time between them (brokers' clocks, so each broker's own; in the
broker's first bucket, from that bucket's first sample), and the gauge is the last value.
Buckets between two kept samples of a broker (a broker sends an idle item only every few
minutes) take that interval's rate and the earlier gauge. A counter that went back (a store
replaced) gives no rate for that interval. Brokers add up per bucket; a bucket no broker covers
has no figures (``None``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    broker: str
    at: dt.datetime
    counter: int
    gauge: int = 0


@dataclass(slots=True)
class Bucket:
    start: dt.datetime
    rate: float | None = None  # counter growth per second
    gauge: int | None = None


def step_for(span: dt.timedelta) -> dt.timedelta:
    """The bucket size for a range: whole minutes, about 120 buckets at most (1 h: 1 min; 1 day: 12 min)."""
    minutes = max(1, math.ceil(span.total_seconds() / 60 / 120))
    return dt.timedelta(minutes=minutes)


def bucket_starts(start: dt.datetime, end: dt.datetime, step: dt.timedelta) -> list[dt.datetime]:
    """Bucket starts aligned on ``step`` since the epoch, from the one holding ``start`` to before ``end``."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    first = epoch + ((start - epoch) // step) * step
    out = []
    t = first
    while t < end:
        out.append(t)
        t += step
    return out


def bucketize(samples: Iterable[Sample], starts: list[dt.datetime], step: dt.timedelta) -> list[Bucket]:
    """``samples`` (any order; those before the first bucket give the first one's baseline)."""
    buckets = [Bucket(s) for s in starts]
    if not starts:
        return buckets
    first = starts[0]
    by_broker: dict[str, dict[int, tuple[Sample, Sample]]] = defaultdict(dict)  # bucket -> (first, last)
    for s in samples:
        i = (s.at - first) // step if s.at >= first else -1
        if i >= len(starts):
            continue
        kept = by_broker[s.broker].get(i)
        if kept is None:
            by_broker[s.broker][i] = (s, s)
        else:
            by_broker[s.broker][i] = (min(kept[0], s, key=_at), max(kept[1], s, key=_at))
    for kept_by_index in by_broker.values():
        previous: tuple[int, Sample] | None = None
        for i in sorted(kept_by_index):
            earliest, s = kept_by_index[i]
            if previous is not None:
                j, p = previous
                for k in range(max(j + 1, 0), i + 1):
                    _add(buckets[k], _growth(p, s), s.gauge if k == i else p.gauge)
            elif i >= 0:  # the broker's first bucket: its own first sample is the baseline
                _add(buckets[i], _growth(earliest, s) if earliest.at < s.at else None, s.gauge)
            previous = (i, s)
    return buckets


def _at(s: Sample) -> dt.datetime:
    return s.at


def _growth(p: Sample, s: Sample) -> float | None:
    """The counter's growth per second from ``p`` to ``s`` (None: no time between, or it went back)."""
    elapsed = (s.at - p.at).total_seconds()
    return (s.counter - p.counter) / elapsed if elapsed > 0 and s.counter >= p.counter else None


def _add(b: Bucket, rate: float | None, gauge: int) -> None:
    if rate is not None:
        b.rate = (b.rate or 0.0) + rate
    b.gauge = (b.gauge or 0) + gauge


def totals(samples: Iterable[Sample], starts: list[dt.datetime], step: dt.timedelta) -> list[int]:
    """Per bucket, the sum of its samples' ``gauge`` (counts each sample holds since the previous one)."""
    out = [0] * len(starts)
    for s in samples:
        if starts and s.at >= starts[0] and (i := (s.at - starts[0]) // step) < len(starts):
            out[i] += s.gauge
    return out
