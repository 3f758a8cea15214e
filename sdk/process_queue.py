"""ProcessQueue: one assigned queue's messages pulled but not yet consumed (RocketMQ's).

Messages are kept by queue offset. Consumption may finish out of order (a concurrent
listener), so the offset to commit is the lowest offset not yet consumed — a sliding window:
with 1..4 cached and 1, 2, 4 consumed, the commit offset is 3 (message 3 is redelivered after a
crash, 4 perhaps twice, none lost). When nothing is left it is the highest offset seen + 1.

Flow control reads ``count`` and ``size_bytes`` (and ``span`` for concurrent consumers); the pull
loop waits on ``wait_for_room`` while they are over the limits.

Orderly consumption takes messages out in offset order into a "consuming" set (``take``), then
either ``commit``s them or puts them back (``rollback``) to consume again.

Not thread-safe: everything runs on the consumer's event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import time

from sdk.aio import wait_event
from sdk.message import MessageExt

LOCK_MAX_LIVE_MS = 30000  # a broker lock not renewed for this long is not trusted for orderly consumption


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ProcessQueue:
    def __init__(self) -> None:
        self._msgs: dict[int, MessageExt] = {}
        # Offsets put, ascending, from index _head on; those no longer in _msgs are skipped
        # lazily. Pulls go on past what is cached, so a put is nearly always an append.
        self._order: list[int] = []
        self._head = 0
        self._consuming: dict[int, MessageExt] = {}  # orderly: taken, neither committed nor rolled back
        self.count = 0  # messages cached (consuming included)
        self.size_bytes = 0  # body bytes cached
        self.max_offset = -1  # highest queue offset ever put
        self.dropped = False
        self.locked = False
        self.last_lock_ms = 0
        self.last_pull_ms = 0
        self.last_consume_ms = 0
        self._room = asyncio.Event()
        self._room.set()
        self.limits: tuple[int, int, int] | None = None  # (count, bytes, span) for flow control

    # --- filling ---------------------------------------------------------------------------------
    def put(self, msgs: list[MessageExt]) -> int:
        """Add pulled messages; returns how many were new (an offset already cached is ignored)."""
        if msgs and msgs[0].queue_offset > self.max_offset:
            return self._put_ascending(msgs)
        return self._put_each(msgs)

    def _put_ascending(self, msgs: list[MessageExt]) -> int:
        """The usual put: a pull that goes on past everything cached. While the offsets keep
        rising they are appended to the order as they are; the rest, if any, goes the general way."""
        cache, order = self._msgs, self._order
        top = self.max_offset
        size = 0
        for i, m in enumerate(msgs):
            off = m.queue_offset
            if off <= top:
                self.count += i
                self.size_bytes += size
                self.max_offset = top
                return i + self._put_each(msgs[i:])
            cache[off] = m
            order.append(off)
            size += len(m.body)
            top = off
        self.count += len(msgs)
        self.size_bytes += size
        self.max_offset = top
        self._update_room()
        return len(msgs)

    def _put_each(self, msgs: list[MessageExt]) -> int:
        added = 0
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs or off in self._consuming:
                continue
            self._msgs[off] = m
            bisect.insort(self._order, off, lo=self._head)
            self.count += 1
            self.size_bytes += len(m.body)
            added += 1
            self.max_offset = max(self.max_offset, off)
        self._update_room()
        return added

    # --- concurrent consumption ---------------------------------------------------------------------
    def _first(self) -> int | None:
        order, msgs, head = self._order, self._msgs, self._head
        end = len(order)
        while head < end and order[head] not in msgs:
            head += 1
        if head > 1024 and head * 2 > end:  # drop the consumed front now and then, not each time
            del order[:head]
            head, end = 0, end - head
        self._head = head
        return order[head] if head < end else None

    def remove(self, msgs: list[MessageExt]) -> int:
        """Mark messages consumed; returns the offset to commit (lowest not consumed), or -1 when
        nothing was cached."""
        cache = self._msgs
        if not cache and not self._consuming:
            return -1
        pop = cache.pop
        n = size = 0
        for m in msgs:
            got = pop(m.queue_offset, None)
            if got is not None:
                n += 1
                size += len(got.body)
        self.count -= n
        self.size_bytes -= size
        self.last_consume_ms = monotonic_ms()
        self._update_room()
        return self.commit_offset()

    def commit_offset(self) -> int:
        """The lowest offset not yet consumed (cached or being consumed), or max offset + 1."""
        first = self._first()
        if self._consuming:
            taken = min(self._consuming)
            if first is None or taken < first:
                first = taken
        return first if first is not None else self.max_offset + 1

    @property
    def span(self) -> int:
        """Highest minus lowest cached offset (a stuck message makes this grow)."""
        first = self._first()
        return 0 if first is None else self.max_offset - first

    def messages(self) -> list[MessageExt]:
        """The cached messages not being consumed, by offset."""
        return [self._msgs[o] for o in sorted(self._msgs)]

    # --- orderly consumption --------------------------------------------------------------------------
    def take(self, n: int) -> list[MessageExt]:
        """Up to ``n`` messages with the lowest offsets, moved to the consuming set."""
        out: list[MessageExt] = []
        while len(out) < n:
            first = self._first()
            if first is None:
                break
            self._head += 1
            m = self._msgs.pop(first)
            self._consuming[first] = m
            out.append(m)
        if out:
            self.last_consume_ms = monotonic_ms()
        return out

    def commit(self) -> int:
        """The taken messages are consumed; returns the offset to commit (-1 if none were taken)."""
        if not self._consuming:
            return -1
        last = max(self._consuming)
        for m in self._consuming.values():
            self.count -= 1
            self.size_bytes -= len(m.body)
        self._consuming.clear()
        self._update_room()
        first = self._first()
        return first if first is not None else last + 1

    def rollback(self, msgs: list[MessageExt] | None = None) -> None:
        """Put taken messages back to be consumed again (all taken ones by default)."""
        back = list(self._consuming.values()) if msgs is None else msgs
        for m in back:
            if self._consuming.pop(m.queue_offset, None) is not None:
                self._msgs[m.queue_offset] = m
                bisect.insort(self._order, m.queue_offset, lo=self._head)

    @property
    def consuming(self) -> int:
        return len(self._consuming)

    def clear(self) -> None:
        self._msgs.clear()
        self._order.clear()
        self._head = 0
        self._consuming.clear()
        self.count = 0
        self.size_bytes = 0
        self._update_room()

    # --- locks (orderly, clustering) ----------------------------------------------------------------
    def lock_expired(self, now_ms: int | None = None) -> bool:
        return (now_ms if now_ms is not None else monotonic_ms()) - self.last_lock_ms > LOCK_MAX_LIVE_MS

    def can_consume_orderly(self, now_ms: int | None = None) -> bool:
        return self.locked and not self.lock_expired(now_ms)

    # --- flow control ---------------------------------------------------------------------------------
    def over_limits(self) -> str | None:
        """Why pulling should pause (cache too big), or None."""
        if self.limits is None or self.dropped:
            return None
        max_count, max_bytes, max_span = self.limits
        if self.count > max_count:
            return f"{self.count} messages cached, over {max_count}"
        if self.size_bytes > max_bytes:
            return f"{self.size_bytes} bytes cached, over {max_bytes}"
        if max_span > 0 and self.span > max_span:
            return f"offset span {self.span}, over {max_span}"
        return None

    def _update_room(self) -> None:
        if self.over_limits() is None:
            self._room.set()
        else:
            self._room.clear()

    async def wait_for_room(self, timeout_s: float) -> bool:
        """Wait until the cache is under its limits; False on timeout."""
        return await wait_event(self._room, timeout_s)

    def is_dropped(self) -> bool:
        """``dropped``, read afresh (after an await the queue may have been dropped)."""
        return self.dropped

    def drop(self) -> None:
        self.dropped = True
        self._room.set()
