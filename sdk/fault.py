"""Latency-based fault tolerance for sends: RocketMQ's MQFaultStrategy and
LatencyFaultToleranceImpl.

After every send the producer reports the broker's latency (or a failure, reported as an
isolation). A slow or failed broker is "not available" for a while, by this table::

    latency ≥ (ms)           50   100   550     1000     2000     3000     15000
    not available for (ms)    0     0   30000   60000   120000   180000   600000

A failure counts as 30 000 ms of latency (so it is avoided for 600 s, RocketMQ's rule). Queue
selection walks the topic's write queues round-robin and takes the first whose broker is
available; when none is, it takes the least bad broker (``pick_one_at_least``) rather than fail.
The clock is injected (``clock_ms``), so tests drive time.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sdk.message import MessageQueue

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_LATENCY_MS = 30000

Clock = Callable[[], int]


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


_LIMITS_DESCENDING = tuple(zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_DURATION_MS), strict=True))


def not_available_duration_ms(latency_ms: int) -> int:
    """How long a broker with this latency is avoided."""
    for limit, duration in _LIMITS_DESCENDING:
        if latency_ms >= limit:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    broker_name: str
    latency_ms: int
    available_from_ms: int

    def available(self, now_ms: int) -> bool:
        return now_ms >= self.available_from_ms


def _available(item: FaultItem | None, now_ms: int) -> bool:
    return item is None or item.available(now_ms)


class LatencyFaultTolerance:
    """Broker name → its last latency and when it is available again."""

    def __init__(self, clock_ms: Clock | None = None) -> None:
        self.clock_ms = clock_ms or _monotonic_ms
        self.items: dict[str, FaultItem] = {}
        self._worst = itertools.count()

    def update(self, broker_name: str, latency_ms: int, not_available_ms: int) -> None:
        now = self.clock_ms()
        item = self.items.get(broker_name)
        if item is None:
            self.items[broker_name] = FaultItem(broker_name, latency_ms, now + not_available_ms)
        else:
            item.latency_ms = latency_ms
            item.available_from_ms = now + not_available_ms

    def is_available(self, broker_name: str) -> bool:
        item = self.items.get(broker_name)
        return item is None or item.available(self.clock_ms())

    def remove(self, broker_name: str) -> None:
        self.items.pop(broker_name, None)

    def pick_one_at_least(self, now_ms: int | None = None) -> str | None:
        """A broker to try when every broker is marked unavailable: among the better half
        (available first, then lower latency, then sooner available), in turn."""
        items = self.items
        if not items:
            return None
        if len(items) == 1:
            return next(iter(items.values())).broker_name  # the better half of one
        now = self.clock_ms() if now_ms is None else now_ms
        ranked = sorted(items.values(), key=lambda i: (not i.available(now), i.latency_ms, i.available_from_ms))
        half = max(1, len(ranked) // 2)
        return ranked[next(self._worst) % half].broker_name


class TopicPublishQueues:
    """A topic's write queues with its round-robin position (RocketMQ's TopicPublishInfo)."""

    __slots__ = ("_by_broker", "_next", "masters", "queues")

    def __init__(
        self, queues: Sequence[MessageQueue], start: int = 0, *, masters: dict[str, str] | None = None
    ) -> None:
        self.queues = list(queues)
        self._next = itertools.count(start)
        # Broker name → its master's address, from the same route as the queues (the send
        # path's look-up; empty when not given).
        self.masters: dict[str, str] = masters or {}
        self._by_broker: dict[str, list[MessageQueue]] | None = None

    def _grouped(self) -> dict[str, list[MessageQueue]]:
        by = self._by_broker
        if by is None:
            by = self._by_broker = {}
            for q in self.queues:
                by.setdefault(q.broker_name, []).append(q)
        return by

    def on_broker(self, broker_name: str) -> list[MessageQueue]:
        """The queues on ``broker_name``, in order (grouped once, when first asked)."""
        return self._grouped().get(broker_name, [])

    def brokers(self) -> Iterable[str]:
        """The brokers the queues are on."""
        return self._grouped().keys()

    def next_index(self) -> int:
        return next(self._next)

    def select(self, last_broker_name: str | None = None) -> MessageQueue:
        """The next queue round-robin, on a broker other than ``last_broker_name`` if there is one."""
        n = len(self.queues)
        if last_broker_name is not None:
            for _ in range(n):
                mq = self.queues[self.next_index() % n]
                if mq.broker_name != last_broker_name:
                    return mq
        return self.queues[self.next_index() % n]

    def write_queue_count(self, broker_name: str) -> int:
        return len(self.on_broker(broker_name))


class MQFaultStrategy:
    """Which queue a send goes to, avoiding brokers that were slow or failed."""

    def __init__(self, *, enabled: bool = True, clock_ms: Clock | None = None) -> None:
        self.enabled = enabled
        self.tolerance = LatencyFaultTolerance(clock_ms)

    def select(self, info: TopicPublishQueues, last_broker_name: str | None = None) -> MessageQueue:
        queues = info.queues
        if not self.tolerance.items and last_broker_name is None and queues:
            # Nothing marked and no broker to avoid (every send but a retry): plain round robin,
            # what the walk below would pick.
            return queues[info.next_index() % len(queues)]
        if not queues:
            raise ValueError("the topic has no write queues")
        if not self.enabled:
            return info.select(last_broker_name)
        # One clock reading for the walk (the send path runs it on every send while a broker
        # is marked: it must stay cheap exactly when a broker is slow).
        tolerance = self.tolerance
        items = tolerance.items
        now = tolerance.clock_ms()
        # Walk the queues only if some broker can take the send (brokers are a handful, queues
        # many: with the topic's only broker marked, every send would walk them all for nothing).
        takers = {b for b in info.brokers() if b != last_broker_name and _available(items.get(b), now)}
        if takers:
            n = len(queues)
            while True:  # the next queue round-robin on a broker that can take it (one exists)
                mq = queues[info.next_index() % n]
                if mq.broker_name in takers:
                    return mq
        # Every other broker is marked unavailable: fall back on the least bad one.
        best = tolerance.pick_one_at_least(now)
        if best is not None:
            on_best = info.on_broker(best)
            if on_best:
                return on_best[info.next_index() % len(on_best)]
            tolerance.remove(best)
        return info.select(last_broker_name)

    def update(self, broker_name: str, latency_ms: int, *, isolation: bool) -> None:
        """Report a send's outcome: its latency, or ``isolation`` for a failure."""
        if not self.enabled:
            return
        if not isolation and latency_ms < LATENCY_MAX_MS[2] and broker_name not in self.tolerance.items:
            return  # a fast answer from a broker never marked: nothing to remember (the common case)
        duration = not_available_duration_ms(ISOLATION_LATENCY_MS if isolation else latency_ms)
        self.tolerance.update(broker_name, latency_ms, duration)
