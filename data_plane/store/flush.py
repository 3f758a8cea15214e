"""Flush services: the threads that make written bytes durable, off the event loop.

* ``FlushRealTimeService`` (ASYNC_FLUSH): every ``flush_interval_commit_log_ms`` it flushes the
  CommitLog once ``flush_commit_log_least_pages`` pages are dirty, and everything at least every
  ``flush_commit_log_thorough_interval_ms``.
* ``GroupCommitService`` (SYNC_FLUSH): appenders hand in "durable up to offset X" requests; one
  ``fdatasync`` answers every request waiting at that moment (group commit). The answer — how
  far the log is durable — goes to each waiting event loop with one ``call_soon_threadsafe``
  per round; the loop resolves its own waiters.
* ``FlushConsumeQueueService``: flushes ConsumeQueues and IndexFiles, then writes the checkpoint
  (the log offsets below which each structure is durable).

All three run on their own threads and call ``fdatasync``, which releases the GIL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)


class FlushRealTimeService(ServiceThread):
    name = "orbit-flush-commitlog"
    background = True  # a lower priority (service.py)

    def __init__(
        self,
        mfq: MappedFileQueue,
        *,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        after_flush: Callable[[], None],
    ) -> None:
        super().__init__()
        self._mfq = mfq
        self._interval_s = interval_ms / 1000
        self._least_pages = least_pages
        self._thorough_s = thorough_interval_ms / 1000
        self._after_flush = after_flush

    def run(self) -> None:
        last_thorough = time.monotonic()
        while self.wait_for_running(self._interval_s):
            least = self._least_pages
            now = time.monotonic()
            if now - last_thorough >= self._thorough_s:
                least = 0
                last_thorough = now
            self._flush(least)
        self._flush(0)

    def _flush(self, least_pages: int) -> None:
        for _ in range(len(self._mfq.files) + 1):
            if self._mfq.flush(least_pages):
                break
        self._after_flush()


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH's flusher. Appenders ask for "durable up to X" (``request``); the thread
    flushes up to the highest offset asked for — one ``fdatasync`` for every append waiting at
    that moment — and then tells each listener how far the log is durable. Waiters stay with
    their own event loop (``MessageStore``): per round this thread does O(1) Python work."""

    name = "orbit-group-commit"

    def __init__(self, mfq: MappedFileQueue, *, after_flush: Callable[[], None]):
        super().__init__()
        self._mfq = mfq
        self._after_flush = after_flush
        self._requested = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[int, bool], None]] = []

    def add_listener(self, listener: Callable[[int, bool], None]) -> None:
        """``listener(durable_offset, ok)`` runs on this thread after every round."""
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Callable[[int, bool], None]) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def request(self, offset: int) -> None:
        if offset > self._requested:
            with self._lock:
                self._requested = max(self._requested, offset)
        if not self._wakeup.is_set():  # Event.set takes a lock: skip it when already set
            self._wakeup.set()

    def run(self) -> None:
        mfq = self._mfq
        while True:
            self._wakeup.wait(0.5)
            self._wakeup.clear()
            stopping = self._stop.is_set()
            target = self._requested
            ok = True
            if target > mfq.flushed_where:
                try:
                    for _ in range(len(mfq.files) + 2):
                        if mfq.flushed_where >= target:
                            break
                        mfq.flush(0)
                except OSError:
                    log.exception("group commit flush failed")
                    ok = False
                for listener in self._listeners:
                    try:
                        listener(mfq.flushed_where, ok)
                    except Exception:  # one broken listener must not stop the flusher
                        log.exception("group commit listener failed")
                self._after_flush()
            if stopping:
                return


class FlushConsumeQueueService(ServiceThread):
    """Flushes ConsumeQueues and IndexFiles and then records the checkpoint."""

    name = "orbit-flush-consumequeue"
    background = True  # a lower priority (service.py)

    def __init__(self, *, interval_ms: int, flush_once: Callable[[bool], Any]) -> None:
        super().__init__()
        self._interval_s = interval_ms / 1000
        self._flush_once = flush_once

    def run(self) -> None:
        while self.wait_for_running(self._interval_s):
            self._flush_once(False)
        self._flush_once(True)
