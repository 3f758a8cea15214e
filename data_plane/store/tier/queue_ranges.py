"""Which tiered file holds a queue's units: every indexed file's queue ranges (from the heads of
their index objects), by queue, for reads below what the local ConsumeQueue still holds.

The offloader's thread changes it and the loop reads it, so it is replaced, never changed in
place: a reader takes the map it finds, whole.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from data_plane.store.tier.file_index import UNIT_SIZE, IndexHead

QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Located:
    file_from: int  # the tiered file's CommitLog offset
    units_at: int  # where the asked-for unit is in the file's index object
    count: int  # units from there to the end of the range


@dataclass(frozen=True, slots=True)
class _Ranges:
    starts: tuple[int, ...]  # first queue offset of each range, ascending
    ranges: tuple[tuple[int, int, int, int, int], ...]  # (first, count, file_from, units_at, record bytes)


class TieredQueues:
    def __init__(self) -> None:
        self._by_queue: dict[QueueKey, _Ranges] = {}
        self._files: frozenset[int] = frozenset()

    def has(self, file_from: int) -> bool:
        return file_from in self._files

    def add(self, head: IndexHead) -> None:
        """Take a file's ranges (the offloader's thread)."""
        if head.from_offset in self._files:
            return
        grown: dict[QueueKey, list[tuple[int, int, int, int, int]]] = {}
        for r in head.ranges:
            grown.setdefault((r.topic, r.queue_id), []).append((r.first, r.count, head.from_offset, r.units_at, r.size))
        by_queue = dict(self._by_queue)
        for key, new in grown.items():
            old = by_queue.get(key)
            merged = sorted((*old.ranges, *new) if old is not None else new)
            by_queue[key] = _Ranges(tuple(r[0] for r in merged), tuple(merged))
        self._by_queue = by_queue
        self._files = self._files | {head.from_offset}

    def drop(self, files: set[int]) -> None:
        """Forget the ranges of files that left the tier."""
        if not files & self._files:
            return
        by_queue: dict[QueueKey, _Ranges] = {}
        for key, rs in self._by_queue.items():
            kept = tuple(r for r in rs.ranges if r[2] not in files)
            if kept:
                by_queue[key] = rs if len(kept) == len(rs.ranges) else _Ranges(tuple(r[0] for r in kept), kept)
        self._by_queue = by_queue
        self._files = self._files - files

    def first(self, topic: str, queue_id: int) -> int | None:
        """The queue's first tiered offset (None: the tier holds none of its units)."""
        rs = self._by_queue.get((topic, queue_id))
        return rs.starts[0] if rs is not None else None

    def find(self, topic: str, queue_id: int, offset: int) -> Located | int | None:
        """Where unit ``offset`` of the queue is: ``Located``; or, when it lies in no range, the
        next range's first offset (an int; a gap: the units there are gone); None past them all."""
        rs = self._by_queue.get((topic, queue_id))
        if rs is None:
            return None
        i = bisect.bisect_right(rs.starts, offset) - 1
        if i >= 0:
            first, count, file_from, units_at, _ = rs.ranges[i]
            if offset < first + count:
                return Located(file_from, units_at + (offset - first) * UNIT_SIZE, first + count - offset)
        return rs.starts[i + 1] if i + 1 < len(rs.starts) else None

    def bytes_below(self, topic: str, queue_id: int, offset: int) -> int:
        """The record bytes of the queue's tiered ranges that end at or before ``offset``."""
        rs = self._by_queue.get((topic, queue_id))
        return sum(r[4] for r in rs.ranges if r[0] + r[1] <= offset) if rs is not None else 0
