"""ReserveAheadService: prepares the CommitLog's next bytes before the writer reaches them.

Two things must happen to a page of the CommitLog before an append writes it through the
mapping, and both are slow enough to matter on the hot path:

* its disk blocks must be **reserved**, so that a full disk is an ENOSPC at reservation time
  and never a SIGBUS in the middle of an append. CommitLog files are created with every block
  reserved (``posix_fallocate``, by ``AllocateMappedFileService`` ahead of need, or on the write
  path); only a file reopened after recovery truncated it has an unreserved tail, which this
  thread reserves;
* it should be **mapped** into the process (``MADV_POPULATE_WRITE`` through the compiled
  ``_speedups.populate``, which releases the GIL): the page fault that maps a new page cache
  page — zeroing 4 KiB in the kernel — costs 2-7 us on the virtual machines Orbit runs on, up
  to 40 % of a batched append. Done here, it happens on the other core.

This thread keeps ``reserve_ahead_bytes`` (128 MiB) after the write position reserved and
mapped. A writer that catches up simply takes its own faults. Pages behind the flush point are
dropped again (``MessageStore._after_log_flush``), so resident memory stays bounded (the window
plus 16 MiB). Without the compiled module the mapping step is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)


class ReserveAheadService(ServiceThread):
    name = "orbit-reserve-ahead"

    def __init__(
        self,
        mfq: MappedFileQueue,
        *,
        window_bytes: int,
        populate: Callable[[memoryview, int, int], int] | None,
    ) -> None:
        super().__init__()
        self._mfq = mfq
        self._window = window_bytes
        self._step = max(window_bytes // 4, PAGE_SIZE_BYTES)
        self._populate = populate

    def run(self) -> None:
        while not self._stop.is_set():
            mf = self._mfq.last
            if mf is None or mf.destroyed:
                self.wait_for_running(0.002)
                continue
            wrote = mf.wrote_position
            target = min(mf.file_size, wrote + self._window)
            worked = False
            if mf.reserved_upto < target:
                try:
                    mf.ensure_reserved(min(target, mf.reserved_upto + self._step), self._step)
                    worked = True
                except OSError as e:
                    log.warning("cannot reserve %s ahead of the writer: %s", mf.path, e)
                    self.wait_for_running(1.0)
                    continue
            populate = self._populate
            ready = min(target, mf.reserved_upto)
            if populate is not None and mf.populated_upto < ready:
                start = max(mf.populated_upto, wrote - wrote % PAGE_SIZE_BYTES)
                end = min(ready, start + self._step)
                err = populate(mf.mv, start, end - start) if end > start else 0
                if err:
                    log.warning("mapping %s ahead stopped (errno %d); the writer maps its own pages", mf.path, err)
                    mf.populated_upto = mf.file_size
                else:
                    mf.populated_upto = end
                worked = True
            if not worked:
                self.wait_for_running(0.002)
