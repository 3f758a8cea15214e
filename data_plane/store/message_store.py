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
import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any

from data_plane.store import fastpath, retention
from data_plane.store.checkpoint import StoreCheckpoint, create_abort_file, delete_abort_file
from data_plane.store.commit_log import CommitLog, PutRefused
from data_plane.store.config import FlushDiskType, StoreConfig
from data_plane.store.consume_queue import CQ_UNIT, ConsumeQueue
from data_plane.store.dispatcher import ConsumeQueueTable, Dispatcher
from data_plane.store.fastpath import PlainBatch
from data_plane.store.flush import (
    FlushConsumeQueueService,
    FlushRealTimeService,
    GroupCommitService,
)
from data_plane.store.index_file import IndexService
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
from data_plane.store.recovery import adopt_queue_state, recover
from data_plane.store.reserve_ahead import ReserveAheadService, release_with_madvise
from data_plane.store.status import (
    AppendMessageStatus,
    AppendResult,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

log = logging.getLogger(__name__)

RecordFilter = Callable[[memoryview], bool]


# (log offset the append ends at, deadline on the loop's clock, future)
FlushWaiter = tuple[int, float, "asyncio.Future[bool]"]
_MAX_FLUSH_WAITERS = 1_000_000
RESERVE_WARNING_INTERVAL_S = 60.0  # a failing reserve-ahead (a full disk) is logged at most this often


class _FlushWaiters(collections.deque[FlushWaiter]):
    """One event loop's appends waiting for a group commit, in log order, and whether that
    loop's timer sweeping the ones past their deadline is scheduled (one per loop)."""

    __slots__ = ("sweeper_scheduled",)

    def __init__(self) -> None:
        super().__init__()
        self.sweeper_scheduled = False


def _resolve_flushed(waiters: collections.deque[FlushWaiter], durable: int, ok: bool) -> None:
    """On the loop: every waiter whose bytes are now durable gets True (in log order); after a
    failed flush, the rest get False."""
    while waiters and waiters[0][0] <= durable:
        fut = waiters.popleft()[2]
        if not fut.done():
            fut.set_result(True)
    if not ok:
        while waiters:
            fut = waiters.popleft()[2]
            if not fut.done():
                fut.set_result(False)


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
        self.checkpoint = StoreCheckpoint(config.checkpoint_path)
        self._index_flushed_at = -float("inf")  # time.monotonic() of the last IndexFile flush
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
        self._reserve_warned_at = -float("inf")  # time.monotonic() of the last reserve-ahead warning
        self._put_count = 0  # (``put_count``; the compiled entry points count their own)
        self._put_bytes = 0
        self._entry: Any = None
        self._busy_timeout_s = config.os_page_cache_busy_timeout_ms / 1000
        self._sync_timeout_s = config.sync_flush_timeout_ms / 1000
        self._loop_waiters: dict[asyncio.AbstractEventLoop, _FlushWaiters] = {}
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

    def _recover(self, crashed: bool) -> None:
        """Find where the log really ends, and make every index agree with it."""
        self.recovered_abnormally = crashed
        recover(self, crashed=crashed)

    def _install_entry(self) -> None:
        """With the compiled Appender, ``append`` and ``append_plain`` of this store become the
        compiled entry points (``_speedups.StoreEntry``): the same answers in one C call — one
        message through ``Appender.append``, a batch through ``Appender.append_batch`` — which
        hands whatever it does not take to the Python methods (``_append_general``; None from
        ``append_plain``). The class's methods stay the reference."""
        speedups = fastpath.speedups_module()
        if self._appender is None or speedups is None:
            return
        old = self._entry
        if old is not None:  # (a restart: what the last one counted stays counted)
            self._put_count += old.count
            self._put_bytes += old.bytes
        entry = speedups.StoreEntry(
            self._appender, self, self.commit_log.lock, PutMessageResult, PutMessageStatus.PUT_OK, self._host_hex,
            vars(fastpath), AppendResult, AppendMessageStatus.PUT_OK,
        )  # fmt: skip
        self._entry = entry
        # Instance attributes shadow the methods (the broker and benchmarks look them up once).
        setattr(self, "append", entry.append)  # noqa: B010
        setattr(self, "append_plain", entry.append_plain)  # noqa: B010

    @property
    def put_count(self) -> int:
        """Messages this store has appended (over its restarts too)."""
        entry = self._entry
        return self._put_count + (entry.count if entry is not None else 0)

    @property
    def put_bytes(self) -> int:
        """CommitLog bytes this store has appended (over its restarts too)."""
        entry = self._entry
        return self._put_bytes + (entry.bytes if entry is not None else 0)

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
        """Reserve the blocks ``queues`` and the newest IndexFile will be written into next,
        ``reserve_indexes_ahead_s`` of their rate since the last call ahead: the zero-filling ``pwrite``
        then happens here, on the flush thread, instead of stalling the writer's event loop for
        milliseconds when a busy queue or the IndexFile runs out of reserved blocks (with eight
        equally busy queues they all ran out at once). A full disk is logged and left to the
        write path, which answers it."""
        rounds = self.config.reserve_indexes_ahead_s * 1000 / self.config.flush_interval_consume_queue_ms
        try:
            for cq in queues:
                cq.reserve_ahead(rounds)
            if self.index is not None and self.index.files:
                self.index.files[-1].reserve_ahead(rounds)
        except OSError as e:
            now = time.monotonic()
            if now - self._reserve_warned_at >= RESERVE_WARNING_INTERVAL_S:  # not every round of a full disk
                self._reserve_warned_at = now
                log.warning("cannot reserve index blocks ahead of the writer: %s", e)

    def flush_indexes(self, thorough: bool) -> None:
        """Flush ConsumeQueues and IndexFiles, then record the checkpoint."""
        cfg = self.config
        dispatched = self.dispatcher.dispatched_offset
        least = 0 if thorough else cfg.flush_consume_queue_least_pages
        queues = list(self.queues)
        dirty = [cq for cq in queues if cq.dirty_pages() >= max(least, 1)]
        if cfg.reserve_indexes_ahead_s > 0 and self.running:
            # Only the queues written this round (those with a round's pages dirty); a queue
            # taking less reserves its small chunks itself. (A walk over all 10,000 queues
            # takes ~2 ms a round; docs/store.md, "Reserving ahead".)
            self.reserve_indexes_ahead(dirty)
        if len(dirty) > 64:
            # Thousands of queues: one sync(2) instead of an open/fdatasync/close per file.
            marks = [(cq, cq.mfq.max_offset()) for cq in dirty]
            os.sync()
            for cq, where in marks:
                cq.mark_flushed(where)
        else:
            for cq in dirty:
                cq.flush(least)
        if cfg.release_flushed_pages:
            for cq in dirty:
                cq.mfq.release_flushed_pages(64 * 1024)
        cp = self.checkpoint
        now = self.clock_ms()
        at = time.monotonic()
        # The IndexFiles keep their own cadence (StoreConfig.flush_interval_index_ms): between
        # their flushes the checkpoint keeps the index offset of the last one.
        if self.index is None or thorough or (at - self._index_flushed_at) * 1000 >= cfg.flush_interval_index_ms:
            if self.index is not None:
                self.index.flush()
                self._index_flushed_at = at
            cp.index_offset, cp.index_msg_timestamp = dispatched, now
        if self.index is not None and cfg.release_flushed_pages:
            # Entry pages behind the newest leave the page tables every round, flushed or not
            # (the page cache keeps them, dirty ones too): tied to the 30 s index flush, a fast
            # writer left ~180 MiB of them resident between two flushes.
            for f in self.index.files:
                f.release_entries(1 << 20)
        cp.physic_offset = self.commit_log.mfq.flushed_where
        # Units and entries for every record below `dispatched` were written before the
        # flushes above began, so they are durable now.
        cp.logics_offset = dispatched
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = now
        try:
            cp.flush()
        except OSError:
            log.exception("checkpoint write failed")

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
                    return self._stored_one(r), r[0] + r[1]
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
    ) -> tuple[int, ...] | PutMessageResult | None:
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
            r: tuple[int, ...] | None = appender.append_plain(
                topic, queue_id, body, properties, flag, sys_flag, born_timestamp, born_host, reconsume_times,
                skip_names,
            )  # fmt: skip
        except OSError as e:  # the CommitLog file refused the bytes: nothing recorded
            return self._io_refusal(e)
        finally:
            lock.release()
        if r is not None:  # (_stored_one's bookkeeping, inline: no result object made here)
            if r[4]:
                self._dispatch_failed()
            self._put_count += 1
            self._put_bytes += r[1]
        return r

    def stored_result(self, r: tuple[int, ...]) -> PutMessageResult:
        """PUT_OK for the record ``append_plain`` answered ``r`` for."""
        return PutMessageResult.stored(r, self._host_hex)

    def _stored_one(self, r: tuple[int, ...]) -> PutMessageResult:
        """The result of one record the compiled Appender wrote (``append``; ``append_plain``
        does the same bookkeeping inline): ``r`` is its (offset, size, store timestamp, queue
        offset, dispatch failed, ...)."""
        if r[4]:
            self._dispatch_failed()
        self._put_count += 1
        self._put_bytes += r[1]
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
        result, end = self.append(msgs)
        if end < 0 or not self._wants_flush_wait(msgs):
            return result
        assert self._group_commit is not None
        loop = asyncio.get_running_loop()
        waiters = self._loop_waiters.get(loop)
        if waiters is None:
            waiters = self._watch_flushes(loop)
        if len(waiters) >= _MAX_FLUSH_WAITERS:
            result.status = PutMessageStatus.OS_PAGECACHE_BUSY
            result.reason = "too many appends waiting for a flush"
            return result
        fut: asyncio.Future[bool] = loop.create_future()
        waiters.append((end, loop.time() + self._sync_timeout_s, fut))
        # At once, not at the end of the loop turn: the flush then overlaps the turn's other
        # appends (asking once a turn instead measured 22-26k against 28-33k msgs/s).
        self._group_commit.request(end)
        if not waiters.sweeper_scheduled:
            waiters.sweeper_scheduled = True
            loop.call_later(0.05, self._sweep_flush_waiters, loop)
        if not await fut:
            result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
            result.reason = "not flushed within sync_flush_timeout_ms"
        return result

    def _watch_flushes(self, loop: asyncio.AbstractEventLoop) -> _FlushWaiters:
        """Waiters of one event loop, answered when the group commit says how far it got."""
        waiters = _FlushWaiters()
        self._loop_waiters[loop] = waiters

        def on_flushed(durable: int, ok: bool) -> None:  # on the flush thread
            if waiters:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                    loop.call_soon_threadsafe(_resolve_flushed, waiters, durable, ok)

        assert self._group_commit is not None
        self._group_commit.add_listener(on_flushed)
        return waiters

    def _sweep_flush_waiters(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer FLUSH_DISK_TIMEOUT to waiters past their deadline (one timer for all of them,
        not one per append). Deadlines grow with the waiters' order."""
        waiters = self._loop_waiters.get(loop)
        now = loop.time()
        while waiters and (waiters[0][2].done() or waiters[0][1] <= now):
            fut = waiters.popleft()[2]
            if not fut.done():
                fut.set_result(False)
        if waiters:
            loop.call_later(0.05, self._sweep_flush_waiters, loop)
        elif waiters is not None:
            waiters.sweeper_scheduled = False

    def put_messages_blocking(self, msgs: Sequence[Message]) -> PutMessageResult:
        """``put_messages`` for callers without an event loop (tools, benchmarks)."""
        result, end = self.append(msgs)
        if end < 0 or not self._wants_flush_wait(msgs):
            return result
        assert self._group_commit is not None
        done = threading.Event()

        def on_flushed(durable: int, ok: bool) -> None:
            if durable >= end or not ok:
                done.set()

        self._group_commit.add_listener(on_flushed)
        try:
            self._group_commit.request(end)
            ok = done.wait(self._sync_timeout_s) and self.commit_log.mfq.flushed_where >= end
        finally:
            self._group_commit.remove_listener(on_flushed)
        if not ok:
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
        every queue where the received records left it (``adopt_queue_state``)."""
        self.dispatch_pending()
        end = self.dispatcher.dispatched_offset
        if end < self.commit_log.max_offset():
            self.truncate_log(end)  # adopts the queues' state itself
        else:
            with self.commit_log.lock:
                adopt_queue_state(self)
        return self.commit_log.max_offset()

    def dispatch_pending(self) -> None:
        """Dispatch whatever ``append_raw(..., dispatch=False)`` wrote and nothing indexed yet."""
        with self.commit_log.lock:
            self.dispatcher.redispatch(self.commit_log, self.dispatcher.dispatched_offset)

    def truncate_log(self, offset: int) -> None:
        """A slave whose log diverged from its master's: drop every record at or past
        ``offset`` (a record boundary) and every ConsumeQueue unit and index entry naming them,
        as recovery does for a torn tail; then record a checkpoint that agrees."""
        cl = self.commit_log
        with cl.lock:
            if offset >= cl.max_offset():
                return
            log.warning("truncating the CommitLog from %d to %d (diverged from the master)", cl.max_offset(), offset)
            cl.mfq.truncate_dirty_files(offset)
            for cq in self.queues:
                cq.truncate_dirty(offset)
            adopt_queue_state(self)
            redispatch_from = offset
            if self.index is not None:
                self.index.truncate_after(offset)
                ix_end = self.index.end_phy_offset()
                redispatch_from = min(offset, ix_end if ix_end >= 0 else cl.min_offset())
            self.dispatcher.dispatched_offset = max(redispatch_from, cl.min_offset())
            self.dispatcher.redispatch(cl, self.dispatcher.dispatched_offset)
            self.dispatcher.dispatched_offset = min(self.dispatcher.dispatched_offset, cl.max_offset())
        self.flush_indexes(True)

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
        """Up to ``max_msg_nums`` messages of a queue from ``offset``: RocketMQ's pull read.
        ``tags_codes`` filters on the ConsumeQueue's tag hash (None: every tag);
        ``record_filter`` is then applied to each record's bytes. With ``coalesce`` (the wire
        form a pull answers with), records that lie back to back in the CommitLog come as one
        slice of ``messages``; ``queue_offsets`` still has one entry per message."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=0)
        min_offset = cq.min_offset_in_queue()
        max_offset = cq.max_offset_in_queue()
        result = GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, min_offset=min_offset, max_offset=max_offset)
        if max_offset == 0:
            result.status = GetMessageStatus.NO_MESSAGE_IN_QUEUE
            result.next_begin_offset = 0
            return result
        if offset < min_offset:
            result.status = GetMessageStatus.OFFSET_TOO_SMALL
            result.next_begin_offset = min_offset
            return result
        if offset == max_offset:
            result.status = GetMessageStatus.OFFSET_OVERFLOW_ONE
            result.next_begin_offset = offset
            return result
        if offset > max_offset:
            result.status = GetMessageStatus.OFFSET_OVERFLOW_BADLY
            result.next_begin_offset = min_offset if min_offset == 0 else max_offset
            return result
        max_msg_nums = max(1, max_msg_nums)
        # Scan at least a page of units so that a selective tag filter still makes progress.
        found = cq.units(offset, max(max_msg_nums, 800 if tags_codes is not None or record_filter else 0))
        if found is None:
            result.status = GetMessageStatus.OFFSET_FOUND_NULL
            result.next_begin_offset = offset + 1
            return result
        units, n = found
        cl = self.commit_log
        log_min = cl.min_offset()
        max_bytes = self.config.max_transfer_bytes_on_message
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        messages = result.messages
        queue_offsets = result.queue_offsets
        total_bytes = 0
        unpack = CQ_UNIT.unpack_from
        # The compiled loop when built; the pure-Python twin of it is no faster than the loop below.
        collect = fastpath.collect_units if fastpath.COMPILED and record_filter is None else None
        cur = None
        cur_from = cur_end = 0
        i = 0
        last_phy = 0
        run_at = run_end = -1  # coalesce: the last slice below covers [run_at, ...) of cur, up to run_end (log)
        while i < n:
            if collect is not None:  # the common units, in a loop of their own
                i, total_bytes, took, full = collect(
                    units, i, n, cur, cur_from, cur_end, log_min, max_msg_nums, max_bytes, total_bytes,
                    tags_codes, messages, queue_offsets, offset, coalesce,
                )  # fmt: skip
                run_end = -1
                if took:
                    last_phy = took
                if full or i >= n:
                    break
            # One unit the loop above stopped at (or every unit, without it).
            phy, size, tags = unpack(units, i * 20)
            if queue_offsets and (len(queue_offsets) >= max_msg_nums or total_bytes + size > max_bytes):
                break
            i += 1
            if phy < log_min or size <= 0:
                if not messages:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            if tags_codes is not None and tags not in tags_codes:
                continue
            if not cur_from <= phy < cur_end:
                mf = cl.mfq.find_by_offset(phy)
                if mf is None:
                    if not messages:
                        status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
                cur = mf.mv
                cur_from = mf.file_from_offset
                cur_end = cur_from + mf.wrote_position
                run_end = -1
                if collect is not None and cur_from <= phy < cur_end:
                    i -= 1  # the loop above takes this unit, and those after it, from the file
                    continue
            pos = phy - cur_from
            if phy + size > cur_end or cur is None:
                if not messages:
                    status = GetMessageStatus.OFFSET_FOUND_NULL
                continue
            record = cur[pos : pos + size]
            if record_filter is not None and not record_filter(record):
                continue
            if coalesce and phy == run_end:
                messages[-1] = cur[run_at : pos + size]
            else:
                messages.append(record)
                run_at = pos
            run_end = phy + size
            queue_offsets.append(offset + i - 1)
            total_bytes += size
            last_phy = phy
        if messages:  # any other status is only ever set while nothing was found
            status = GetMessageStatus.FOUND
        result.status = status
        result.next_begin_offset = offset + i
        result.buffer_total_size = total_bytes
        if messages:
            behind = cl.max_offset() - last_phy
            result.suggest_pulling_from_slave = behind > self.hot_data_bytes
        return result

    def read_record(self, commit_log_offset: int) -> memoryview | None:
        """The raw record at a CommitLog offset (what a PULL ships), or None."""
        return self.commit_log.read_record(commit_log_offset)

    def look_message_by_offset(self, commit_log_offset: int) -> StoredMessage | None:
        raw = self.commit_log.read_record(commit_log_offset)
        if raw is None:
            return None
        try:
            return decode_record(raw)
        except RecordError:
            return None

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
            msg = self.look_message_by_offset(phy)
            if msg is None or msg.topic != topic:
                continue
            if key in msg.keys or msg.properties.get("UNIQ_KEY") == key:
                out.append(msg)
                if len(out) >= max_num:
                    break
        return out

    def min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.min_offset_in_queue() if cq is not None else 0

    def max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.max_offset_in_queue() if cq is not None else 0

    def offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp_ms, self.commit_log.store_timestamp_at)

    def commit_log_offset_in_queue(self, topic: str, queue_id: int, queue_offset: int) -> int:
        cq = self.queues.get(topic, queue_id)
        u = cq.unit(queue_offset) if cq is not None else None
        return u[0] if u is not None else -1

    def message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        phy = self.commit_log_offset_in_queue(topic, queue_id, queue_offset)
        return self.commit_log.store_timestamp_at(phy) if phy >= 0 else -1

    def min_phy_offset(self) -> int:
        return self.commit_log.min_offset()

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
