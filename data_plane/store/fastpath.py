"""The store's per-message loops (the write path's, and the pull read's), in pure Python, and
the switch to their compiled twin.

``write_batch`` lays out a batch of messages of one (topic, queue id) as CommitLog records and
returns, with them, the ConsumeQueue units and the index items they need::

    cq_units:    n x [CommitLog offset 8 | size 4 | tag hash 8]        (consume_queue.CQ_UNIT)
    index_items: k x [key hash 4 | CommitLog offset 8]                 (INDEX_ITEM)

where the key hash is CRC-32C of ``topic#key`` masked to 31 bits, for the UNIQ_KEY and each of
the KEYS of every message (rolled-back transaction records are not indexed). ``index_write``
adds index items to an IndexFile mapping (layout in index_file.py) and returns an
``IndexWritten``: ``(index_count, next_item, last_indexed)``, the file's new entry count, the
first item not added, and the CommitLog offset of the last item added (-1 if none was).

Given a ConsumeQueue target (its mapping, the write position, the end of the reserved
blocks) and an IndexFile target (mapping, slots, entry count, max entries, begin timestamp),
``write_batch`` also writes the units and index entries straight into them when they fit, and
returns the new CQ position / entry count in place of the bytes; otherwise the caller writes
the bytes it gets back.

Given a file descriptor (``fd``, ``fd_offset``), ``buf`` is a staging buffer: the records laid
out in it are written to the file with ``pwrite`` — before the ConsumeQueue and IndexFile
targets are touched, so an ``OSError`` from the file leaves nothing pointing at them.

``batch_ids`` gives the message ids of a batch's records from the bytes laid out for them.

``collect_units`` is the pull read's loop: ConsumeQueue units to memoryview slices of one
CommitLog file (see its docstring); ``MessageStore.get_message`` handles what it stops at. It
returns a ``UnitsCollected``: ``(next_unit, total_bytes, last_phy_offset, full)``.

``_speedups.c`` implements these functions byte for byte; it is used when it was built and
``ORBIT_PURE_PYTHON`` is not set. Tests run both and compare their output.

``msgs`` is a list of store Messages, or — the broker's SEND_BATCH_MESSAGE path — a *plain*
batch body with what its messages share, ``(body, sys_flag, born_timestamp, born_host,
reconsume_times, max_messages, skip_names)``: every item well formed, its properties ASCII
``name\x01value\x02`` pairs (each terminated, no name empty, repeated or in ``skip_names``, no
value holding ``\x01``), i.e. exactly the bytes the store would write for them. Its records are
then laid out from the body's bytes, with no Message objects; a body that is not plain is
answered None and the caller splits it into Messages (the reference path). ``plain_batch``
says beforehand whether a body is plain, and its message count and body bytes (for quotas): a
``PlainCounts``, ``(msg_count, body_bytes)``, or None; ``plain_properties`` whether one
message's encoded properties are (the broker's single-send path asks before it takes a publish
quota; ``MessageStore.append_plain`` stores such a message).

Return values of ``write_batch`` (``outcome`` first; the classes are below)::

    LaidOut(0, written, next_queue_offset, first_queue_offset, cq_units, index_items,
            last_indexed, msg_count, tag_codes)                                  written
    NeedsRoom(1, need)                                                           does not fit
    Refused(2, msg_index, status, reason)                                        refused
    None                                                                         not a plain body

``tag_codes``: a plain body's distinct tag hash codes in order of first appearance (None for a
list of Messages).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from crc32c import crc32c

from data_plane.store.compiled import speedups
from data_plane.store.layouts import CQ_UNIT as _CQ_UNIT
from data_plane.store.layouts import HASH_SLOT as _SLOT
from data_plane.store.layouts import INDEX_ENTRY as _INDEX_ENTRY
from data_plane.store.layouts import INDEX_ITEM
from data_plane.store.mapped_file import pwrite_fully
from data_plane.store.message import (
    MESSAGE_MAGIC_CODE,
    RECORD_HEADER,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    tags_hash_code,
)

if TYPE_CHECKING:
    from data_plane.store import _speedups as _compiled  # the stub: its result classes

_HEADER = RECORD_HEADER.size


PlainBatch = tuple[bytes | memoryview, int, int, bytes, int, int, tuple[bytes, ...]]
_BATCH_ITEM = struct.Struct(">iiiii")  # total, magic, body CRC, flag, body length


def _plain_properties(raw: bytes, skip: tuple[bytes, ...]) -> dict[str, str] | None:
    """Encoded properties as a dict when they are plain (module docstring), else None."""
    if not raw.isascii() or (raw and not raw.endswith(b"\x02")):
        return None
    props: dict[str, str] = {}
    for pair in raw[:-1].split(b"\x02") if raw else ():
        name, sep, value = pair.partition(b"\x01")
        if not sep or not name or b"\x01" in value or name in skip or name.decode() in props:
            return None
        props[name.decode()] = value.decode()
    if len(props) > 32:
        return None
    return props


def py_plain_properties(properties: str | bytes, skip: tuple[bytes, ...]) -> bool:
    """Whether a message's encoded properties (a header's text, or bytes) are plain."""
    if isinstance(properties, str):
        if not properties.isascii():
            return False
        properties = properties.encode()
    return _plain_properties(properties, skip) is not None


def py_plain_items(
    body: bytes | memoryview, max_messages: int, skip: tuple[bytes, ...]
) -> list[tuple[int, bytes, dict[str, str]]] | None:
    """The items of a plain batch body (module docstring) as (flag, body, properties), or None
    when it is not plain."""
    mv = memoryview(body)
    n, pos = len(mv), 0
    out: list[tuple[int, bytes, dict[str, str]]] = []
    while pos < n:
        if n - pos < 22 or len(out) >= max_messages:
            return None
        total, _magic, _crc, flag, body_len = _BATCH_ITEM.unpack_from(mv, pos)
        if total < 22 or total > n - pos or body_len < 0 or 22 + body_len > total:
            return None
        plen = int.from_bytes(mv[pos + 20 + body_len : pos + 22 + body_len], "big")
        if 22 + body_len + plen != total:
            return None
        props = _plain_properties(bytes(mv[pos + 22 + body_len : pos + total]), skip)
        if props is None:
            return None
        out.append((flag, bytes(mv[pos + 20 : pos + 20 + body_len]), props))
        pos += total
    return out or None


# The answers of plain_batch, index_write and collect_units, as write_batch's below: the
# compiled twin's are struct sequences of the same names and fields, in the same order (equal
# as tuples, unpacked alike, read by name).
class PlainCounts(NamedTuple):
    """What a quota counts of a plain batch body (``plain_batch``)."""

    msg_count: int  # the body's messages
    body_bytes: int  # the bytes of their bodies


def py_plain_batch(body: bytes | memoryview, max_messages: int, skip: tuple[bytes, ...]) -> PlainCounts | None:
    """The message count and body bytes of a plain batch body, or None when it is not plain."""
    items = py_plain_items(body, max_messages, skip)
    if items is None:
        return None
    return PlainCounts(len(items), sum(len(b) for _, b, _ in items))


# write_batch's answers (the compiled twin's are struct sequences of the same names and fields:
# equal as tuples, read by name). ``outcome`` comes first in each; a plain batch body that is
# not plain is answered None.
LAID_OUT, NEEDS_ROOM, REFUSED = 0, 1, 2


class LaidOut(NamedTuple):
    outcome: int  # LAID_OUT
    written: int  # bytes laid out from pos
    next_queue_offset: int
    first_queue_offset: int
    cq_units: Any  # the units not written into cq_target (bytes), else its new position
    index_items: Any  # the index items (bytes), or the IndexFile's new count when written into ix_target
    last_indexed: int  # CommitLog offset of the last record written into the IndexFile, else -1
    msg_count: int
    tag_codes: tuple[int, ...] | None  # a plain batch's distinct tag hash codes


class NeedsRoom(NamedTuple):
    outcome: int  # NEEDS_ROOM
    need: int  # bytes the batch needs


class Refused(NamedTuple):
    outcome: int  # REFUSED
    msg_index: int  # the refused message's index in the batch
    status: str  # a PutMessageStatus name
    reason: str


WriteBatchAnswer = LaidOut | NeedsRoom | Refused | None


def py_write_batch(
    buf: memoryview,
    pos: int,
    limit: int,
    file_from: int,
    msgs: list[Message] | PlainBatch,
    topic_b: bytes,
    queue_id: int,
    first_qo: int,
    store_ts: int,
    store_host: bytes,
    max_props: int,
    max_msg: int,
    index_enabled: bool,
    cq_target: memoryview | None = None,
    cq_pos: int = 0,
    cq_limit: int = 0,
    ix_target: memoryview | None = None,
    ix_slots: int = 0,
    ix_count: int = 0,
    ix_max: int = 0,
    ix_begin_ts: int = 0,
    fd: int = -1,
    fd_offset: int = 0,
) -> WriteBatchAnswer:
    plain = False
    if isinstance(msgs, tuple):
        plain = True
        body_in, sys_flag, born_ts, born_host, reconsume, max_messages, skip = msgs
        if len(born_host) != 8:
            raise ValueError("born_host must be 8 bytes")
        items = py_plain_items(body_in, max_messages, skip)
        if items is None:
            return None
        topic = topic_b.decode()
        msgs = [Message(topic, b, queue_id, f, p, sys_flag, born_ts, born_host, reconsume) for f, b, p in items]
    encoded: list[tuple[Message, bytes, int]] = []
    need = 0
    for i, m in enumerate(msgs):
        if not m.body:
            return Refused(REFUSED, i, "MESSAGE_ILLEGAL", "message body is empty")
        if len(m.born_host) != 8:
            return Refused(REFUSED, i, "MESSAGE_ILLEGAL", "born_host must be 8 bytes")
        if not all(-(2**31) <= v < 2**31 for v in (m.flag, m.sys_flag, m.reconsume_times)):
            return Refused(REFUSED, i, "MESSAGE_ILLEGAL", "a 4-byte field is out of range")
        parts = []
        properties: dict[object, object] = m.properties  # type: ignore[assignment]
        for k, v in properties.items():
            if not isinstance(k, str) or not isinstance(v, str):
                return Refused(REFUSED, i, "MESSAGE_ILLEGAL", "property names and values must be strings")
            if not k or "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
                return Refused(
                    REFUSED,
                    i,
                    "MESSAGE_ILLEGAL",
                    f"property {k!r} is empty or holds a reserved separator character (\\x01 or \\x02)",
                )
            parts.append(f"{k}\x01{v}\x02")
        try:
            props = "".join(parts).encode()
        except UnicodeEncodeError:
            return Refused(REFUSED, i, "MESSAGE_ILLEGAL", "properties are not valid text")
        if len(props) > max_props:
            return Refused(
                REFUSED, i, "PROPERTIES_SIZE_EXCEEDED", f"properties take {len(props)} bytes, more than {max_props}"
            )
        total = _HEADER + len(m.body) + 1 + len(topic_b) + 2 + len(props)
        if total > max_msg:
            return Refused(
                REFUSED, i, "MESSAGE_ILLEGAL", f"message takes {total} bytes, more than the {max_msg} allowed"
            )
        encoded.append((m, props, total))
        need += total
    if pos + need > limit:
        return NeedsRoom(NEEDS_ROOM, need)
    cq = bytearray()
    idx = bytearray()
    qo = first_qo
    batch_first_qo = -1
    prefix = topic_b + b"#"
    start_pos = pos
    for m, props, total in encoded:
        phys = file_from + pos
        tran = m.sys_flag & TRANSACTION_TYPE_MASK
        advances = tran in (0, TRANSACTION_COMMIT_TYPE)
        my_qo = qo if advances else 0
        if advances:
            qo += 1
        if batch_first_qo < 0:
            batch_first_qo = my_qo
        body = m.body
        RECORD_HEADER.pack_into(
            buf,
            pos,
            total,
            MESSAGE_MAGIC_CODE,
            crc32c(body) & 0x7FFFFFFF,
            queue_id,
            m.flag,
            my_qo,
            phys,
            m.sys_flag,
            m.born_timestamp,
            m.born_host,
            store_ts,
            store_host,
            m.reconsume_times,
            m.prepared_transaction_offset,
            len(body),
        )
        p = pos + _HEADER
        buf[p : p + len(body)] = body
        p += len(body)
        buf[p] = len(topic_b)
        buf[p + 1 : p + 1 + len(topic_b)] = topic_b
        p += 1 + len(topic_b)
        buf[p : p + 2] = len(props).to_bytes(2, "big")
        buf[p + 2 : p + 2 + len(props)] = props
        tags = m.properties.get("TAGS")
        if advances:
            cq += _CQ_UNIT.pack(phys, total, tags_hash_code(tags) if tags else 0)
        if index_enabled and tran != TRANSACTION_ROLLBACK_TYPE:
            uniq = m.properties.get("UNIQ_KEY")
            if uniq:
                idx += INDEX_ITEM.pack(crc32c(prefix + uniq.encode()) & 0x7FFFFFFF, phys)
            keys = m.properties.get("KEYS")
            if keys:
                for k in keys.split(" "):
                    if k:
                        idx += INDEX_ITEM.pack(crc32c(prefix + k.encode()) & 0x7FFFFFFF, phys)
        pos += total
    if fd >= 0:  # records to the file before any index entry names them
        pwrite_fully(fd, buf[start_pos:pos], fd_offset)
    cq_out: bytes | int = bytes(cq)
    idx_out: bytes | int = bytes(idx)
    last_ix = -1
    if cq_target is not None and cq and cq_pos >= 0 and cq_pos + len(cq) <= cq_limit <= len(cq_target):
        cq_target[cq_pos : cq_pos + len(cq)] = cq
        cq_out = cq_pos + len(cq)
    nix = len(idx) // 12
    if ix_target is not None and nix and ix_slots > 0 and ix_count > 1 and ix_count + nix <= ix_max:
        written = py_index_write(ix_target, ix_slots, ix_count, ix_max, ix_begin_ts, store_ts, bytes(idx), 0)
        idx_out, last_ix = written.index_count, written.last_indexed
    tag_codes = None
    if plain:
        distinct = {tags_hash_code(t) if t else 0: None for t in (m.properties.get("TAGS") for m in msgs)}
        tag_codes = tuple(distinct)
    return LaidOut(LAID_OUT, pos, qo, max(batch_first_qo, 0), cq_out, idx_out, last_ix, len(msgs), tag_codes)


class IndexWritten(NamedTuple):
    """What ``index_write`` added to an IndexFile."""

    index_count: int  # the file's entry count after it (entry 0 is never used)
    next_item: int  # the first item not added: len(items) // 12 when all were
    last_indexed: int  # CommitLog offset of the last item added, -1 when none was


def py_index_write(
    buf: memoryview,
    slots: int,
    count: int,
    max_entries: int,
    begin_ts: int,
    store_ts: int,
    items: bytes,
    start: int,
) -> IndexWritten:
    """Adds the 12-byte items from index ``start`` on to the IndexFile mapping ``buf`` (``slots``
    hash slots, ``count`` entries of at most ``max_entries``) until they run out or it is full."""
    entries_at = 40 + slots * 4
    last_phys = -1
    diff = 0 if store_ts < begin_ts else min((store_ts - begin_ts) // 1000, 0x7FFFFFFF)
    n = len(items) // 12
    i = start
    while i < n and count < max_entries:
        h, phys = INDEX_ITEM.unpack_from(items, i * 12)
        slot_pos = 40 + (h % slots) * 4
        (prev,) = _SLOT.unpack_from(buf, slot_pos)
        if prev <= 0 or prev >= count:
            prev = 0
        _INDEX_ENTRY.pack_into(buf, entries_at + count * 20, h, phys, diff, prev)
        _SLOT.pack_into(buf, slot_pos, count)
        count += 1
        i += 1
        last_phys = phys
    return IndexWritten(count, i, last_phys)


class UnitsCollected(NamedTuple):
    """Where ``collect_units`` stopped."""

    next_unit: int  # the unit not taken (n when the units ran out): the next call starts there
    total_bytes: int  # the pull's bytes so far, those taken by this call included
    last_phy_offset: int  # CommitLog offset of the last record taken, 0 when none was
    full: int  # 1 when the pull is full (max messages or bytes), else 0


def py_collect_units(
    units: Any,
    i: int,
    n: int,
    cur: memoryview | None,
    cur_from: int,
    cur_end: int,
    log_min: int,
    max_nums: int,
    max_bytes: int,
    total_bytes: int,
    tags_codes: Any,
    messages: list[memoryview],
    queue_offsets: list[int],
    first_queue_offset: int,
    coalesce: bool = False,
) -> UnitsCollected:
    """The pull read's loop: ConsumeQueue units from index ``i`` to record slices of ``cur``
    (the mapping of the CommitLog file [cur_from, cur_end)), each appended with its queue
    offset. With ``coalesce``, records that follow each other in the file go out as one slice
    (a batch sent to one queue is stored back to back); the message count is
    ``len(queue_offsets)`` either way. Stops, the unit at ``i`` not taken, when the pull is full
    (``full`` = 1), when the units run out, or at a unit the caller must look at itself:
    removed, in another file, cut short. Returns a ``UnitsCollected``: ``(next_unit,
    total_bytes, last_phy_offset, full)``; ``last_phy_offset`` is 0 when nothing was taken."""
    if cur is None:
        cur_end = cur_from
    unpack = _CQ_UNIT.unpack_from
    last_phy = 0
    full = 0
    run_at = run_end = -1  # the slice not yet appended: [run_at, run_end) of cur
    while i < n:
        phy, size, tags = unpack(units, i * 20)
        if queue_offsets and (len(queue_offsets) >= max_nums or total_bytes + size > max_bytes):
            full = 1
            break
        if phy < log_min or size <= 0 or not cur_from <= phy < cur_end or phy + size > cur_end:
            break
        if tags_codes is None or tags in tags_codes:
            assert cur is not None
            at = phy - cur_from
            if coalesce and run_at >= 0 and at == run_end:
                run_end = at + size
            else:
                if run_at >= 0:
                    messages.append(cur[run_at:run_end])
                run_at, run_end = at, at + size
            queue_offsets.append(first_queue_offset + i)
            total_bytes += size
            last_phy = phy
        i += 1
    if run_at >= 0:
        assert cur is not None
        messages.append(cur[run_at:run_end])
    return UnitsCollected(i, total_bytes, last_phy, full)


_TOTAL_SIZE = struct.Struct(">i")


def py_batch_ids(buf: Any, file_from: int, offset: int, n: int, prefix: str) -> str | None:
    """The message ids (``prefix``, the store host in hex, then the CommitLog offset as 16 hex
    digits), comma-joined, of the ``n`` records lying back to back from CommitLog ``offset`` in
    ``buf``, which holds the log from ``file_from`` on. None when a record runs out of ``buf``."""
    unpack = _TOTAL_SIZE.unpack_from
    ids = []
    for _ in range(n):
        at = offset - file_from
        if at < 0 or at + 4 > len(buf):
            return None
        size = unpack(buf, at)[0]
        if size <= 0:
            return None
        ids.append(prefix + format(offset, "016X"))
        offset += size
    return ",".join(ids)


WriteBatch = Callable[..., Any]  # (LaidOut, NeedsRoom, Refused or None; the twins differ in class)
# The others' answers: each twin's class (the same fields, read by name).
IndexWrite = Callable[..., "IndexWritten | _compiled.IndexWritten"]
CollectUnits = Callable[..., "UnitsCollected | _compiled.UnitsCollected"]
PlainBatchCheck = Callable[[bytes | memoryview, int, tuple[bytes, ...]], "PlainCounts | _compiled.PlainCounts | None"]
BatchIds = Callable[[Any, int, int, int, str], "str | None"]

write_batch: WriteBatch = py_write_batch
index_write: IndexWrite = py_index_write
collect_units: CollectUnits = py_collect_units
plain_batch: PlainBatchCheck = py_plain_batch
plain_properties: Callable[[str | bytes, tuple[bytes, ...]], bool] = py_plain_properties
batch_ids: BatchIds = py_batch_ids
COMPILED = False

_speedups = speedups()
if _speedups is not None:  # (else not built, or ORBIT_PURE_PYTHON: the pure-Python twins serve)
    write_batch = _speedups.write_batch
    index_write = _speedups.index_write
    collect_units = _speedups.collect_units
    plain_batch = _speedups.plain_batch
    plain_properties = _speedups.plain_properties
    batch_ids = _speedups.batch_ids
    COMPILED = True


class PythonLoops:
    """The pure-Python twins as one object, the ``StoreLoops`` (compiled.py) that ``_speedups``
    also is."""

    write_batch = staticmethod(py_write_batch)
    index_write = staticmethod(py_index_write)
    collect_units = staticmethod(py_collect_units)
    plain_batch = staticmethod(py_plain_batch)
    plain_properties = staticmethod(py_plain_properties)
    batch_ids = staticmethod(py_batch_ids)


def speedups_module() -> Any:
    """The compiled module when it is built and in use, else None."""
    if not COMPILED:
        return None
    try:
        from data_plane.store import _speedups
    except ImportError:
        return None
    return _speedups


def use_compiled(enabled: bool) -> bool:
    """Switch implementations at run time (tests compare them); returns whether the compiled
    one is in use afterwards."""
    global write_batch, index_write, collect_units, plain_batch, plain_properties, batch_ids, COMPILED
    if enabled:
        try:
            from data_plane.store import _speedups
        except ImportError:
            enabled = False
        else:
            write_batch, index_write = _speedups.write_batch, _speedups.index_write
            collect_units, plain_batch = _speedups.collect_units, _speedups.plain_batch
            plain_properties, batch_ids = _speedups.plain_properties, _speedups.batch_ids
    if not enabled:
        write_batch, index_write, collect_units = py_write_batch, py_index_write, py_collect_units
        plain_batch, plain_properties, batch_ids = py_plain_batch, py_plain_properties, py_batch_ids
    COMPILED = enabled
    return enabled
