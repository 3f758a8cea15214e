"""IndexFlush: the flush thread's round over the indexes — ConsumeQueues and IndexFiles written
to disk, the blocks busy ones will write next reserved ahead of the writer, and the checkpoint
recorded after them (``StoreConfig.flush_interval_consume_queue_ms``; docs/store.md, "Flushing"
and "Reserving ahead")."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from data_plane.store.consume_queue import ConsumeQueue

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)

RESERVE_WARNING_INTERVAL_S = 60.0  # a failing reserve-ahead (a full disk) is logged at most this often


SYNC_ALL_OVER = 64  # more queues than this to flush: one sync(2) for all of them


def flush_queues(queues: list[ConsumeQueue], least_pages: int) -> None:
    """Flush ``queues``; thousands of them with one sync(2) instead of an open/fdatasync/close
    per file. Blocking: for a thread other than the event loop's."""
    if len(queues) > SYNC_ALL_OVER:
        marks = [(cq, cq.mfq.max_offset()) for cq in queues]
        os.sync()
        for cq, where in marks:
            cq.mark_flushed(where)
    else:
        for cq in queues:
            cq.flush(least_pages)


class IndexFlush:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.flushed_at = -float("inf")  # time.monotonic() of the last IndexFile flush
        self._warned_at = -float("inf")  # time.monotonic() of the last reserve-ahead warning

    def reserve_ahead(self, queues: list[ConsumeQueue]) -> None:
        """Reserve the blocks ``queues`` and the newest IndexFile will be written into next,
        ``reserve_indexes_ahead_s`` of their rate since the last call ahead: the zero-filling ``pwrite``
        then happens here, on the flush thread, instead of stalling the writer's event loop for
        milliseconds when a busy queue or the IndexFile runs out of reserved blocks (with eight
        equally busy queues they all ran out at once). A full disk is logged and left to the
        write path, which answers it."""
        store = self.store
        rounds = store.config.reserve_indexes_ahead_s * 1000 / store.config.flush_interval_consume_queue_ms
        try:
            for cq in queues:
                cq.reserve_ahead(rounds)
            if store.index is not None and store.index.files:
                store.index.files[-1].reserve_ahead(rounds)
        except OSError as e:
            now = time.monotonic()
            if now - self._warned_at >= RESERVE_WARNING_INTERVAL_S:  # not every round of a full disk
                self._warned_at = now
                log.warning("cannot reserve index blocks ahead of the writer: %s", e)

    def flush(self, thorough: bool) -> None:
        """Flush ConsumeQueues and IndexFiles, then record the checkpoint."""
        store = self.store
        cfg = store.config
        dispatched = store.dispatcher.dispatched_offset
        least = 0 if thorough else cfg.flush_consume_queue_least_pages
        queues = list(store.queues)
        dirty = [cq for cq in queues if cq.dirty_pages() >= max(least, 1)]
        if cfg.reserve_indexes_ahead_s > 0 and store.running:
            # Only the queues written this round (those with a round's pages dirty); a queue
            # taking less reserves its small chunks itself. (A walk over all 10,000 queues
            # takes ~2 ms a round; docs/store.md, "Reserving ahead".)
            self.reserve_ahead(dirty)
        flush_queues(dirty, least)
        if cfg.release_flushed_pages:
            for cq in dirty:
                cq.mfq.release_flushed_pages(64 * 1024)
        cp = store.checkpoint
        now = store.clock_ms()
        at = time.monotonic()
        # The IndexFiles keep their own cadence (StoreConfig.flush_interval_index_ms): between
        # their flushes the checkpoint keeps the index offset of the last one.
        if store.index is None or thorough or (at - self.flushed_at) * 1000 >= cfg.flush_interval_index_ms:
            if store.index is not None:
                store.index.flush()
                self.flushed_at = at
            cp.index_offset, cp.index_msg_timestamp = dispatched, now
        if store.index is not None and cfg.release_flushed_pages:
            # Entry pages behind the newest leave the page tables every round, flushed or not
            # (the page cache keeps them, dirty ones too): tied to the 30 s index flush, a fast
            # writer left ~180 MiB of them resident between two flushes.
            for f in store.index.files:
                f.release_entries(1 << 20)
        cp.physic_offset = store.commit_log.mfq.flushed_where
        # Units and entries for every record below `dispatched` were written before the
        # flushes above began, so they are durable now.
        cp.logics_offset = dispatched
        cp.physic_msg_timestamp = cp.logics_msg_timestamp = now
        try:
            cp.flush()
        except OSError:
            log.exception("checkpoint write failed")
