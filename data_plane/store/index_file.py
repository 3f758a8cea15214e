"""IndexFile: a hash index from ``topic#key`` to CommitLog offsets, for queries by key.

    index/<20-digit creation time in ms>

    +-------------------------------- header, 40 bytes --------------------------------+
    | begin timestamp 8 | end timestamp 8 | begin phy offset 8 | end phy offset 8 |
    | hash slot count 4 | index count 4                                                |
    +----------------------------------------------------------------------------------+
    | slot table: hash_slots x 4 bytes — number of the newest entry in the slot, 0 = none |
    +----------------------------------------------------------------------------------+
    | entries: max_entries x 20 bytes (entry 0 is never used)                          |
    |   key hash 4 | phy offset 8 | time diff 4 (s since begin timestamp) | prev entry 4 |
    +----------------------------------------------------------------------------------+

Entries of one slot form a chain, newest first, through ``prev entry``. The key hash is CRC-32C
of the UTF-8 ``topic#key`` masked to 31 bits; collisions are settled by the reader, which checks
the key against the record itself. Each message is indexed under ``topic#<UNIQ_KEY>`` and under
``topic#<k>`` for each of its space-separated KEYS.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from crc32c import crc32c

from data_plane.store import fastpath
from data_plane.store.commit_log import DispatchRequest
from data_plane.store.layouts import HASH_SLOT, INDEX_ENTRY, INDEX_HEADER, INDEX_ITEM
from data_plane.store.mapped_file import MappedFile, is_data_file_name, offset_to_file_name
from data_plane.store.message import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

log = logging.getLogger(__name__)

INDEX_HEADER_SIZE = INDEX_HEADER.size
HASH_SLOT_SIZE = HASH_SLOT.size
INDEX_ENTRY_SIZE = INDEX_ENTRY.size


ENTRY_RESERVE_BYTES = 1 << 20


def key_hash(key: str) -> int:
    return crc32c(key.encode()) & 0x7FFFFFFF


def index_file_size(hash_slots: int, max_entries: int) -> int:
    return INDEX_HEADER_SIZE + hash_slots * HASH_SLOT_SIZE + max_entries * INDEX_ENTRY_SIZE


class IndexFile:
    __slots__ = (
        "_entries_at",
        "_released_upto",
        "_reserve_seen",
        "begin_phy_offset",
        "begin_timestamp",
        "end_phy_offset",
        "end_timestamp",
        "file_size",
        "hash_slots",
        "index_count",
        "max_entries",
        "mf",
    )

    def __init__(self, path: str, hash_slots: int, max_entries: int) -> None:
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.file_size = index_file_size(hash_slots, max_entries)
        is_new = not os.path.exists(path) or os.path.getsize(path) == 0
        self.mf = MappedFile(path, self.file_size, reserve=False)
        # Header and slot table are written at random: reserve them whole now; entries are
        # written in order and reserved a chunk ahead (ENTRY_RESERVE_BYTES).
        self._entries_at = INDEX_HEADER_SIZE + hash_slots * HASH_SLOT_SIZE
        if is_new:
            try:  # before the first read through the mapping: a hole read on a full disk is SIGBUS
                self.mf.ensure_reserved(self._entries_at + INDEX_ENTRY_SIZE * 2, ENTRY_RESERVE_BYTES)
            except OSError:
                self.mf.destroy()
                raise
        begin_ts, end_ts, begin_phy, end_phy, slots, count = INDEX_HEADER.unpack_from(self.mf.mv, 0)
        self.begin_timestamp: int = begin_ts
        self.end_timestamp: int = end_ts
        self.begin_phy_offset: int = begin_phy
        self.end_phy_offset: int = end_phy
        if slots not in (0, hash_slots):
            raise OSError(f"{path}: {slots} hash slots on disk, {hash_slots} configured")
        self.index_count: int = max(count, 1)
        self._reserve_seen = self.index_count  # the count at the last reserve_ahead
        self._released_upto = self._entries_at
        if not is_new:
            # Header and slots were reserved when the file was made; entries up to the count.
            self.mf.reserved_upto = self._entries_at + self.index_count * INDEX_ENTRY_SIZE
        self.end_phy_offset = max(self.end_phy_offset, -1) if count else -1

    @property
    def path(self) -> str:
        return self.mf.path

    def is_full(self) -> bool:
        return self.index_count >= self.max_entries

    def reserved_entries(self) -> int:
        """How many entries fit in the blocks reserved so far (``fastpath`` may fill them)."""
        return min(self.max_entries, (self.mf.reserved_upto - self._entries_at) // INDEX_ENTRY_SIZE)

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Add ``key`` → ``phy_offset``; False when the file is full."""
        count = self.index_count
        if count >= self.max_entries:
            return False
        entry_end = self._entries_at + (count + 1) * INDEX_ENTRY_SIZE
        if entry_end > self.mf.reserved_upto:
            self.mf.ensure_reserved(entry_end, ENTRY_RESERVE_BYTES)
        h = crc32c(key.encode()) & 0x7FFFFFFF
        mv = self.mf.mv
        slot_pos = INDEX_HEADER_SIZE + (h % self.hash_slots) * HASH_SLOT_SIZE
        (prev,) = HASH_SLOT.unpack_from(mv, slot_pos)
        if prev <= 0 or prev >= count:
            prev = 0
        if count == 1:
            self.begin_timestamp = store_timestamp
            self.begin_phy_offset = phy_offset
        diff = (store_timestamp - self.begin_timestamp) // 1000
        diff = min(max(diff, 0), 0x7FFFFFFF)
        INDEX_ENTRY.pack_into(mv, self._entries_at + count * INDEX_ENTRY_SIZE, h, phy_offset, diff, prev)
        HASH_SLOT.pack_into(mv, slot_pos, count)
        self.index_count = count + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        if count == 1:
            self.write_header()
        return True

    def write_header(self) -> None:
        INDEX_HEADER.pack_into(
            self.mf.mv,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slots,
            self.index_count,
        )

    def query(self, key: str, begin_ms: int, end_ms: int, max_num: int, out: list[int]) -> None:
        """Append to ``out`` the offsets stored under ``key`` in [begin_ms, end_ms], newest
        first, until ``out`` holds ``max_num``."""
        h = crc32c(key.encode()) & 0x7FFFFFFF
        mv = self.mf.mv
        count = self.index_count
        (idx,) = HASH_SLOT.unpack_from(mv, INDEX_HEADER_SIZE + (h % self.hash_slots) * HASH_SLOT_SIZE)
        steps = 0
        while 0 < idx < count and len(out) < max_num and steps < count:
            steps += 1
            eh, phy, diff, prev = INDEX_ENTRY.unpack_from(mv, self._entries_at + idx * INDEX_ENTRY_SIZE)
            ts = self.begin_timestamp + diff * 1000
            # ts is whole seconds after the file's begin: the entry was stored in [ts, ts + 999]
            if eh == h and ts <= end_ms and begin_ms <= ts + 999 and phy not in out:
                out.append(phy)
            if prev <= 0 or prev >= idx:
                break
            idx = prev

    def recover_count(self) -> None:
        """The header is written lazily: count the entries actually on disk."""
        mv = self.mf.mv
        idx = max(self.index_count, 1)
        while idx < self.max_entries:
            eh, phy, diff, prev = INDEX_ENTRY.unpack_from(mv, self._entries_at + idx * INDEX_ENTRY_SIZE)
            if eh == 0 and phy == 0 and diff == 0 and prev == 0:
                break
            self.end_phy_offset = phy
            self.end_timestamp = self.begin_timestamp + diff * 1000
            idx += 1
        self.index_count = idx
        self.mf.reserved_upto = max(self.mf.reserved_upto, self._entries_at + idx * INDEX_ENTRY_SIZE)

    def cut(self, phy_offset: int) -> None:
        """Drop, in place, the newest entries that name a record at or past ``phy_offset``
        (entries are in log order): newest first, each slot that names a dropped entry is given
        back that entry's predecessor, so every chain then starts at an entry kept; the dropped
        entries are zeroed. Work in proportion to the entries dropped."""
        mv = self.mf.mv
        count = self.index_count
        k = count
        while k > 1:
            h, phy, _diff, prev = INDEX_ENTRY.unpack_from(mv, self._entries_at + (k - 1) * INDEX_ENTRY_SIZE)
            if phy < phy_offset:
                break
            k -= 1  # (entry k goes)
            slot_pos = INDEX_HEADER_SIZE + (h % self.hash_slots) * HASH_SLOT_SIZE
            if HASH_SLOT.unpack_from(mv, slot_pos)[0] == k:
                HASH_SLOT.pack_into(mv, slot_pos, prev if 0 < prev < k else 0)
        if k == count:
            return
        start = self._entries_at + k * INDEX_ENTRY_SIZE
        mv[start : self._entries_at + count * INDEX_ENTRY_SIZE] = bytes((count - k) * INDEX_ENTRY_SIZE)
        self.index_count = k
        if k > 1:
            _h, phy, diff, _prev = INDEX_ENTRY.unpack_from(mv, start - INDEX_ENTRY_SIZE)
            self.end_phy_offset = phy
            self.end_timestamp = self.begin_timestamp + diff * 1000
        else:
            self.end_phy_offset = -1
            self.end_timestamp = self.begin_timestamp
        self.write_header()

    def flush(self) -> None:
        self.write_header()
        self.mf.committed_position = self.mf.wrote_position = self.file_size
        self.mf.flush(0)
        self.mf.flushed_position = 0  # slots are random access: flush the whole map next time

    def reserve_ahead(self, rounds: float) -> bool:
        """Called once a flush round, off the writer's thread: keep ``rounds`` times the entries
        added since the last call reserved after the newest (at least ENTRY_RESERVE_BYTES' worth
        once entries come). True when blocks were reserved."""
        count = self.index_count
        moved = count - self._reserve_seen
        self._reserve_seen = count
        if moved <= 0:
            return False
        at = self._entries_at + count * INDEX_ENTRY_SIZE
        want = min(self.file_size, at + max(int(moved * rounds) * INDEX_ENTRY_SIZE, ENTRY_RESERVE_BYTES))
        if want <= self.mf.reserved_upto:
            return False
        self.mf.ensure_reserved(want, ENTRY_RESERVE_BYTES)
        return True

    def release_entries(self, keep_bytes: int) -> None:
        """Drop written entry pages more than ``keep_bytes`` behind the newest entry (entries
        are written in order; the slot table stays resident: it is written at random)."""
        upto = self._entries_at + self.index_count * INDEX_ENTRY_SIZE - keep_bytes
        if upto - self._released_upto >= 1 << 20:
            self.mf.release_range(self._released_upto, upto)
            self._released_upto = upto

    def destroy(self) -> bool:
        return self.mf.destroy()

    def close(self) -> bool:
        self.write_header()
        return self.mf.close()


