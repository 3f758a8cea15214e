"""TimerLog: the timer wheel's append-only log of timer entries (RocketMQ 5's TimerLog).

    <store_dir>/timerlog/<20-digit index of the segment's first unit>

Every timed message stored under ``rmq_sys_wheel_timer`` gets one unit here, appended in the
order the messages were stored. The units of one wheel slot (one second) form a linked list
through ``prev``, newest first; the wheel (``timer_wheel.TimerWheel``) keeps only the newest
unit of each slot and the slot's count, so a tick reads exactly the units of the due slot.

Unit (32 bytes, big-endian)::

    +-------------+--------------------+-------------+---------------------+-----------+
    | slot second | CommitLog offset 8 | record size | prev unit index 8   | CRC-32C 4 |
    | 8 (epoch s) | of the timer record| 4           | (-1: first of slot) | of the 28 |
    +-------------+--------------------+-------------+---------------------+-----------+

Units are written with ``pwrite`` (a full disk is ENOSPC, never SIGBUS) and read with
``pread``. Segments hold ``units_per_segment`` units; a segment whose units all belong to
delivered slots is deleted as a whole (``delete_segments``). What is durable is decided by
the owner's checkpoint: ``load(end)`` drops every unit at or after ``end``.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

log = logging.getLogger(__name__)

UNIT = struct.Struct(">qqiqI")
assert UNIT.size == 32, UNIT.size
UNIT_SIZE = UNIT.size
_UNIT_BODY = struct.Struct(">qqiq")
assert _UNIT_BODY.size == 28
NO_PREV = -1
_READ_CHUNK_UNITS = 32_768


class TimerUnit(NamedTuple):
    slot_s: int
    phy_offset: int
    size: int
    prev: int


class TimerLogError(OSError):
    """A unit that cannot be read back (missing segment, bad CRC)."""


def encode_unit(slot_s: int, phy_offset: int, size: int, prev: int) -> bytes:
    body = _UNIT_BODY.pack(slot_s, phy_offset, size, prev)
    return body + struct.pack(">I", crc32c(body))


def decode_unit(raw: bytes | memoryview, pos: int = 0) -> TimerUnit:
    slot_s, phy, size, prev, crc = UNIT.unpack_from(raw, pos)
    if crc32c(bytes(raw[pos : pos + 28])) != crc:
        raise TimerLogError(errno.EIO, f"timer log unit CRC mismatch at byte {pos}")
    return TimerUnit(slot_s, phy, size, prev)


class _Segment:
    __slots__ = ("fd", "first", "max_slot_s", "path", "units")

    def __init__(self, path: str, first: int, fd: int, units: int) -> None:
        self.path = path
        self.first = first
        self.fd = fd
        self.units = units
        self.max_slot_s = -1  # the latest slot any unit of the segment belongs to


class TimerLog:
    def __init__(self, directory: str, *, units_per_segment: int) -> None:
        if units_per_segment < 1:
            raise ValueError("units_per_segment must be >= 1")
        self.directory = directory
        self.units_per_segment = units_per_segment
        self.segments: list[_Segment] = []
        self.end = 0  # index of the next unit to append
        self._dirty: set[int] = set()  # fds written since the last flush
        self._lock = threading.Lock()  # the dirty set and segment list: loop vs the flushing thread

    # --- life cycle ----------------------------------------------------------------------------
    def load(self, end: int) -> None:
        """Open every segment and keep exactly the units before ``end`` (the checkpoint's):
        later units — appended after the checkpoint, perhaps torn — are cut off. Raises
        TimerLogError when fewer than ``end`` units exist (the checkpoint is ahead of the files)."""
        os.makedirs(self.directory, exist_ok=True)
        names = sorted(n for n in os.listdir(self.directory) if n.isdigit() and len(n) == 20)
        per = self.units_per_segment
        for name in names:
            first = int(name)
            path = os.path.join(self.directory, name)
            if first >= end:
                os.unlink(path)
                continue
            fd = os.open(path, os.O_RDWR)
            keep = min(per, end - first)
            have = os.fstat(fd).st_size // UNIT_SIZE
            if have < keep:
                os.close(fd)
                raise TimerLogError(errno.EIO, f"timer log segment {path} holds {have} units, not {keep}")
            os.ftruncate(fd, keep * UNIT_SIZE)
            self.segments.append(_Segment(path, first, fd, keep))
        if self.segments:
            last = self.segments[-1]
            self.end = last.first + last.units
            if self.end != end:
                raise TimerLogError(errno.EIO, f"timer log ends at unit {self.end}, the checkpoint says {end}")
        else:
            # Nothing left (every segment delivered and deleted): the next unit keeps its index.
            self.end = end
        for a, b in zip(self.segments, self.segments[1:], strict=False):
            if a.first + a.units != b.first:
                raise TimerLogError(errno.EIO, f"timer log has a hole between {a.path} and {b.path}")

    def close(self) -> None:
        with self._lock:
            for s in self.segments:
                os.close(s.fd)
            self.segments.clear()
            self._dirty.clear()

    # --- writing -------------------------------------------------------------------------------
    def append(self, slot_s: int, phy_offset: int, size: int, prev: int) -> int:
        """Append a unit; returns its index. OSError (ENOSPC…) leaves the log unchanged."""
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.units >= self.units_per_segment:
            seg = self._new_segment(self.end)
        data = encode_unit(slot_s, phy_offset, size, prev)
        pos = seg.units * UNIT_SIZE
        n = os.pwrite(seg.fd, data, pos)
        if n != UNIT_SIZE:
            os.ftruncate(seg.fd, pos)
            raise OSError(errno.EIO, f"short write to the timer log ({n} of {UNIT_SIZE} bytes)")
        seg.units += 1
        seg.max_slot_s = max(seg.max_slot_s, slot_s)
        if seg.fd not in self._dirty:
            with self._lock:
                self._dirty.add(seg.fd)
        index = self.end
        self.end += 1
        return index

    def _new_segment(self, first: int) -> _Segment:
        path = os.path.join(self.directory, f"{first:020d}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg = _Segment(path, first, fd, 0)
        with self._lock:
            self.segments.append(seg)
        return seg

    def flush(self) -> None:
        """fdatasync what was appended since the last flush (a worker thread; never at the same
        time as ``delete_segments`` or ``close``, which the same owner calls after it)."""
        with self._lock:  # held only to swap the set: appends on the loop never wait for a sync
            fds, self._dirty = self._dirty, set()
        for fd in fds:
            try:
                os.fdatasync(fd)
            except OSError:
                with self._lock:
                    self._dirty.update(fds)
                raise

    # --- reading -------------------------------------------------------------------------------
    def _segment_of(self, index: int) -> _Segment:
        segs = self.segments
        if segs:
            i = (index - segs[0].first) // self.units_per_segment
            if 0 <= i < len(segs):
                s = segs[i]
                if s.first <= index < s.first + s.units:
                    return s
            for s in segs:  # segments of unequal length (never after load; cheap fallback)
                if s.first <= index < s.first + s.units:
                    return s
        raise TimerLogError(errno.ENOENT, f"timer log unit {index} is not in any segment")

    def read(self, index: int) -> TimerUnit:
        seg = self._segment_of(index)
        raw = os.pread(seg.fd, UNIT_SIZE, (index - seg.first) * UNIT_SIZE)
        if len(raw) != UNIT_SIZE:
            raise TimerLogError(errno.EIO, f"timer log unit {index} is truncated")
        return decode_unit(raw)

    def scan(self) -> Iterator[tuple[int, TimerUnit]]:
        """Every unit in order as ``(index, unit)``, also noting each segment's latest slot.
        A unit that fails its CRC is skipped with an error logged."""
        for seg in self.segments:
            seg.max_slot_s = -1
            done = 0
            while done < seg.units:
                n = min(_READ_CHUNK_UNITS, seg.units - done)
                raw = os.pread(seg.fd, n * UNIT_SIZE, done * UNIT_SIZE)
                for k in range(len(raw) // UNIT_SIZE):
                    index = seg.first + done + k
                    try:
                        unit = decode_unit(raw, k * UNIT_SIZE)
                    except TimerLogError:
                        log.error("timer log unit %d is corrupt; skipped", index)
                        continue
                    seg.max_slot_s = max(seg.max_slot_s, unit.slot_s)
                    yield index, unit
                done += n

    # --- deleting ------------------------------------------------------------------------------
    def delete_segments(self, delivered_before_s: int) -> int:
        """Delete leading segments whose every unit belongs to a slot before
        ``delivered_before_s`` (the last segment, being written, stays). Returns how many."""
        deleted = 0
        with self._lock:
            while len(self.segments) > 1 and self.segments[0].max_slot_s < delivered_before_s:
                seg = self.segments.pop(0)
                self._dirty.discard(seg.fd)
                os.close(seg.fd)
                try:
                    os.unlink(seg.path)
                except OSError as e:
                    log.warning("cannot delete timer log segment %s: %s", seg.path, e)
                deleted += 1
        return deleted

    @property
    def first(self) -> int:
        return self.segments[0].first if self.segments else self.end
