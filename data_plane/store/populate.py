"""PopulateAheadService: maps the CommitLog's next pages before the writer reaches them.

A write to a page of a shared file mapping that the process has not mapped yet is a page
fault; on the virtual machines Orbit runs on a fault costs 4-7 us, about 2 us for every 1 KiB
message — as much as the whole append. This thread keeps the ``populate_ahead_bytes`` after
the write position mapped (``MADV_POPULATE_WRITE``, through the compiled ``_speedups.populate``,
which releases the GIL), so the writer takes no faults. Pages behind the flush point are
dropped again (``MessageStore._after_log_flush``), so resident memory stays bounded.

Without the compiled module this service does not run (a Python-level madvise would hold the
GIL and fault on the writer's behalf anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)


class PopulateAheadService(ServiceThread):
    name = "orbit-populate-ahead"

    def __init__(self, mfq: MappedFileQueue, *, window_bytes: int, populate: Callable[[memoryview, int, int], int]):
        super().__init__()
        self._mfq = mfq
        self._window = window_bytes
        self._populate = populate

    def run(self) -> None:
        idle_s = 0.002
        while not self._stop.is_set():
            mf = self._mfq.last
            if mf is None or mf.destroyed:
                self.wait_for_running(idle_s)
                continue
            wrote = mf.wrote_position
            target = min(mf.file_size, wrote + self._window)
            if mf.populated_upto >= target:
                self.wait_for_running(idle_s)
                continue
            start = max(mf.populated_upto, wrote - wrote % PAGE_SIZE_BYTES)
            # At most a quarter window a call: the writer never waits long for this thread.
            end = min(target, start + max(self._window // 4, PAGE_SIZE_BYTES))
            err = self._populate(mf.mv, start, end - start)
            if err:
                log.warning("populating %s stopped (errno %d); the writer maps its own pages", mf.path, err)
                mf.populated_upto = mf.file_size
            else:
                mf.populated_upto = end
