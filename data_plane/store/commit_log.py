"""CommitLog: the one append-only log every topic's messages are written to.

Records are laid out as described in ``message.py`` (88-byte header, body, topic, properties),
back to back in ``MappedFile``s of ``commit_log_file_size_bytes``; a file that cannot hold the
next record (plus the 8 bytes a blank record needs) is closed with a blank record::

    | record | record | ... | record | blank: total=bytes left, magic=BLANK |   next file ...

Appends assign the physical offset, the store timestamp and the queue offset of each message
((topic, queue id) → next offset) under one lock, and return the ``DispatchRequest`` of every
record so the dispatcher can index it without re-reading the log. A batch is encoded in one
pass and lands in one file under one lock acquisition.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from data_plane.store import fastpath
from data_plane.store.config import StoreConfig
from data_plane.store.fastpath import PlainBatch
from data_plane.store.mapped_file import MappedFile
from data_plane.store.mapped_file_queue import AllocateMappedFileService, MappedFileQueue
from data_plane.store.message import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MAGIC_AND_SIZE,
    MESSAGE_MAGIC_CODE,
    OFF_STORE_TIMESTAMP,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    RECORD_HEADER,
    STORE_TIMESTAMP,
    TRANSACTION_TYPE_MASK,
    Message,
    RecordError,
    decode_properties,
    pack_host,
    parse_record,
    tags_hash_code,
    validate_topic,
)
from data_plane.store.positions import QueueOffsets
from data_plane.store.status import AppendMessageStatus, AppendResult, PutMessageStatus

log = logging.getLogger(__name__)

_HEADER_SIZE = RECORD_HEADER.size
# A CommitLog file made on the write path (at start, or when the allocator is behind) is
# reserved this much at a time as appends reach it, instead of all at once.
LAZY_RESERVE_BYTES = 4 * 1024 * 1024
# The staging buffer batches are laid out in; a larger batch grows it (up to a file's size).
STAGE_BYTES = 1024 * 1024
_NO_TARGETS = (None, 0, 0, None, 0, 0, 0, 0)


class DispatchRequest(NamedTuple):
    """What the dispatcher needs of one record to build ConsumeQueue and index entries."""

    topic: str
    queue_id: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: str  # space-separated KEYS property, "" if none
    uniq_key: str  # UNIQ_KEY property, "" if none
    sys_flag: int


class PutRefused(Exception):
    """A message was refused before anything was written; carries the status and reason."""

    def __init__(self, status: PutMessageStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def queue_offset_advances(sys_flag: int) -> bool:
    """Prepared and rolled-back transaction records take no ConsumeQueue slot (seed 8.x)."""
    tran = sys_flag & TRANSACTION_TYPE_MASK
    return tran in (0, 2 << 2)


class CommitLog:
    __slots__ = (
        "_clock_ms",
        "_msg_id_prefix",
        "_stage",
        "_stage_mv",
        "config",
        "file_size",
        "last_store_timestamp",
        "lock",
        "mfq",
        "queue_offsets",
        "store_host",
        "topic_bytes_cache",
    )

    def __init__(
        self,
        config: StoreConfig,
        *,
        clock_ms: Callable[[], int],
        allocator: AllocateMappedFileService | None,
    ) -> None:
        self.config = config
        self.file_size = config.commit_log_file_size_bytes
        self.mfq = MappedFileQueue(
            config.commit_log_path,
            self.file_size,
            allocator=allocator,
        )
        self._clock_ms = clock_ms
        self.store_host = pack_host(config.store_host, config.store_port)
        self._msg_id_prefix = self.store_host.hex().upper()
        # (topic, queue id) -> next queue offset; compiled, a QueueOffsets (positions.py)
        self.queue_offsets: dict[tuple[str, int], int] = QueueOffsets()
        self.lock = threading.Lock()
        self.last_store_timestamp = 0
        self.topic_bytes_cache: dict[str, bytes] = {}
        # Batches are laid out here, then written to the file with one pwrite (see mapped_file).
        self._stage = bytearray(STAGE_BYTES)
        self._stage_mv = memoryview(self._stage)

    # --- appending (under the lock) --------------------------------------------------------
    def topic_bytes(self, topic: str) -> bytes:
        """The topic as stored, validated once; raises PutRefused."""
        topic_b = self.topic_bytes_cache.get(topic)
        if topic_b is None:
            problem = validate_topic(topic, self.config.max_topic_length)
            if problem:
                raise PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, problem)
            topic_b = topic.encode()
            if len(self.topic_bytes_cache) < 100_000:
                self.topic_bytes_cache[topic] = topic_b
        return topic_b

    def append(
        self,
        msgs: list[Message] | PlainBatch,
        topic: str,
        topic_b: bytes,
        queue_id: int,
        targets: tuple[Any, ...] = (),
    ) -> tuple[AppendResult, bytes | int, bytes | int, int, tuple[int, ...] | None] | None:
        """Write ``msgs`` (one topic and queue id) contiguously in one file. Returns the result,
        the ConsumeQueue units and index items of the batch — or, when ``targets`` (see
        ``Dispatcher.targets``) could take them, where they now end — the CommitLog offset of
        the last record indexed, and a plain body's distinct tag codes. ``msgs`` may be a plain
        batch body (``fastpath``); None when it is not plain (nothing written). Raises
        PutRefused for a bad message (nothing written) and OSError when no file can be created
        (full disk). The caller holds ``self.lock``."""
        cfg = self.config
        mf = self.mfq.last_file_for_write()
        now = self._clock_ms()
        now = max(now, self.last_store_timestamp)  # store timestamps never go backwards
        self.last_store_timestamp = now
        key = (topic, queue_id)
        first_qo = self.queue_offsets.get(key, 0)
        usable = self.file_size - END_FILE_MIN_BLANK_LENGTH
        if len(targets) < len(_NO_TARGETS):
            targets = targets + _NO_TARGETS[len(targets) :]
        for _ in range(4):
            pos = mf.wrote_position
            if mf.fd < 0:
                raise OSError(errno.EBADF, f"{mf.path} is closed")
            stage = self._stage_mv
            room = min(usable, mf.reserved_upto) - pos
            r = fastpath.write_batch(
                stage,
                0,
                max(0, min(room, len(stage))),
                mf.file_from_offset + pos,
                msgs,
                topic_b,
                queue_id,
                first_qo,
                now,
                self.store_host,
                cfg.max_properties_size_bytes,
                cfg.max_message_size_bytes,
                cfg.index_enabled,
                *targets,
                mf.fd,
                pos,
            )
            if r is None:  # a plain batch body that is not plain
                return None
            if r.outcome == fastpath.LAID_OUT:
                break
            if r.outcome == fastpath.REFUSED:
                raise PutRefused(PutMessageStatus[r.status], f"message {r.msg_index} of the batch: {r.reason}")
            need = r.need
            if need > usable:
                return AppendResult(AppendMessageStatus.MESSAGE_SIZE_EXCEEDED), b"", b"", -1, None
            if pos + need > usable:
                self._write_blank(mf)
                mf = self.mfq.last_file_for_write()
                continue
            if need > len(stage):
                self._grow_stage(need)
            if pos + need > mf.reserved_upto:
                # Fits the file, not yet the reserved blocks (a file created on the write path).
                mf.ensure_reserved(pos + need, LAZY_RESERVE_BYTES)
        else:
            raise RuntimeError(f"a batch of {len(msgs)} messages found no room in {mf}")
        laid: fastpath.LaidOut = r
        end = pos + laid.written
        self.queue_offsets[key] = laid.next_queue_offset
        mf.wrote_position = mf.committed_position = end
        at = mf.file_from_offset + pos
        # A batch's message ids from the records still in the stage (the mapping has not seen
        # these pages: reading them there took page faults, ~4 % of a broker's batched CPU).
        n = laid.msg_count
        ids = (fastpath.batch_ids(stage, at, at, n, self._msg_id_prefix) or "") if n > 1 else ""
        return (
            AppendResult(
                AppendMessageStatus.PUT_OK, at, end - pos, now, laid.first_queue_offset, n, self._msg_id_prefix, ids
            ),
            laid.cq_units,
            laid.index_items,
            laid.last_indexed,
            laid.tag_codes,
        )

    @property
    def msg_id_prefix(self) -> str:
        """What every message id of this log starts with: the store host, in hex."""
        return self._msg_id_prefix

    def msg_id(self, commit_log_offset: int) -> str:
        return self._msg_id_prefix + format(commit_log_offset, "016X")

    def _grow_stage(self, need: int) -> None:
        size = len(self._stage)
        while size < need:
            size *= 2
        self._stage_mv.release()
        self._stage = bytearray(min(size, self.file_size))
        self._stage_mv = memoryview(self._stage)

    def _write_blank(self, mf: MappedFile) -> None:
        pos = mf.wrote_position
        mf.write_at(pos, MAGIC_AND_SIZE.pack(mf.file_size - pos, BLANK_MAGIC_CODE))
        mf.wrote_position = mf.committed_position = mf.file_size

    def append_raw(self, data: bytes | memoryview, at_offset: int) -> int:
        """Append bytes already laid out as records (a slave copying its master's log) at
        ``at_offset``, which must be this log's max offset. Returns the new max offset."""
        files = self.mfq.files
        if at_offset != self.mfq.max_offset() and (files and (len(files) > 1 or files[0].wrote_position > 0)):
            raise ValueError(f"raw append at {at_offset} but the log ends at {self.mfq.max_offset()}")
        if at_offset != self.mfq.max_offset():
            # An empty log (a new slave, or one truncated to nothing) starts where its
            # master's retained log starts: positions before that are a hole, never read.
            self.mfq.destroy()
            self.mfq.last_file_for_write(at_offset)
        view = memoryview(data)
        while view:
            mf = self.mfq.last_file_for_write(at_offset)
            n = min(len(view), mf.remaining)
            mf.append_bytes(view[:n])
            view = view[n:]
        return self.mfq.max_offset()

    # --- reading ---------------------------------------------------------------------------
    def min_offset(self) -> int:
        return self.mfq.min_offset()

    def max_offset(self) -> int:
        return self.mfq.max_offset()

    def read(self, offset: int, size: int) -> memoryview | None:
        """``size`` bytes at ``offset`` as a slice of the mapping, or None when not there."""
        mf = self.mfq.find_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos + size > mf.wrote_position:
            return None
        return mf.mv[pos : pos + size]

    def read_record(self, offset: int) -> memoryview | None:
        mf = self.mfq.find_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos + 8 > mf.wrote_position:
            return None
        total, magic = MAGIC_AND_SIZE.unpack_from(mf.mv, pos)
        if magic != MESSAGE_MAGIC_CODE or total <= 0 or pos + total > mf.wrote_position:
            return None
        return mf.mv[pos : pos + total]

    def store_timestamp_at(self, offset: int) -> int:
        """Store timestamp of the record at ``offset`` (-1 when there is none)."""
        mf = self.mfq.find_by_offset(offset)
        if mf is None:
            return -1
        pos = offset - mf.file_from_offset
        if pos + _HEADER_SIZE > mf.wrote_position:
            return -1
        return int(STORE_TIMESTAMP.unpack_from(mf.mv, pos + OFF_STORE_TIMESTAMP)[0])

    # --- scanning (recovery, slaves, tools) ------------------------------------------------
    def scan(self, start_offset: int, *, check_crc: bool = True) -> Iterator[tuple[int, DispatchRequest | None]]:
        """Walk records from ``start_offset`` in order, verifying each one.

        Yields ``(end offset, request)`` for every sound record and ``(end offset, None)`` at a
        blank end-of-file record; stops before the first byte that is not a sound record (a torn
        tail, zeros, corruption). The last yielded end offset is where the valid log ends."""
        files = self.mfq.files
        offset = start_offset
        for mf in files:
            if mf.file_from_offset + mf.file_size <= offset:
                continue
            if mf.file_from_offset > offset:
                return  # a hole: nothing after it can be trusted
            pos = offset - mf.file_from_offset
            mv = mf.mv
            limit = mf.file_size
            # Recovery sees every loaded file as written to its end; a slave's last file ends
            # where its master's bytes have reached so far: a record (or the end-of-file blank)
            # not wholly received yet is not looked at until it is.
            written = mf.wrote_position
            while True:
                if pos + 8 > limit:
                    break  # ran into the end of the file without a blank: torn
                if pos + 8 > written:
                    return
                total, magic = MAGIC_AND_SIZE.unpack_from(mv, pos)
                partial = written < limit and pos + max(total, 8) > written
                if partial and magic in (BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE):
                    return
                if magic == BLANK_MAGIC_CODE and total == limit - pos:
                    offset = mf.file_from_offset + limit
                    yield offset, None
                    break
                if magic != MESSAGE_MAGIC_CODE or total < _HEADER_SIZE + 3 or pos + total > limit:
                    return
                try:
                    req = self.check_record(mv, pos, total, mf.file_from_offset + pos, check_crc)
                except RecordError as e:
                    log.warning("commit log record at %d is not sound: %s", mf.file_from_offset + pos, e)
                    return
                pos += total
                offset = mf.file_from_offset + pos
                yield offset, req
            if offset < mf.file_from_offset + limit:
                return

    @staticmethod
    def check_record(mv: memoryview, pos: int, total: int, phys_expected: int, check_crc: bool) -> DispatchRequest:
        parsed = parse_record(mv, pos, check_crc=check_crc)
        queue_id, queue_offset, phys, sys_flag, store_ts = (
            parsed.header[3],
            parsed.header[5],
            parsed.header[6],
            parsed.header[7],
            parsed.header[10],
        )
        if phys != phys_expected:
            raise RecordError(f"physical offset field {phys} != position {phys_expected}")
        topic = parsed.topic
        tags_code = 0
        keys = uniq = ""
        if parsed.properties:
            try:
                props = decode_properties(parsed.properties)
            except UnicodeDecodeError:
                raise RecordError("properties are not UTF-8") from None
            tags = props.get(PROPERTY_TAGS)
            if tags:
                tags_code = tags_hash_code(tags)
            keys = props.get(PROPERTY_KEYS, "")
            uniq = props.get(PROPERTY_UNIQ_KEY, "")
        return DispatchRequest(topic, queue_id, phys, total, tags_code, store_ts, queue_offset, keys, uniq, sys_flag)
