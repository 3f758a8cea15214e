"""ConsumeQueue: the light per-(topic, queue id) index into the CommitLog.

    consumequeue/<topic>/<queue id>/<20-digit start byte offset>

Each file holds ``consume_queue_units_per_file`` (default 300,000) units of 20 bytes::

    +----------------------+---------------+------------------------+
    | CommitLog offset 8   | size 4        | tag hash code 8        |
    +----------------------+---------------+------------------------+

Unit ``n`` of the queue (its queue offset) sits at logical byte ``n * 20``. A unit is valid when
its offset is >= 0 and its size > 0; an all-zero unit marks the end. The tag hash code is Java's
``String.hashCode`` of the TAGS property, so broker-side filtering matches what stock clients
send in their subscription code sets (seed 7.4). Files are sparse; disk blocks are reserved a
chunk ahead of the writes.

A queue nobody has written or read for a while is *closed to idle* (``idle_queues.py``): its
files are flushed and unmapped, which also closes the descriptor each mapping holds, and the
queue keeps, in memory, its offsets and where each file's units end. Its min and max offsets
answer from memory; a single unit (``unit``: offset-by-time searches, retention, storage
accounting) is read with ``pread`` and leaves the queue closed; anything that appends or reads
units in bulk (a pull, POP, a redispatch) maps the same files again first (``reopen``), with the
positions they had, so no recovery scan is needed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

from data_plane.store.layouts import CQ_UNIT
from data_plane.store.mapped_file import MappedFile
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.positions import QueuePositions

CQ_UNIT_SIZE = CQ_UNIT.size
HOLE_UNIT = CQ_UNIT.pack(-1, 0, 0)  # a unit whose record is gone for good: readers skip it
# Reopening a closed queue maps files: one thread at a time (a reader on the event loop and an
# appender on another thread may both find a queue closed).
_REOPEN_LOCK = threading.Lock()


class ClosedFile:
    """What a closed queue remembers of one of its files: enough to map it again as it was."""

    __slots__ = ("file_from_offset", "path", "reserved_upto", "wrote_position")

    def __init__(self, mf: MappedFile) -> None:
        self.path = mf.path
        self.file_from_offset = mf.file_from_offset
        self.wrote_position = mf.wrote_position
        self.reserved_upto = mf.reserved_upto


def _reserve_chunk(pos: int) -> int:
    """Reserve ahead in proportion to what the file holds: 4 KiB for a new queue, up to 1 MiB
    for a busy one (10,000 queues must not reserve 10,000 MiB up front)."""
    return min(1 << 20, max(4096, pos))


class ConsumeQueue(QueuePositions):
    """One queue's units. The compiled appender may keep the newest few pending in the object
    (``positions.py``); every method here writes them to the file first (``sync_units``), so
    nothing that reads or changes the queue misses them."""

    __slots__ = (
        "_closed",
        "_closed_max",
        "_reserve_seen",
        "active_at_s",
        "file_size",
        "last_file",
        "mfq",
        "min_logic_offset",
        "queue_id",
        "seen_max",
        "topic",
        "touched",
    )

    def __init__(self, root: str, topic: str, queue_id: int, units_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = units_per_file * CQ_UNIT_SIZE
        self.mfq = MappedFileQueue(os.path.join(root, topic, str(queue_id)), self.file_size, keep_fd=False)
        self.max_physic_offset = -1  # end (offset + size) of the last record indexed
        self.min_logic_offset = 0
        self.last_file: MappedFile | None = None
        self._reserve_seen: tuple[MappedFile | None, int] = (None, 0)  # (file, position) at the last reserve_ahead
        # Closed to idle: the files' positions (None while open) and the max logic offset.
        self._closed: list[ClosedFile] | None = None
        self._closed_max = -1
        # The idle sweep's marks (idle_queues.py): a read of units since its last look, the max
        # offset it last saw, and when (store clock, seconds) it last saw the queue in use.
        self.touched = False
        self.seen_max = -1
        self.active_at_s = 0.0

    # --- positions -------------------------------------------------------------------------
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_UNIT_SIZE

    def max_offset_in_queue(self) -> int:
        if self._closed_max >= 0:
            return self._closed_max // CQ_UNIT_SIZE
        self.sync_units()
        return self.mfq.max_offset() // CQ_UNIT_SIZE

    # --- closing to idle and reopening -----------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed to idle: no file mapped, no descriptor held."""
        return self._closed is not None

    def detach_idle(self) -> list[MappedFile]:
        """Close the queue to idle: forget its mapped files (returned, still mapped, for the
        caller to ``close`` — on a worker thread) and keep their positions. Only with nothing
        pending and every unit flushed, and with no appender running (the caller holds the
        CommitLog lock); returns [] and leaves the queue open otherwise."""
        self.sync_units()
        files = self.mfq.files
        if self._closed is not None or not files or self.pending_units or self.dirty_pages():
            return []
        self._closed_max = self.mfq.max_offset()
        self._closed = [ClosedFile(mf) for mf in files]
        self.last_file = None
        self._reserve_seen = (None, 0)
        self.mfq.files = []
        return files

    def reopen(self) -> None:
        """Map a closed queue's files again, with the positions they had (every unit of them
        was flushed before they were unmapped). No-op when open. Raises OSError when a file
        cannot be mapped (the queue stays closed)."""
        with _REOPEN_LOCK:
            closed = self._closed
            if closed is None:
                return
            files: list[MappedFile] = []
            try:
                for cf in closed:
                    if os.stat(cf.path).st_size != self.file_size:  # (never made anew by the mapping)
                        raise OSError(f"{cf.path}: not the ConsumeQueue file that was closed")
                    mf = MappedFile(cf.path, self.file_size, reserve=False, keep_fd=False)
                    files.append(mf)
                    mf.set_positions(cf.wrote_position)
                    mf.reserved_upto = max(mf.reserved_upto, cf.reserved_upto)
            except BaseException:
                for mf in files:
                    mf.close()
                raise
            mfq = self.mfq
            mfq.flushed_where = self._closed_max  # (before the files: the flush thread reads both)
            mfq.files = files
            self.last_file = files[-1]
            self._closed = None
            self._closed_max = -1

    def _open(self) -> None:
        if self._closed is not None:
            self.reopen()

    @staticmethod
    def _read_closed_unit(closed: list[ClosedFile], logic: int) -> tuple[int, int, int] | None:
        """The unit at logical byte ``logic`` of a closed queue's files, read with ``pread``
        (the list given, not ``_closed``: a thread other than the loop's may find the queue
        reopened meanwhile, and the files are the same)."""
        for cf in closed:
            pos = logic - cf.file_from_offset
            if 0 <= pos < cf.wrote_position:
                fd = os.open(cf.path, os.O_RDONLY)
                try:
                    data = os.pread(fd, CQ_UNIT_SIZE, pos)
                finally:
                    os.close(fd)
                if len(data) < CQ_UNIT_SIZE:
                    return None
                off, size, tags = CQ_UNIT.unpack(data)
                return int(off), int(size), int(tags)
        return None

    # --- writing ---------------------------------------------------------------------------
    def reserve_ahead(self, rounds: float) -> bool:
        """Called once a flush round, off the writer's thread: when what stays reserved after
        the write position is less than ``rounds`` times what the queue took since the last
        call, reserve that much. True when blocks were reserved."""
        self.sync_units()
        mf = self.last_file
        if mf is None:
            return False
        seen_mf, seen_pos = self._reserve_seen
        pos = mf.wrote_position
        moved = pos - seen_pos if seen_mf is mf else pos
        self._reserve_seen = (mf, pos)
        want = min(mf.file_size, pos + int(moved * rounds))
        if moved <= 0 or want <= mf.reserved_upto:
            return False
        mf.ensure_reserved(want, _reserve_chunk(pos))
        return True

    def put(self, commit_log_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Write the unit for ``queue_offset``. Returns False when the unit was already there
        (a re-dispatch after recovery) and True when written. Raises OSError on a full disk."""
        if self._closed is not None:
            self.reopen()
        self.sync_units()
        expect = queue_offset * CQ_UNIT_SIZE
        mf = self.last_file
        if mf is not None:
            pos = mf.wrote_position
            if mf.file_from_offset + pos == expect and pos + CQ_UNIT_SIZE <= mf.file_size:
                if pos + CQ_UNIT_SIZE > mf.reserved_upto:
                    mf.ensure_reserved(pos + CQ_UNIT_SIZE, _reserve_chunk(pos))
                CQ_UNIT.pack_into(mf.mv, pos, commit_log_offset, size, tags_code)
                mf.wrote_position = mf.committed_position = pos + CQ_UNIT_SIZE
                self.max_physic_offset = commit_log_offset + size
                return True
        return self._put_slow(commit_log_offset, size, tags_code, expect)

    def put_units(self, units: bytes, queue_offset: int, end_offset: int) -> None:
        """Write consecutive units (as laid out by ``fastpath.write_batch``) starting at
        ``queue_offset``, for records ending by ``end_offset``: one copy when they fit."""
        if self._closed is not None:
            self.reopen()
        self.sync_units()
        n = len(units)
        if not n:
            return
        mf = self.last_file
        if mf is not None:
            pos = mf.wrote_position
            if mf.file_from_offset + pos == queue_offset * CQ_UNIT_SIZE and pos + n <= mf.file_size:
                if pos + n > mf.reserved_upto:
                    mf.ensure_reserved(pos + n, _reserve_chunk(pos))
                mf.mv[pos : pos + n] = units
                mf.wrote_position = mf.committed_position = pos + n
                self.max_physic_offset = end_offset
                return
        for i in range(n // CQ_UNIT_SIZE):
            off, size, tags = CQ_UNIT.unpack_from(units, i * CQ_UNIT_SIZE)
            self.put(off, size, tags, queue_offset + i)

    def _put_slow(self, commit_log_offset: int, size: int, tags_code: int, expect: int) -> bool:
        self._open()
        max_logic = self.mfq.max_offset()
        if not self.mfq.files:
            max_logic = expect
            self.min_logic_offset = expect
            mf = self.mfq.last_file_for_write(expect)
            if mf.wrote_position:
                # The queue starts mid-file (its history is gone, or a slave started late):
                # fill the file's head with holes so recovery reads it as a whole file.
                mf.ensure_reserved(mf.wrote_position, _reserve_chunk(mf.wrote_position))
                mf.mv[: mf.wrote_position] = HOLE_UNIT * (mf.wrote_position // CQ_UNIT_SIZE)
        if expect < max_logic:
            return False  # already indexed
        if expect > max_logic:
            # A gap: units between are lost forever (their log records are gone). Mark them as
            # holes so readers skip them, then continue.
            while self.mfq.max_offset() < expect:
                mf = self.mfq.last_file_for_write(expect)
                pos = mf.wrote_position
                mf.ensure_reserved(pos + CQ_UNIT_SIZE, _reserve_chunk(pos))
                CQ_UNIT.pack_into(mf.mv, pos, -1, 0, 0)
                mf.wrote_position = mf.committed_position = pos + CQ_UNIT_SIZE
        mf = self.mfq.last_file_for_write(expect)
        self.last_file = mf
        pos = mf.wrote_position
        mf.ensure_reserved(pos + CQ_UNIT_SIZE, _reserve_chunk(pos))
        CQ_UNIT.pack_into(mf.mv, pos, commit_log_offset, size, tags_code)
        mf.wrote_position = mf.committed_position = pos + CQ_UNIT_SIZE
        self.max_physic_offset = commit_log_offset + size
        return True

    # --- reading ---------------------------------------------------------------------------
    def units(self, queue_offset: int, max_units: int) -> tuple[memoryview, int] | None:
        """Up to ``max_units`` units from ``queue_offset`` as a slice of one file, with the
        count; None when the offset is outside the queue. A read: maps a closed queue again."""
        self.touched = True
        return self._units(queue_offset, max_units)

    def _units(self, queue_offset: int, max_units: int) -> tuple[memoryview, int] | None:
        """``units`` without marking the queue in use (maintenance reads)."""
        if self._closed is not None:
            self.reopen()
        self.sync_units()
        logic = queue_offset * CQ_UNIT_SIZE
        if logic < self.min_logic_offset:
            return None
        mf = self.mfq.find_by_offset(logic)
        if mf is None:
            return None
        pos = logic - mf.file_from_offset
        end = min(mf.wrote_position, pos + max_units * CQ_UNIT_SIZE)
        if end <= pos:
            return None
        return mf.mv[pos:end], (end - pos) // CQ_UNIT_SIZE

    def unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """One unit; read with ``pread`` from a closed queue, which stays closed."""
        closed = self._closed
        if closed is not None:
            logic = queue_offset * CQ_UNIT_SIZE
            return self._read_closed_unit(closed, logic) if logic >= self.min_logic_offset else None
        found = self._units(queue_offset, 1)
        if found is None:
            return None
        off, size, tags = CQ_UNIT.unpack_from(found[0], 0)
        return int(off), int(size), int(tags)

    def offsets_newest_first(self, floor: int) -> Iterator[int]:
        """The CommitLog offsets of this queue's records at or past ``floor``, newest first:
        read back from the queue's end, a few units at a time to begin with (a merge over many
        queues reads only the newest units of most), holes skipped."""
        hi = self.max_offset_in_queue()
        lo = self.min_offset_in_queue()
        per_file = self.file_size // CQ_UNIT_SIZE
        step = 8
        while hi > lo:
            start = max(lo, hi - step, (hi - 1) // per_file * per_file)  # (within one file)
            found = self._units(start, hi - start)
            if found is None:
                return
            view = found[0]
            try:
                offsets = [off for off, _size, _tags in CQ_UNIT.iter_unpack(view)]
            finally:
                view.release()
            for off in reversed(offsets):
                if off < floor:
                    if off == -1:
                        continue  # a hole
                    return
                yield off
            hi = start
            step = min(step * 4, 4096)

    def offset_by_time(self, timestamp_ms: int, store_timestamp_at: Callable[[int], int]) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (the
        max offset when none was). Binary search: store timestamps grow with log order."""
        lo = self.min_offset_in_queue()
        hi = self.max_offset_in_queue()
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            ts = store_timestamp_at(u[0]) if u is not None and u[0] >= 0 else -1
            if ts < 0:
                lo = mid + 1  # a removed or missing record: older than anything still there
            elif ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- recovery and cleanup --------------------------------------------------------------
    def load(self) -> None:
        self.mfq.load()

    def recover(self) -> None:
        """Find the last valid unit: every file but the last is full; scan the last ones."""
        self.sync_units()
        files = self.mfq.files
        self.max_physic_offset = -1
        if not files:
            return
        # Walk back over trailing files that hold no valid unit at all.
        while files:
            mf = files[-1]
            end = self._valid_end(mf)
            if end > 0 or len(files) == 1:
                mf.set_positions(end)
                break
            self.mfq.files.pop()
            mf.destroy()
        if files:
            last = files[-1]
            if last.wrote_position >= CQ_UNIT_SIZE:
                off, size, _ = CQ_UNIT.unpack_from(last.mv, last.wrote_position - CQ_UNIT_SIZE)
                if off >= 0:
                    self.max_physic_offset = off + size
            first = files[0]
            self.min_logic_offset = max(self.min_logic_offset, first.file_from_offset)
            self.mfq.flushed_where = self.mfq.max_offset()
        self.last_file = files[-1] if files else None

    @staticmethod
    def _valid_end(mf: MappedFile) -> int:
        mv = mf.mv
        unpack = CQ_UNIT.unpack_from
        pos = 0
        while pos + CQ_UNIT_SIZE <= mf.file_size:
            off, size, _ = unpack(mv, pos)
            if size <= 0 and off != -1:
                break
            pos += CQ_UNIT_SIZE
        return pos

    def truncate_dirty(self, phy_offset: int, *, torn_tail: bool = True) -> MappedFile | None:
        """Drop units that point at or past ``phy_offset`` (log bytes that did not survive).
        With ``torn_tail`` (recovery) the last file is zeroed from its last unit kept to its
        end, whatever a crash left there, and made durable; otherwise (a running store's cut,
        whose units are all known) only the units dropped are, through the mapping, and the
        file that holds them is returned, for the caller to ``sync`` — with a file all of whose
        units go deleted whole, the work is in proportion to the units dropped."""
        self.sync_units()
        self._open()
        zeroed: MappedFile | None = None
        files = self.mfq.files
        while files:
            mf = files[-1]
            pos = mf.wrote_position
            if len(files) > 1 and pos >= CQ_UNIT_SIZE:
                off, size, _ = CQ_UNIT.unpack_from(mf.mv, 0)
                if off != -1 and off + size > phy_offset:  # (units name ever later records)
                    pos = 0
            while pos >= CQ_UNIT_SIZE:
                off, size, _ = CQ_UNIT.unpack_from(mf.mv, pos - CQ_UNIT_SIZE)
                if off == -1 or off + size <= phy_offset:
                    break
                pos -= CQ_UNIT_SIZE
            if pos == 0 and mf.wrote_position > 0 and len(files) > 1:
                files.pop()
                mf.destroy()
                continue
            if pos < mf.wrote_position:
                if torn_tail:
                    mf.zero_from(pos)
                else:
                    mf.mv[pos : mf.wrote_position] = bytes(mf.wrote_position - pos)
                    zeroed = mf
                mf.set_positions(pos)
            break
        self.last_file = files[-1] if files else None
        self.max_physic_offset = -1
        if files and files[-1].wrote_position >= CQ_UNIT_SIZE:
            last = files[-1]
            off, size, _ = CQ_UNIT.unpack_from(last.mv, last.wrote_position - CQ_UNIT_SIZE)
            self.max_physic_offset = off + size
        self.mfq.flushed_where = min(self.mfq.flushed_where, self.mfq.max_offset())
        return zeroed

    def correct_min_offset(self, phy_min_offset: int) -> None:
        """After CommitLog files were deleted: the first unit whose record still exists (read
        with ``pread`` from a closed queue, which stays closed)."""
        self.sync_units()
        first = self.first_file_offset()
        if first is None:
            return
        lo = max(self.min_logic_offset, first) // CQ_UNIT_SIZE
        hi = self.max_offset_in_queue()
        while lo < hi:  # over every file: units point at ever larger CommitLog offsets
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[0] < phy_min_offset:
                lo = mid + 1
            else:
                hi = mid
        self.min_logic_offset = max(self.min_logic_offset, lo * CQ_UNIT_SIZE)

    def delete_expired_files(self, phy_min_offset: int) -> int:
        """Delete leading files whose every unit points below ``phy_min_offset`` (a closed queue
        is mapped again only when it has such a file)."""
        closed = self._closed
        if closed is not None:
            first = closed[0]
            u = self._read_closed_unit(closed, first.file_from_offset + first.wrote_position - CQ_UNIT_SIZE)
            if len(closed) < 2 or u is None or u[0] + u[1] > phy_min_offset:
                self.correct_min_offset(phy_min_offset)
                return 0
            self.reopen()
        self.sync_units()
        files = self.mfq.files
        count = 0
        for mf in files[:-1]:
            off, size, _ = CQ_UNIT.unpack_from(mf.mv, mf.file_size - CQ_UNIT_SIZE)
            if off + size <= phy_min_offset:
                count += 1
            else:
                break
        self.mfq.delete_first_files(count)
        self.correct_min_offset(phy_min_offset)
        return count

    def flush(self, least_pages: int) -> None:
        self.sync_units()
        self.mfq.flush(least_pages)

    def dirty_pages(self) -> int:
        """Pages written since the last flush (0 when clean)."""
        self.sync_units()
        mf = self.last_file
        if mf is None:
            return 0
        if self.mfq.flushed_where < mf.file_from_offset:
            return 1 + (mf.wrote_position // 4096)  # a whole earlier file is unflushed too
        if mf.wrote_position <= mf.flushed_position:
            return 0
        return (mf.wrote_position + 4095) // 4096 - mf.flushed_position // 4096

    def mark_flushed(self, where: int) -> None:
        """Everything below ``where`` was made durable by other means (sync(2))."""
        self.sync_units()
        for mf in self.mfq.files:
            if mf.file_from_offset < where:
                mf.flushed_position = max(mf.flushed_position, min(where - mf.file_from_offset, mf.wrote_position))
        self.mfq.flushed_where = max(self.mfq.flushed_where, where)

    def first_file_offset(self) -> int | None:
        """Where the first file starts (None without a file), open or closed."""
        closed = self._closed
        if closed is not None:
            return closed[0].file_from_offset
        files = self.mfq.files
        return files[0].file_from_offset if files else None

    def mapped_files(self) -> int:
        return len(self.mfq.files)

    def close(self) -> None:
        self.sync_units()
        self.mfq.close()
        self.last_file = None

    def destroy(self) -> None:
        self._open()
        self.sync_units()
        self.mfq.destroy()
        self.last_file = None
