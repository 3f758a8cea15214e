"""Flush services: the threads that make written bytes durable, off the event loop.

* ``FlushRealTimeService`` (ASYNC_FLUSH): every ``flush_interval_commit_log_ms`` it flushes the
  CommitLog once ``flush_commit_log_least_pages`` pages are dirty, and everything at least every
  ``flush_commit_log_thorough_interval_ms``.
* ``GroupCommitService`` (SYNC_FLUSH): appenders hand in "durable up to offset X" requests; one
  ``fdatasync`` answers every request waiting at that moment (group commit). Answers go back to
  each waiter's event loop with one ``call_soon_threadsafe`` per loop per round.
* ``FlushConsumeQueueService``: flushes ConsumeQueues and IndexFiles, then writes the checkpoint
  (the log offsets below which each structure is durable).

All three run on their own threads and call ``fdatasync``, which releases the GIL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)

Waiter = asyncio.Future[bool] | concurrent.futures.Future[bool]


class FlushRealTimeService(ServiceThread):
    name = "orbit-flush-commitlog"

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
    name = "orbit-group-commit"

    def __init__(self, mfq: MappedFileQueue, *, after_flush: Callable[[], None], max_pending: int = 1_000_000):
        super().__init__()
        self._mfq = mfq
        self._after_flush = after_flush
        self._cond = threading.Condition()
        self._requests: list[tuple[int, Waiter]] = []
        self._max_pending = max_pending

    def submit(self, next_offset: int, waiter: Waiter) -> bool:
        """Ask for the log to be durable up to ``next_offset``; ``waiter`` gets True once it is
        (False on an I/O error). Returns False when the queue of waiters is full."""
        with self._cond:
            if len(self._requests) >= self._max_pending:
                return False
            self._requests.append((next_offset, waiter))
            if len(self._requests) == 1:
                self._cond.notify()
        return True

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify()
        super().stop()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._requests and not self._stop.is_set():
                    self._cond.wait(0.5)
                requests, self._requests = self._requests, []
            if not requests:
                if self._stop.is_set():
                    return
                continue
            self._serve(requests)

    def _serve(self, requests: list[tuple[int, Waiter]]) -> None:
        target = max(r[0] for r in requests)
        mfq = self._mfq
        error = False
        try:
            for _ in range(len(mfq.files) + 2):
                if mfq.flushed_where >= target:
                    break
                mfq.flush(0)
        except OSError:
            log.exception("group commit flush failed")
            error = True
        flushed = mfq.flushed_where
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[bool], bool]]] = {}
        for offset, waiter in requests:
            ok = not error and offset <= flushed
            if isinstance(waiter, asyncio.Future):
                by_loop.setdefault(waiter.get_loop(), []).append((waiter, ok))
            elif not waiter.done():
                waiter.set_result(ok)
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve_all, items)
        self._after_flush()


def _resolve_all(items: list[tuple[asyncio.Future[bool], bool]]) -> None:
    for fut, ok in items:
        if not fut.done():
            fut.set_result(ok)


class FlushConsumeQueueService(ServiceThread):
    """Flushes ConsumeQueues and IndexFiles and then records the checkpoint."""

    name = "orbit-flush-consumequeue"

    def __init__(self, *, interval_ms: int, flush_once: Callable[[bool], Any]) -> None:
        super().__init__()
        self._interval_s = interval_ms / 1000
        self._flush_once = flush_once

    def run(self) -> None:
        while self.wait_for_running(self._interval_s):
            self._flush_once(False)
        self._flush_once(True)
