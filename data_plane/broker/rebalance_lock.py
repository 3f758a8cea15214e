"""RebalanceLockManager: which client holds each message queue of a consumer group, for
orderly consumption (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ). A lock not renewed within
``expiry_s`` (RocketMQ: 60 s) is free for another client; the holder renews it every 20 s."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

Queue = tuple[str, str, int]  # topic, broker name, queue id


class RebalanceLockManager:
    def __init__(self, *, expiry_s: float = 60.0, clock_s: Callable[[], float] = time.monotonic) -> None:
        self.expiry_s = expiry_s
        self.clock_s = clock_s
        self.locks: dict[str, dict[Queue, tuple[str, float]]] = {}

    def try_lock_batch(self, group: str, queues: Iterable[Queue], client_id: str) -> list[Queue]:
        """Lock (or renew) what is free or already ours; the queues now held by ``client_id``."""
        now = self.clock_s()
        table = self.locks.setdefault(group, {})
        held = []
        for q in queues:
            cur = table.get(q)
            if cur is None or cur[0] == client_id or now - cur[1] > self.expiry_s:
                table[q] = (client_id, now)
                held.append(q)
        return held

    def unlock_batch(self, group: str, queues: Iterable[Queue], client_id: str) -> None:
        table = self.locks.get(group)
        if not table:
            return
        for q in queues:
            cur = table.get(q)
            if cur is not None and cur[0] == client_id:
                del table[q]
        if not table:
            del self.locks[group]

    def holder(self, group: str, q: Queue) -> str | None:
        cur = self.locks.get(group, {}).get(q)
        if cur is None or self.clock_s() - cur[1] > self.expiry_s:
            return None
        return cur[0]