class IndexService:
    """All IndexFiles of the store, newest last; builds entries from dispatch requests."""

    __slots__ = ("_clock_ms", "_zombies", "directory", "files", "hash_slots", "max_entries")

    def __init__(self, directory: str, hash_slots: int, max_entries: int, *, clock_ms: Callable[[], int]) -> None:
        self.directory = directory
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self._clock_ms = clock_ms
        self.files: list[IndexFile] = []
        self._zombies: list[IndexFile] = []
        os.makedirs(directory, exist_ok=True)

    def load(self) -> None:
        for name in sorted(n for n in os.listdir(self.directory) if is_data_file_name(n)):
            path = os.path.join(self.directory, name)
            if os.path.getsize(path) != index_file_size(self.hash_slots, self.max_entries):
                log.warning("removing index file %s of another geometry; it will be rebuilt", path)
                os.unlink(path)
                continue
            f = IndexFile(path, self.hash_slots, self.max_entries)
            f.recover_count()
            self.files.append(f)

    def end_phy_offset(self) -> int:
        return self.files[-1].end_phy_offset if self.files else -1

    def begin_phy_offset(self) -> int:
        """The CommitLog offset of the first entry these files hold (-1: none)."""
        first = self.files[0] if self.files else None
        return first.begin_phy_offset if first is not None and first.index_count > 1 else -1

    def _writable(self) -> IndexFile:
        if self.files and not self.files[-1].is_full():
            return self.files[-1]
        stamp = self._clock_ms()
        if self.files:
            stamp = max(stamp, int(self.files[-1].mf.file_name) + 1)
        f = IndexFile(os.path.join(self.directory, offset_to_file_name(stamp)), self.hash_slots, self.max_entries)
        self.files.append(f)
        return f

    def build(self, req: DispatchRequest) -> None:
        if (req.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE:
            return
        f = self.files[-1] if self.files else self._writable()
        if req.commit_log_offset < f.end_phy_offset:
            return  # indexed before (re-dispatch after recovery)
        prefix = req.topic + "#"
        if req.uniq_key and not f.put_key(prefix + req.uniq_key, req.commit_log_offset, req.store_timestamp):
            f = self._writable()
            f.put_key(prefix + req.uniq_key, req.commit_log_offset, req.store_timestamp)
        if req.keys:
            for k in req.keys.split(" "):
                if k and not f.put_key(prefix + k, req.commit_log_offset, req.store_timestamp):
                    f = self._writable()
                    f.put_key(prefix + k, req.commit_log_offset, req.store_timestamp)

    def ensure_writable(self) -> IndexFile:
        """The file new entries go to, created if there is none or the last is full."""
        if self.files and not self.files[-1].is_full():
            return self.files[-1]
        return self._writable()

    def put_items(self, items: bytes, store_timestamp: int) -> None:
        """Add index items (``layouts.INDEX_ITEM``: key hash, CommitLog offset) of records
        stored at ``store_timestamp``, rolling over to a new file when one fills up."""
        n = len(items) // 12
        start = 0
        while start < n:
            f = self.files[-1] if self.files else self._writable()
            if f.index_count >= f.max_entries:
                f = self._writable()
            first = f.index_count == 1
            f.mf.ensure_reserved(f._entries_at + (f.index_count + n - start) * INDEX_ENTRY_SIZE, ENTRY_RESERVE_BYTES)
            if first:
                f.begin_timestamp = store_timestamp
                f.begin_phy_offset = INDEX_ITEM.unpack_from(items, start * 12)[1]
            written = fastpath.index_write(
                f.mf.mv,
                self.hash_slots,
                f.index_count,
                f.reserved_entries(),
                f.begin_timestamp,
                store_timestamp,
                items,
                start,
            )
            f.index_count, f.end_phy_offset = written.index_count, written.last_indexed
            start = written.next_item
            f.end_timestamp = store_timestamp
            if first:
                f.write_header()

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """CommitLog offsets indexed under ``topic#key`` in the time range, newest first."""
        out: list[int] = []
        full_key = f"{topic}#{key}"
        for f in reversed(self.files):
            if len(out) >= max_num:
                break
            if f.index_count <= 1:
                continue
            if f.end_timestamp + 1000 < begin_ms or f.begin_timestamp > end_ms + 1000:
                continue
            f.query(full_key, begin_ms, end_ms, max_num, out)
        return out

    def truncate_after(self, phy_offset: int) -> int:
        """Delete index files holding entries at or past ``phy_offset``; returns the log offset
        from which the index must be rebuilt (-1 when nothing was deleted)."""
        rebuild_from = -1
        while self.files and (self.files[-1].end_phy_offset >= phy_offset or self.files[-1].index_count <= 1):
            f = self.files.pop()
            rebuild_from = f.begin_phy_offset if f.index_count > 1 else rebuild_from
            if not f.destroy():
                self._zombies.append(f)
        return rebuild_from

    def cut(self, phy_offset: int) -> None:
        """A running store's cut (``MessageStore.cut_log``): drop every entry naming a record at
        or past ``phy_offset``, keeping the rest as it is — files wholly past it are deleted,
        the one it falls in is cut in place (``IndexFile.cut``) — so that nothing before it has
        to be indexed again. ``truncate_after`` (recovery) trusts less and rebuilds more."""
        gone: list[IndexFile] = []
        for f in reversed(self.files):
            if f.index_count <= 1:
                continue  # (an empty file: nothing in it to cut)
            if f.end_phy_offset < phy_offset:
                break
            if f.begin_phy_offset < phy_offset:
                f.cut(phy_offset)
                break
            gone.append(f)
        for f in gone:
            self.files.remove(f)
            if not f.destroy():
                self._zombies.append(f)

    def delete_expired(self, phy_min_offset: int) -> int:
        """Delete files all of whose entries point below ``phy_min_offset`` (never the last)."""
        n = 0
        while len(self.files) > 1 and self.files[0].end_phy_offset < phy_min_offset:
            f = self.files.pop(0)
            if not f.destroy():
                self._zombies.append(f)
            n += 1
        self._zombies = [f for f in self._zombies if not f.mf.close()]
        return n

    def flush(self) -> None:
        for f in self.files[-2:]:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            if not f.close():
                self._zombies.append(f)
        self.files = []
