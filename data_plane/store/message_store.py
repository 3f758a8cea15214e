"""MessageStore: the store's one entry point (RocketMQ's DefaultMessageStore).

    put_message / put_messages ─▶ CommitLog.append ─▶ Dispatcher ─▶ ConsumeQueue, IndexFile
                                        │
                                        └─ SYNC_FLUSH: GroupCommitService (fdatasync off-loop)
    get_message(topic, queue, offset) ─▶ ConsumeQueue units ─▶ CommitLog slices (memoryview)

Threading: appends, reads and retention run on the caller's thread (the broker's event loop);
appends also take the CommitLog lock so a tool on another thread may append safely. Flushing
runs on service threads. Nothing here blocks an event loop on disk: page-cache writes are
memory copies, new CommitLog files are created ahead of need on a worker thread, and every
``fdatasync`` happens on a service thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from data_plane.store import fastpath, queue_read, retention, truncation
from data_plane.store.append_entry import AppendEntry, PythonAppendEntry
from data_plane.store.checkpoint import StoreCheckpoint, create_abort_file, delete_abort_file
from data_plane.store.commit_log import CommitLog, PutRefused
from data_plane.store.config import FlushDiskType, StoreConfig
from data_plane.store.consume_queue import ConsumeQueue
from data_plane.store.dispatcher import ConsumeQueueTable, Dispatcher
from data_plane.store.fastpath import PlainBatch
from data_plane.store.flush import (
    FlushConsumeQueueService,
    FlushRealTimeService,
    GroupCommitService,
)
from data_plane.store.flush_waits import FlushWaits
from data_plane.store.index_file import IndexService
from data_plane.store.index_flush import IndexFlush
from data_plane.store.layouts import CQ_UNIT
from data_plane.store.mapped_file import py_populate
from data_plane.store.mapped_file_queue import AllocateMappedFileService
from data_plane.store.message import (
    PROPERTY_WAIT_STORE_MSG_OK,
    Message,
    RecordError,
    StoredMessage,
    decode_message_id,
    decode_record,
    queue_id_of,
    topic_of,
)
from data_plane.store.populate_ahead import PopulateAheadService
from data_plane.store.queue_prepare import QueuePreparer
from data_plane.store.queue_read import RecordFilter
from data_plane.store.recovery import adopt_queue_state, recover
from data_plane.store.reserve_ahead import ReserveAheadService, release_with_madvise
from data_plane.store.status import (
    AppendMessageStatus,
    AppendResult,
    GetMessageResult,
    PutMessageResult,
    PutMessageStatus,
)
from data_plane.store.tier import cold_read
from data_plane.store.tier.tier import Tier

if TYPE_CHECKING:
    from data_plane.store._speedups import Appended

log = logging.getLogger(__name__)


# Fetches of one tiered record a reader makes before it reads what memory holds.
COLD_FETCH_TRIES = 4


def _keyed(msg: StoredMessage | None, topic: str, key: str, out: list[StoredMessage]) -> int:
    """Keep an index hit that really is ``topic``'s and carries ``key`` (hashes collide); how
    many are kept."""
    if msg is not None and msg.topic == topic and (key in msg.keys or msg.properties.get("UNIQ_KEY") == key):
        out.append(msg)
    return len(out)


def _no_replication() -> int:
    return 2**63 - 1


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        *,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        disk_usage_ratio: Callable[[str], float] | None = None,
    ) -> None:
        self.config = config
        # CommitLog files whose newest message is older than this go (file_reserved_time_hours,
        # raised by the broker to the longest retention any topic it hosts was promised:
        # retention is per file, not per topic). See ``retention``.
        self.retention_hours = config.file_reserved_time_hours
        # The retention each topic was promised (set by the broker); a topic missing here has
        # file_reserved_time_hours. Counts what a deletion at the emergency watermark took early.
        self.topic_retention_hours: dict[str, float] = {}
        # With a tier: how long each topic's uploaded files stay on local disk, when a topic asks
        # for longer than ``local_retention_hours`` (set by the broker).
        self.topic_local_retention_hours: dict[str, float] = {}
        # The group's agreed offset: bytes below it are held by every member that could become
        # master, so the tier may take them (set by a replicating broker; read by the
        # offloader's thread, so it must not touch the store).
        self.tier_safe_offset: Callable[[], int] = _no_replication
        # Told of every CommitLog file deleted inside retention (the emergency watermark), after
        # the deletion, on the thread running ``clean_once``.
        self.on_forced_deletion: Callable[[retention.ForcedDeletion], object] | None = None
        self.hot_data_bytes = config.hot_data_bytes or retention.memory_for_hot_data_bytes()
        self.clock_ms = clock_ms
        # The disk-usage probe: given, else the override file's (a test hook), else statvfs.
        if disk_usage_ratio is None and config.disk_usage_override_file:
            disk_usage_ratio = retention.disk_usage_from_file(config.disk_usage_override_file)
        self._disk_usage_ratio = disk_usage_ratio or retention.disk_usage_ratio
        os.makedirs(config.store_path, exist_ok=True)
        # (first: a tier that cannot be set up — an unknown profile — stops the store before it
        # starts anything)
        self.tier = Tier(self) if config.tier_url else None
        self._allocator = (
            AllocateMappedFileService(warm_up=config.warm_mapped_file_enabled) if config.preallocate_next_file else None
        )
        self.commit_log = CommitLog(config, clock_ms=clock_ms, allocator=self._allocator)
        self.queues = ConsumeQueueTable(config.consume_queue_path, config.consume_queue_units_per_file)
        self.index = (
            IndexService(config.index_path, config.index_hash_slots, config.index_max_entries, clock_ms=clock_ms)
            if config.index_enabled
            else None
        )
        self.dispatcher = Dispatcher(self.queues, self.index)
        self.queues_floor = 0  # the log floor the queues' min offsets were last moved to (retention)
        self.checkpoint = StoreCheckpoint(config.checkpoint_path)
        self._index_flush = IndexFlush(self)
        self.sync_flush = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.disk_full = False
        self.disk_full_reason = retention.DISK_FULL_REASON  # what a refused put is told
        # Set by a broker that is not (or no longer) its group's master: every writer of this
        # store (sends, schedule re-puts, transaction checks, trace, usage) is refused in one place.
        # append_raw (replication) is not affected.
        self.fenced = False
        self.dispatch_broken = False  # a dispatch failed (full disk); puts wait for a redispatch
        self.running = False
        self.recovered_abnormally = False
        self._lock_fd = -1
        self._group_commit: GroupCommitService | None = None
        self._flush_log: FlushRealTimeService | None = None
        self._flush_cq: FlushConsumeQueueService | None = None
        self._reserve_ahead: ReserveAheadService | None = None
        self._populate_ahead: PopulateAheadService | None = None
        self._queue_preparer: QueuePreparer | None = None
        self._last_release_all = time.monotonic()
        self._put_count = 0  # (``put_count``; the compiled entry points count their own)
        self._put_bytes = 0
        # The append entry points callers look up once the store has started (``_install_entry``).
        self.entry: AppendEntry = PythonAppendEntry(self)
        self._busy_timeout_s = config.os_page_cache_busy_timeout_ms / 1000
        self._sync_timeout_s = config.sync_flush_timeout_ms / 1000
        self._flush_waits: FlushWaits | None = None  # SYNC_FLUSH: appends waiting to be durable
        self._appender: Any = None
        self._host_hex = self.commit_log.store_host.hex().upper()

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Lock the directory, load, recover, start the flush services."""
        cfg = self.config
        self._lock_fd = os.open(os.path.join(cfg.store_path, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise RuntimeError(f"store {cfg.store_path} is in use by another process") from None
        crashed = os.path.exists(cfg.abort_path)
        if self._allocator is not None:
            self._allocator.reopen()
        self.checkpoint = StoreCheckpoint.load(cfg.checkpoint_path)
        self.commit_log.mfq.load()
        self.queues.load()
        if self.index is not None:
            self.index.load()
        self._recover(crashed)
        try:
            # Have the file appends go to (and, through the allocator, the one after it) ready
            # before the first message arrives.
            self.commit_log.mfq.last_file_for_write(self.commit_log.max_offset())
        except OSError as e:
            self.disk_full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            log.error("cannot create a CommitLog file at start: %s", e)
        if self.index is not None:
            try:
                self.index.ensure_writable()
            except OSError as e:
                self.disk_full = True
                log.error("cannot create an IndexFile at start: %s", e)
        self._appender = self._make_appender()
        if self._appender is not None and cfg.write_stage_bytes > 0:
            self.commit_log.mfq.sync_staged = self._appender.commit
        self._install_entry()
        create_abort_file(cfg.abort_path)
        self._start_services()
        self.running = True

    def start_tiering(self) -> None:
        """Start the tier's offloader (after ``start``, once ``fenced`` and ``tier_safe_offset`` say
        what this store may upload: a broker calls it when its replication role is set)."""
        if self.tier is not None and self.running:
            self.tier.start()

    def _recover(self, crashed: bool) -> None:
        """Find where the log really ends, and make every index agree with it."""
        self.recovered_abnormally = crashed
        recover(self, crashed=crashed)

    def _install_entry(self) -> None:
        """Choose ``entry``, this store's append entry points (append_entry.py). With the
        compiled Appender, the compiled ``_speedups.StoreEntry``: the answers of ``append`` and
        ``append_plain`` in one C call — one message through ``Appender.append``, a batch
        through ``Appender.append_batch`` — handing whatever it does not take to the Python
        methods (``_append_general``; None from ``append_plain``). Without it,
        ``PythonAppendEntry``: the methods themselves, which stay the reference."""
        old = self.entry  # (on a restart: what the last one counted stays counted)
        self._put_count += old.count
        self._put_bytes += old.bytes
        speedups = fastpath.speedups_module()
        if self._appender is None or speedups is None:
            self.entry = PythonAppendEntry(self)
            return
        self.entry = speedups.StoreEntry(
            self._appender, self, self.commit_log.lock, PutMessageResult, PutMessageStatus.PUT_OK, self._host_hex,
            vars(fastpath), AppendResult, AppendMessageStatus.PUT_OK,
        )  # fmt: skip

    @property
    def put_count(self) -> int:
        """Messages this store has appended (over its restarts too)."""
        return self._put_count + self.entry.count

    @property
    def put_bytes(self) -> int:
        """CommitLog bytes this store has appended (over its restarts too)."""
        return self._put_bytes + self.entry.bytes

    def _make_appender(self) -> Any:
        """The compiled single-message append path, when it was built (see fastpath)."""
        speedups = fastpath.speedups_module()
        cl = self.commit_log
        if speedups is None or not isinstance(cl.queue_offsets, speedups.QueueOffsets):
            return None  # (the pure-Python twins in use: a plain dict of offsets)
        cfg = self.config
        return speedups.Appender(
            cl,
            cl.queue_offsets,
            cl.topic_bytes_cache,
            self.queues.queues,
            self.index,
            self.dispatcher,
            None if self.clock_ms is _wall_clock_ms else self.clock_ms,
            cl.store_host,
            cfg.max_properties_size_bytes,
            cfg.max_message_size_bytes,
            cfg.index_enabled,
            cfg.index_hash_slots,
            cfg.index_max_entries,
            cfg.write_stage_bytes,
        )

    def _start_services(self) -> None:
        cfg = self.config
        mfq = self.commit_log.mfq
        if self.sync_flush:
            self._group_commit = GroupCommitService(mfq, after_flush=self._after_log_flush)
            self._group_commit.start()
            self._flush_waits = FlushWaits(self._group_commit, self._sync_timeout_s, lambda: mfq.flushed_where)
        else:
            self._flush_log = FlushRealTimeService(
                mfq,
                interval_ms=cfg.flush_interval_commit_log_ms,
                least_pages=cfg.flush_commit_log_least_pages,
                thorough_interval_ms=cfg.flush_commit_log_thorough_interval_ms,
                after_flush=self._after_log_flush,
            )
            self._flush_log.start()
        self._flush_cq = FlushConsumeQueueService(
            interval_ms=cfg.flush_interval_consume_queue_ms, flush_once=self.flush_indexes
        )
        self._flush_cq.start()
        speedups = fastpath.speedups_module()
        self._reserve_ahead = ReserveAheadService(
            mfq,
            window_bytes=cfg.reserve_ahead_bytes,
            keep_behind_bytes=cfg.release_keep_bytes,
            release=(
                None
                if not cfg.release_flushed_pages
                else (lambda mf, a, b: speedups.release(mf.mv, a, b - a))
                if speedups is not None
                else release_with_madvise
            ),
        )
        self._reserve_ahead.start()
        if cfg.populate_ahead_bytes > 0:
            self._populate_ahead = PopulateAheadService(
                mfq,
                ahead_bytes=cfg.populate_ahead_bytes,
                populate=speedups.populate if speedups is not None else py_populate,
            )
            self._populate_ahead.start()
        self._queue_preparer = QueuePreparer(self.queues)
        self._queue_preparer.start()

    def prepare_queues(self, topic: str, queue_nums: int) -> bool:
        """Make the directories and first files of ``topic``'s first ``queue_nums`` queues that
        have none yet, on a thread of their own, before its first messages need them
        (queue_prepare.py); for a master's new topics. False when not queued."""
        preparer = self._queue_preparer
        return preparer is not None and self.running and preparer.request(topic, range(queue_nums))

    def queues_ready(self, topic: str) -> concurrent.futures.Future[None] | None:
        """Done once the queues asked of ``prepare_queues`` for ``topic`` are made; None when
        none are being made."""
        return self._queue_preparer.ready(topic) if self._queue_preparer is not None else None

    def shutdown(self) -> None:
        """Stop services, flush everything, write the checkpoint, remove the abort file."""
        if not self.running:
            return
        self.running = False
        if self.tier is not None:
            self.tier.close()
        services = (self._queue_preparer, self._populate_ahead, self._reserve_ahead, self._group_commit)
        for svc in (*services, self._flush_log, self._flush_cq):
            if svc is not None:
                svc.stop()
        with self.commit_log.lock:
            self.commit_log.mfq.flush_all()
            self.flush_indexes(True)
            if self._allocator is not None:
                self._allocator.shutdown()
            self.commit_log.mfq.close()
            self.queues.close()
            if self.index is not None:
                self.index.close()
        if not self.dispatch_broken:
            delete_abort_file(self.config.abort_path)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def destroy(self) -> None:
        """Shut down and delete every file of the store."""
        self.shutdown()
        shutil.rmtree(self.config.store_path, ignore_errors=True)

    # --- flushing --------------------------------------------------------------------------
    def _after_log_flush(self) -> None:
        cfg = self.config
        mfq = self.commit_log.mfq
        # Pages behind the writer are dropped by ReserveAheadService as it goes; what remains
        # is pages that reads of older files faulted back in.
        if cfg.release_flushed_pages:
            now = time.monotonic()
            if now - self._last_release_all >= 5.0:
                # Pages faulted back in by reads of older files.
                self._last_release_all = now
                for mf in mfq.files[:-1]:
                    mf.release_all_pages()

    def reserve_indexes_ahead(self, queues: list[ConsumeQueue]) -> None:
        """Reserve ahead the blocks ``queues`` and the newest IndexFile will be written into next
        (``IndexFlush.reserve_ahead``)."""
        self._index_flush.reserve_ahead(queues)

    def flush_indexes(self, thorough: bool) -> None:
        """Flush ConsumeQueues and IndexFiles, then record the checkpoint (``IndexFlush.flush``)."""
        self._index_flush.flush(thorough)

    # --- writing ---------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        return self.running and not self.disk_full and not self.dispatch_broken and not self.fenced

    def _refuse(self) -> PutMessageResult:
        if not self.running:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason="store is not running")
        if self.fenced:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason="not the master: writes fenced")
        return PutMessageResult(PutMessageStatus.DISK_FULL, reason=self.disk_full_reason)

    def append(self, msgs: Sequence[Message]) -> tuple[PutMessageResult, int]:
        """Append and dispatch ``msgs`` as one batch (one topic and queue id, as RocketMQ's
        batches are), without waiting for a flush. Returns the result and the log offset the
        batch ends at (-1 when nothing was written). The hot path: keep it short."""
        appender = self._appender
        if (
            len(msgs) == 1
            and appender is not None
            and fastpath.COMPILED
            and self.running
            and not (self.disk_full or self.dispatch_broken or self.fenced)  # (`writable`, inlined)
        ):
            lock = self.commit_log.lock
            if lock.acquire(False):
                try:
                    r = appender.append(msgs[0])
                except OSError as e:  # the CommitLog file refused the bytes: nothing recorded
                    return self._io_refusal(e), -1
                finally:
                    lock.release()
                if r is not None:
                    return self._stored_one(r), r.wrote_offset + r.wrote_bytes
        return self._append_general(msgs)

    def _append_general(self, msgs: Sequence[Message]) -> tuple[PutMessageResult, int]:
        """``append`` past the compiled paths (the compiled entry point hands over here whatever
        it does not take: a queue's first append, a file to roll over, a refusal, ...)."""
        if not self.running or self.disk_full or self.dispatch_broken or self.fenced:
            return self._refuse(), -1
        n = len(msgs)
        if n == 0:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, "no message to put"), -1
        first = msgs[0]
        topic = first.topic
        queue_id = first.queue_id
        # (compared at C speed: map, not a loop of Python bytecode)
        if n > 1 and (any(map(topic.__ne__, map(topic_of, msgs))) or any(map(queue_id.__ne__, map(queue_id_of, msgs)))):
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL, None, "the messages of a batch must share topic and queue"
            ), -1
        written = self._write(msgs if type(msgs) is list else list(msgs), topic, queue_id)
        assert written is not None  # a list of Messages is always taken
        return written[0], written[1]

    def append_plain(
        self,
        topic: str,
        queue_id: int,
        body: bytes | bytearray | memoryview,
        properties: str | bytes,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: bytes,
        reconsume_times: int,
        skip_names: tuple[bytes, ...],
    ) -> Appended | PutMessageResult | None:
        """``append`` of one message given by its parts, as a SEND_MESSAGE request carries them
        (the properties as their encoded text), with no Message object: the broker's single-send
        path. Taken only by the compiled Appender, and only when the message is *plain*
        (``fastpath``: properties ASCII ``name\\x01value\\x02`` pairs as the store writes them, no
        name in ``skip_names``), its topic has been written before and nothing refuses it.
        Returns the record's raw numbers — (CommitLog offset, size, store timestamp, queue
        offset, dispatch failed, tag hash code); ``stored_result`` makes them a PUT_OK result —
        or the refusal of an I/O error; None when not taken (nothing written: the caller makes
        a Message and calls ``append``, the reference path, which also gives any error)."""
        appender = self._appender
        if (
            appender is None
            or not fastpath.COMPILED
            or not self.running
            or self.disk_full
            or self.dispatch_broken
            or self.fenced
        ):  # (`writable`, inlined)
            return None
        lock = self.commit_log.lock
        if not lock.acquire(False):
            return None
        try:
            r: Appended | None = appender.append_plain(
                topic, queue_id, body, properties, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                skip_names,
            )  # fmt: skip
        except OSError as e:  # the CommitLog file refused the bytes: nothing recorded
            return self._io_refusal(e)
        finally:
            lock.release()
        if r is not None:  # (_stored_one's bookkeeping, inline: no result object made here)
            if r.dispatch_failed:
                self._dispatch_failed()
            self._put_count += 1
            self._put_bytes += r.wrote_bytes
        return r

    def stored_result(self, r: Appended) -> PutMessageResult:
        """PUT_OK for the record ``append_plain`` answered ``r`` for."""
        return PutMessageResult.stored(r, self._host_hex)

    def _stored_one(self, r: Appended) -> PutMessageResult:
        """The result of one record the compiled Appender wrote (``append``; ``append_plain``
        does the same bookkeeping inline)."""
        if r.dispatch_failed:
            self._dispatch_failed()
        self._put_count += 1
        self._put_bytes += r.wrote_bytes
        return PutMessageResult.stored(r, self._host_hex)

    def _dispatch_failed(self) -> None:
        self.dispatch_broken = True
        log.error("dispatch failed (full disk), writes paused until it can be redone")

    def append_plain_batch(
        self,
        body: bytes | memoryview,
        topic: str,
        queue_id: int,
        *,
        sys_flag: int,
        born_timestamp: int,
        born_host: bytes,
        reconsume_times: int,
        max_messages: int,
        skip_names: tuple[bytes, ...],
    ) -> tuple[PutMessageResult, int, tuple[int, ...]] | None:
        """``append`` of a SEND_BATCH_MESSAGE body laid out as it is, with no Message objects,
        when it is plain (``fastpath``: its properties already in the form the store writes, no
        name in ``skip_names``). Returns the result, where the batch ends and its distinct tag
        hash codes; None when the body is not plain (nothing written: split it into Messages)."""
        if not self.writable:
            return self._refuse(), -1, ()
        plain = (body, sys_flag, born_timestamp, born_host, reconsume_times, max_messages, skip_names)
        written = self._write(plain, topic, queue_id)
        if written is None:
            return None
        result, end, tag_codes = written
        return result, end, tag_codes or ()

    def _write(
        self, batch: list[Message] | PlainBatch, topic: str, queue_id: int
    ) -> tuple[PutMessageResult, int, tuple[int, ...] | None] | None:
        """The general append under the CommitLog lock (``append``, ``append_plain_batch``)."""
        cl = self.commit_log
        lock = cl.lock
        if not lock.acquire(False) and not lock.acquire(timeout=self._busy_timeout_s):
            return PutMessageResult(PutMessageStatus.OS_PAGECACHE_BUSY, None, "commit log lock busy"), -1, None
        try:
            topic_b = cl.topic_bytes(topic)
            if not 0 <= queue_id < 2**31:
                raise PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, f"queue id {queue_id} out of range")
            dispatcher = self.dispatcher
            # The batch's ConsumeQueue units start at the queue's next offset (its first message
            # may be a prepared transaction, which takes no unit).
            first_unit_offset = cl.queue_offsets.get((topic, queue_id), 0)
            targets = dispatcher.targets(topic, queue_id, first_unit_offset)
            appended = cl.append(batch, topic, topic_b, queue_id, targets)
            if appended is None:
                return None
            result, cq_out, index_out, last_indexed, tag_codes = appended
            if result.status is not AppendMessageStatus.PUT_OK:
                return (
                    PutMessageResult(
                        PutMessageStatus.MESSAGE_ILLEGAL, result, "the batch is larger than a CommitLog file"
                    ),
                    -1,
                    None,
                )
            end = result.wrote_offset + result.wrote_bytes
            try:
                dispatcher.dispatch_appended(
                    topic, queue_id, cq_out, first_unit_offset, index_out, last_indexed, result.store_timestamp, end
                )
            except OSError as e:
                # The records are in the log; their indexes will be rebuilt from it once there
                # is room again. Until then refuse writes (and say why).
                self.dispatch_broken = True
                log.error("dispatch failed, writes paused until it can be redone: %s", e)
        except PutRefused as e:
            return PutMessageResult(e.status, None, e.reason), -1, None
        except OSError as e:
            return self._io_refusal(e), -1, None
        finally:
            lock.release()
        self._put_count += result.msg_num
        self._put_bytes += result.wrote_bytes
        return PutMessageResult(PutMessageStatus.PUT_OK, result), end, tag_codes

    def write_staged(self) -> None:
        """Write the appends gathered in the stage (``write_stage_bytes``) to the
        CommitLog file now. Readers, flushes, rollovers and other writers do this by themselves;
        a server calls it before it acknowledges what it appended."""
        sync = self.commit_log.mfq.sync_staged
        if sync is None:
            return
        try:
            sync()
        except OSError as e:  # the records stay staged; writes stop until there is room
            self.disk_full = True
            log.error("writing staged records to the CommitLog failed: %s", e)

    def _io_refusal(self, e: OSError) -> PutMessageResult:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            self.disk_full = True
            return PutMessageResult(PutMessageStatus.DISK_FULL, reason=f"no room in the CommitLog: {e}")
        log.error("writing to the CommitLog failed: %s", e)
        return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, reason=str(e))

    def _wants_flush_wait(self, msgs: Sequence[Message]) -> bool:
        return self.sync_flush and msgs[0].properties.get(PROPERTY_WAIT_STORE_MSG_OK) != "false"

    def put_message(self, msg: Message) -> Coroutine[Any, Any, PutMessageResult]:
        """``await store.put_message(msg)``: ``put_messages`` of one message (a plain function
        returning its coroutine: one frame less on the hot path)."""
        return self.put_messages((msg,))

    async def put_messages(self, msgs: Sequence[Message]) -> PutMessageResult:
        """Append ``msgs`` (one batch); with SYNC_FLUSH, answer once they are on disk."""
        result, end = self.entry.append(msgs)
        if end < 0 or not self._wants_flush_wait(msgs):
            return result
        assert self._flush_waits is not None
        fut = self._flush_waits.wait(end)
        if fut is None:
            result.status = PutMessageStatus.OS_PAGECACHE_BUSY
            result.reason = "too many appends waiting for a flush"
        elif not await fut:
            result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
            result.reason = "not flushed within sync_flush_timeout_ms"
        return result

    def put_messages_blocking(self, msgs: Sequence[Message]) -> PutMessageResult:
        """``put_messages`` for callers without an event loop (tools, benchmarks)."""
        result, end = self.entry.append(msgs)
        if end < 0 or not self._wants_flush_wait(msgs):
            return result
        assert self._flush_waits is not None
        if not self._flush_waits.wait_blocking(end):
            result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
            result.reason = "not flushed within sync_flush_timeout_ms"
        return result

    def append_raw(self, data: bytes | memoryview, at_offset: int, *, dispatch: bool = True) -> int:
        """A slave's write path: copy log bytes as they are, then dispatch what they complete
        (``dispatch=False``: later, with ``dispatch_pending`` — a slave acknowledges the bytes
        to its master in between, as RocketMQ's slave does before its reput service runs)."""
        with self.commit_log.lock:
            if at_offset != self.commit_log.max_offset():
                self.dispatcher.dispatched_offset = at_offset  # an empty log starting mid-stream
            end = self.commit_log.append_raw(data, at_offset)
            if dispatch:
                self.dispatcher.redispatch(self.commit_log, self.dispatcher.dispatched_offset)
        return end

    def cut_partial_tail(self) -> int:
        """A slave about to become master: dispatch what was received, then cut the log back to
        the end of its last whole record (a master that died mid-chunk leaves a partial one, and
        new records must not follow it). Returns the new end. Its own appends then continue
        every queue where the received records left it (``adopt_queue_state``).

        Blocking; safe on a worker thread while nothing appends (the store fenced, the HA
        client stopped): the bytes it cuts are of no whole record, so no reader can have found
        them, and what it sets is read by appenders only."""
        self.dispatch_pending()
        end = self.dispatcher.dispatched_offset
        if end < self.commit_log.max_offset():
            self.truncate_log(end)
        with self.commit_log.lock:
            adopt_queue_state(self)
        return self.commit_log.max_offset()

    def dispatch_pending(self) -> None:
        """Dispatch whatever ``append_raw(..., dispatch=False)`` wrote and nothing indexed yet."""
        with self.commit_log.lock:
            self.dispatcher.redispatch(self.commit_log, self.dispatcher.dispatched_offset)

    def cut_log(self, offset: int) -> truncation.LogCut | None:
        """A slave whose log diverged from its master's: drop every record at or past ``offset``
        (a record boundary) and every ConsumeQueue unit and index entry naming them, as
        recovery does for a torn tail — in memory, in proportion to what is cut, on the
        thread that reads the store. Returns the disk work left (``LogCut.finish``: wipe, delete,
        flush, checkpoint; for a worker thread, done before anything is appended again), or
        None when the log ends at or before ``offset``. See ``truncation``."""
        return truncation.cut_log(self, offset)

    def truncate_log(self, offset: int) -> None:
        """``cut_log`` with its disk work done on the caller's thread."""
        cut = self.cut_log(offset)
        if cut is not None:
            cut.finish()

    # --- reading ---------------------------------------------------------------------------
    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        *,
        tags_codes: Collection[int] | None = None,
        record_filter: RecordFilter | None = None,
        coalesce: bool = False,
    ) -> GetMessageResult:
        """RocketMQ's pull read of a queue (``queue_read.get_message``)."""
        return queue_read.get_message(
            self,
            topic,
            queue_id,
            offset,
            max_msg_nums,
            tags_codes=tags_codes,
            record_filter=record_filter,
            coalesce=coalesce,
        )

    def read_record(self, commit_log_offset: int) -> memoryview | None:
        """The raw record at a CommitLog offset (what a PULL ships), or None — None too for a
        tiered record not in memory: ``cold`` tells, ``fetch_cold`` brings it."""
        if commit_log_offset < self.commit_log.min_offset() and self.tier is not None:
            return cold_read.record(self.tier, commit_log_offset)
        return self.commit_log.read_record(commit_log_offset)

    def cold(self, commit_log_offset: int) -> bool:
        """The record is only in the tier and not in memory: ``await fetch_cold`` first."""
        tier = self.tier
        return (
            tier is not None
            and commit_log_offset < self.commit_log.min_offset()
            and tier.covers(commit_log_offset)
            and cold_read.missing(tier, commit_log_offset)
        )

    async def fetch_cold(self, commit_log_offset: int, size: int = 0) -> None:
        """Bring a tiered record (its first ``size`` bytes; 0: the whole record) into memory.
        Raises ObjectStoreError."""
        if self.tier is not None:
            await cold_read.fetch(self.tier, commit_log_offset, size)

    async def fetch_cold_read(self, result: GetMessageResult) -> None:
        """Bring into memory what a queue read stopped at (``result.cold``): a tiered record, or
        tiered ConsumeQueue units. Raises ObjectStoreError."""
        await self.fetch_cold_need(result.cold_offset, result.cold_units)

    async def fetch_cold_need(self, record_offset: int, units: int) -> None:
        if self.tier is None:
            return
        if units >= 0:
            await self.tier.load_units(units)
        if record_offset >= 0:
            await cold_read.fetch(self.tier, record_offset, 0)

    def look_message_by_offset(self, commit_log_offset: int) -> StoredMessage | None:
        raw = self.read_record(commit_log_offset)
        if raw is None:
            return None
        try:
            return decode_record(raw)
        except RecordError:
            return None

    async def read_record_cold(self, commit_log_offset: int) -> bytes | None:
        """A copy of the record at an offset, fetched from the tier when it is only there (again, a
        few times, when other readers evicted it before it was read)."""
        for _ in range(COLD_FETCH_TRIES):
            if self.cold(commit_log_offset):
                await self.fetch_cold(commit_log_offset)
            raw = self.read_record(commit_log_offset)
            if raw is not None:
                return bytes(raw)
            if not self.cold(commit_log_offset):
                return None
        return None

    async def look_message_by_offset_cold(self, commit_log_offset: int) -> StoredMessage | None:
        """``look_message_by_offset``, fetching from the tier when the record is only there (again,
        a few times, when other readers evicted it before it was read)."""
        for _ in range(COLD_FETCH_TRIES):
            if not self.cold(commit_log_offset):
                break
            await self.fetch_cold(commit_log_offset)
        return self.look_message_by_offset(commit_log_offset)

    def view_message_by_id(self, msg_id: str) -> StoredMessage | None:
        """Decode a message id (raises ValueError when malformed) and read its record."""
        _ip, _port, offset = decode_message_id(msg_id)
        return self.look_message_by_offset(offset)

    def query_message(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[StoredMessage]:
        """Messages of ``topic`` whose KEYS or UNIQ_KEY is ``key``, newest first."""
        if self.index is None:
            return []
        max_num = max(1, min(max_num, 64 * 1024))
        out: list[StoredMessage] = []
        # Ask for a few more offsets than wanted: hash collisions are dropped below.
        for phy in self.index.query(topic, key, max_num * 2, begin_ms, end_ms):
            if _keyed(self.look_message_by_offset(phy), topic, key, out) >= max_num:
                break
        return out

    async def query_message_cold(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[StoredMessage]:
        """``query_message`` over tiered messages too: the local IndexFiles find what they still
        hold, the tiered files' index objects the rest (ranged GETs on a worker thread), and each
        hit is fetched and decoded in turn."""
        if self.index is None:
            return []
        max_num = max(1, min(max_num, 64 * 1024))
        out: list[StoredMessage] = []
        offsets = self.index.query(topic, key, max_num * 2, begin_ms, end_ms)
        tier = self.tier
        if tier is not None and len(offsets) < max_num * 2:
            below = max(self.queues_floor, self.index.begin_phy_offset())  # (what the local files lack)
            seen = set(offsets)
            more = await asyncio.get_running_loop().run_in_executor(
                None, tier.keyed_offsets, topic, key, begin_ms, end_ms, below, max_num * 2 - len(offsets)
            )
            offsets += [phy for phy in more if phy not in seen]
        for phy in offsets:
            if _keyed(await self.look_message_by_offset_cold(phy), topic, key, out) >= max_num:
                break
        return out

    def min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        local = cq.min_offset_in_queue() if cq is not None else 0
        return queue_read.queue_min(self, topic, queue_id, local)

    def max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.max_offset_in_queue() if cq is not None else 0

    def offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``, over the
        local units (``offset_in_queue_by_time_cold``: over tiered messages too)."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp_ms, self.store_timestamp_at)

    async def offset_in_queue_by_time_cold(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """``offset_in_queue_by_time`` over tiered messages too: the search's probes of tiered
        records are fetched first."""
        if self.queues.get(topic, queue_id) is None:
            return 0
        return await cold_read.offset_by_time(self, topic, queue_id, timestamp_ms)

    def store_timestamp_at(self, commit_log_offset: int) -> int:
        """The store time of the record at an offset, tiered too when in memory (-1: none)."""
        if commit_log_offset < self.commit_log.min_offset() and self.tier is not None:
            return cold_read.store_timestamp(self.tier, commit_log_offset)
        return self.commit_log.store_timestamp_at(commit_log_offset)

    def commit_log_offset_in_queue(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """The CommitLog offset of a queue's unit (-1: none, or tiered units not in memory:
        ``commit_log_offset_in_queue_cold``)."""
        cq = self.queues.get(topic, queue_id)
        if cq is not None and queue_offset < cq.min_offset_in_queue() and self.tier is not None:
            found = self.tier.units(topic, queue_id, queue_offset, 1)
            return int(CQ_UNIT.unpack_from(found[0], 0)[0]) if isinstance(found, tuple) else -1
        u = cq.unit(queue_offset) if cq is not None else None
        return u[0] if u is not None else -1

    def unit_in_tier(self, topic: str, queue_id: int, queue_offset: int) -> bool:
        """The queue's unit at ``queue_offset`` is only in the tier's indexes."""
        cq = self.queues.get(topic, queue_id)
        return (
            self.tier is not None
            and cq is not None
            and queue_offset < cq.min_offset_in_queue()
            and self.tier.queues.first(topic, queue_id) is not None
        )

    async def commit_log_offset_in_queue_cold(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """``commit_log_offset_in_queue``, fetching tiered units first. Raises ObjectStoreError."""
        for _ in range(COLD_FETCH_TRIES):
            cq = self.queues.get(topic, queue_id)
            if self.tier is None or cq is None or queue_offset >= cq.min_offset_in_queue():
                break
            found = self.tier.units(topic, queue_id, queue_offset, 1)
            if not isinstance(found, int) or found >= 0:
                break
            await self.tier.load_units(-1 - found)
        return self.commit_log_offset_in_queue(topic, queue_id, queue_offset)

    def message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        phy = self.commit_log_offset_in_queue(topic, queue_id, queue_offset)
        return self.store_timestamp_at(phy) if phy >= 0 else -1

    def min_phy_offset(self) -> int:
        return self.commit_log.min_offset()

    def queues_local_floor(self) -> int:
        """Below which CommitLog offset the local ConsumeQueues and IndexFiles need hold nothing:
        the tier's index objects hold those units and keys (``Tier.units_floor``)."""
        local = self.commit_log.min_offset()
        return max(self.log_floor(), self.tier.units_floor(local)) if self.tier is not None else local

    def log_floor(self) -> int:
        """Where the messages this store can serve begin: the local log's first offset, or
        further back where the tier holds every file up to it."""
        local = self.commit_log.min_offset()
        return self.tier.floor(local) if self.tier is not None else local

    def max_phy_offset(self) -> int:
        return self.commit_log.max_offset()

    def topics(self) -> set[str]:
        return self.queues.topics()

    # --- retention -------------------------------------------------------------------------
    def clean_once(self, now_s: float | None = None) -> retention.CleanReport:
        """Delete files past retention, watch the disk, resume writes when room returns. Run it
        on the thread that reads (the broker's loop): see ``retention``. ``now_s`` defaults to
        the store's clock (the one store timestamps come from)."""
        return retention.clean_once(self, self.clock_ms() / 1000 if now_s is None else now_s)

    async def run_maintenance(self) -> None:
        """Run ``clean_once`` every ``clean_resource_interval_ms`` until cancelled."""
        interval = self.config.clean_resource_interval_ms / 1000
        while self.running:
            try:
                self.clean_once()
            except Exception:
                log.exception("store maintenance failed")
            await asyncio.sleep(interval)
