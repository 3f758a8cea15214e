"""A tiered CommitLog file's index: what a read needs to find the file's messages once the local
ConsumeQueues and IndexFiles no longer reach them. One object a file
(``<prefix>/<group>/index/<from offset>``), built by the offloader from the file's own records —
by the rules the dispatcher builds ConsumeQueue units and IndexFile entries by
(``CommitLog.check_record``) — and uploaded with the file.

    head   "OTIX", version, the file's offset and size, its oldest store time, counts and where
           each part starts; then each queue range (a queue's consecutive units in the file):
           topic, queue id, first queue offset, count, where its units start, the bytes of its
           records; then a fence every
           ``FENCE`` keys: the hash that begins each block of the key table
    units  20-byte ConsumeQueue units (CommitLog offset, size, tag hash), range after range
    keys   the hashes of every KEYS and UNIQ_KEY entry (``index_file.key_hash`` of "topic#key"),
           sorted, then the CommitLog offsets in the same order

A reader keeps the heads (a few dozen bytes a queue a file: ``TieredQueues``) and reads units and
key blocks by ranged GETs. Head and units always fit in the file's own size (a unit is smaller
than any record), so a cache can address them at the file's own CommitLog offsets.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass

from data_plane.store.commit_log import CommitLog, DispatchRequest, queue_offset_advances
from data_plane.store.index_file import key_hash
from data_plane.store.layouts import CQ_UNIT, MESSAGE_MAGIC_CODE, RECORD_HEADER
from data_plane.store.message import MAGIC_AND_SIZE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, RecordError

MAGIC = b"OTIX"
VERSION = 1
FENCE = 1024  # keys a block of the key table
HEAD = struct.Struct("<4sHHqqqIIIIqqq")
RANGE = struct.Struct("<iqIqq")  # queue id, first queue offset, count, where its units start, record bytes
TOPIC_LEN = struct.Struct("<H")
UNIT_SIZE = CQ_UNIT.size
_REC_HEAD = RECORD_HEADER.size


class IndexObjectError(ValueError):
    """An index object that is not one (wrong magic, version or lengths)."""


@dataclass(frozen=True, slots=True)
class QueueRange:
    topic: str
    queue_id: int
    first: int  # queue offset of the range's first unit
    count: int
    units_at: int  # where its units start in the object
    size: int  # the bytes of its records


@dataclass(frozen=True, slots=True)
class IndexHead:
    from_offset: int
    size: int  # the file's bytes it indexes
    oldest_ms: int
    ranges: tuple[QueueRange, ...]
    keys: int
    fences: tuple[int, ...]
    units_at: int  # head length: where units start
    keys_at: int  # where the key table starts (units end)
    end: int  # the object's length

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(sorted({r.topic for r in self.ranges}))

    def key_block(self, h: int) -> tuple[int, int] | None:
        """The entries ``[first, last)`` of the key table that may hold hash ``h`` (None: none)."""
        if not self.keys:
            return None
        hi = bisect.bisect_right(self.fences, h)  # blocks that begin at or below h
        if hi == 0:
            return None
        lo = max(0, bisect.bisect_left(self.fences, h) - 1)  # a run of h may begin a block earlier
        return lo * FENCE, min(hi * FENCE, self.keys)


@dataclass(slots=True)
class _Run:
    first: int
    count: int
    units: bytearray
    size: int


@dataclass(frozen=True, slots=True)
class BuiltIndex:
    data: bytes
    head: IndexHead


class _Builder:
    """What a file's records add to its index, record after record (the dispatcher's rules)."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, int], list[_Run]] = {}  # per queue, its runs of consecutive units
        self.hashes: list[int] = []
        self.phys: list[int] = []
        self.oldest = -1

    def add(self, req: DispatchRequest) -> None:
        if self.oldest < 0:
            self.oldest = req.store_timestamp
        if queue_offset_advances(req.sys_flag):
            queue = self.runs.setdefault((req.topic, req.queue_id), [])
            unit = CQ_UNIT.pack(req.commit_log_offset, req.size, req.tags_code)
            last = queue[-1] if queue else None
            if last is not None and last.first + last.count == req.queue_offset:
                last.count += 1
                last.units += unit
                last.size += req.size
            else:
                queue.append(_Run(req.queue_offset, 1, bytearray(unit), req.size))
        if (req.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE:
            return
        prefix = req.topic + "#"
        keys = [req.uniq_key] if req.uniq_key else []
        keys += [k for k in req.keys.split(" ") if k] if req.keys else []
        for k in keys:
            self.hashes.append(key_hash(prefix + k))
            self.phys.append(req.commit_log_offset)


def build_data(path: str, from_offset: int, length: int) -> bytes:
    """``build``'s object alone (what a process of its own hands back)."""
    return build(path, from_offset, length).data


def build(path: str, from_offset: int, length: int, window: int = 8 * 1024 * 1024) -> BuiltIndex:
    """The index of the first ``length`` bytes of the CommitLog file at ``path`` (which starts at
    ``from_offset``), read a window at a time with pread (the file is sealed). The offloader runs
    it in a process of its own (``build_data``): it parses every record."""
    b = _Builder()
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        buf = b""
        base = pos = 0
        while pos + _REC_HEAD <= length:
            rel = pos - base
            if rel + _REC_HEAD > len(buf):
                base, rel = pos, 0
                buf = os.pread(fd, min(window, length - pos), pos)
                if len(buf) < _REC_HEAD:
                    break
            total, magic = MAGIC_AND_SIZE.unpack_from(buf, rel)
            if magic != MESSAGE_MAGIC_CODE or total <= _REC_HEAD or pos + total > length:
                break  # the blank at a file's end, or where records stop
            if rel + total > len(buf):
                base, rel = pos, 0
                buf = os.pread(fd, min(max(window, total), length - pos), pos)
                if len(buf) < total:
                    break
            try:
                b.add(CommitLog.check_record(memoryview(buf), rel, total, from_offset + pos, False))
            except RecordError:
                break
            pos += total
    return encode(from_offset, pos, max(b.oldest, 0), b.runs, b.hashes, b.phys)


def encode(
    from_offset: int,
    size: int,
    oldest_ms: int,
    runs: dict[tuple[str, int], list[_Run]],
    hashes: list[int],
    phys: list[int],
) -> BuiltIndex:
    order = sorted(range(len(hashes)), key=hashes.__getitem__)  # stable: offsets stay in order per hash
    sorted_hashes = [hashes[i] for i in order]
    fences = sorted_hashes[::FENCE]
    flat = [(topic, qid, run) for (topic, qid), rs in sorted(runs.items()) for run in rs]
    table = bytearray()
    units = bytearray()
    entries: list[tuple[bytes, int, _Run, int]] = []
    for topic, qid, run in flat:
        entries.append((topic.encode(), qid, run, len(units)))
        units += run.units
    head_len = HEAD.size + sum(TOPIC_LEN.size + len(t) + RANGE.size for t, *_ in entries) + 4 * len(fences)
    ranges = []
    for t, qid, run, at in entries:
        table += TOPIC_LEN.pack(len(t)) + t + RANGE.pack(qid, run.first, run.count, head_len + at, run.size)
        ranges.append(QueueRange(t.decode(), qid, run.first, run.count, head_len + at, run.size))
    keys_at = head_len + len(units)
    n = len(sorted_hashes)
    end = keys_at + 12 * n
    head = HEAD.pack(MAGIC, VERSION, 0, from_offset, size, oldest_ms, len(ranges), n, FENCE, len(fences),
                     head_len, keys_at, end)  # fmt: skip
    data = b"".join(
        (head, table, struct.pack(f"<{len(fences)}I", *fences), units,
         struct.pack(f"<{n}I", *sorted_hashes), struct.pack(f"<{n}q", *(phys[i] for i in order)))
    )  # fmt: skip
    assert len(data) == end
    info = IndexHead(from_offset, size, oldest_ms, tuple(ranges), n, tuple(fences), head_len, keys_at, end)
    return BuiltIndex(data, info)


def parse_head(data: bytes | memoryview) -> IndexHead:
    """The head of an index object (its first ``units_at`` bytes, or more)."""
    if len(data) < HEAD.size:
        raise IndexObjectError(f"index head: {len(data)} bytes, fewer than {HEAD.size}")
    magic, version, _, from_offset, size, oldest, n_ranges, n_keys, fence, n_fences, units_at, keys_at, end = (
        HEAD.unpack_from(data, 0)
    )
    if magic != MAGIC or version != VERSION or fence != FENCE:
        raise IndexObjectError(f"not a tier index (magic {magic!r}, version {version}, fence {fence})")
    if not HEAD.size <= units_at <= keys_at <= end or len(data) < units_at or end != keys_at + 12 * n_keys:
        raise IndexObjectError(f"index head: inconsistent lengths ({units_at}, {keys_at}, {end}, {len(data)} read)")
    ranges = []
    at = HEAD.size
    try:
        for _ in range(n_ranges):
            (tlen,) = TOPIC_LEN.unpack_from(data, at)
            topic = bytes(data[at + 2 : at + 2 + tlen]).decode()
            at += 2 + tlen
            qid, first, count, units, nbytes = RANGE.unpack_from(data, at)
            at += RANGE.size
            if not units_at <= units <= units + count * UNIT_SIZE <= keys_at:
                raise IndexObjectError(f"index head: the units of {topic}/{qid} lie outside the units")
            ranges.append(QueueRange(topic, qid, first, count, units, nbytes))
        fences = struct.unpack_from(f"<{n_fences}I", data, at)
    except (struct.error, UnicodeDecodeError) as e:
        raise IndexObjectError(f"index head: {e}") from None
    if at + 4 * n_fences != units_at:
        raise IndexObjectError("index head: its length does not match its contents")
    return IndexHead(from_offset, size, oldest, tuple(ranges), n_keys, tuple(fences), units_at, keys_at, end)


def hashes_at(head: IndexHead, first: int) -> int:
    """Where key-table entry ``first``'s hash is in the object."""
    return head.keys_at + 4 * first


def offsets_at(head: IndexHead, first: int) -> int:
    """Where key-table entry ``first``'s CommitLog offset is in the object."""
    return head.keys_at + 4 * head.keys + 8 * first


def matching(hashes: bytes, h: int) -> tuple[int, int]:
    """The run ``[i, j)`` of a block of sorted little-endian hashes equal to ``h``."""
    values = struct.unpack(f"<{len(hashes) // 4}I", hashes)
    return bisect.bisect_left(values, h), bisect.bisect_right(values, h)
