"""ReserveAheadService: keeps the CommitLog's next blocks reserved and its past pages unmapped.

* **Reserve ahead.** Every block of the CommitLog must be allocated before an append writes it,
  so that a full disk is an ENOSPC at reservation time, never a failure half-way through a
  record. CommitLog files are created with every block reserved (``posix_fallocate``, by
  ``AllocateMappedFileService`` ahead of need, or on the write path); only a file reopened
  after recovery truncated it has an unreserved tail, which this thread reserves
  ``reserve_ahead_bytes`` (128 MiB) ahead of the writer, off the writer's thread.
* **Release behind.** Appends are ``pwrite``s; the mapping is only read (consumers, lookups),
  and pages it has read stay in the process's page tables. This thread drops the pages more
  than ``release_keep_bytes`` (16 MiB) behind the writer from them (the page cache keeps them),
  so resident memory does not grow with the amount stored. Without the compiled module the
  release holds the GIL.

The thread polls the writer's position: every 2 ms while there is work, backing off to 64 ms
while there is none. Each wake-up takes the GIL from the event loop; at a fixed 2 ms that was
~500 handoffs a second on an idle or lightly written store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)

BUSY_POLL_S = 0.002  # the wait after a round that reserved or released something
IDLE_POLL_MAX_S = 0.064  # the longest wait, reached by doubling while rounds find nothing to do


Release = Callable[[MappedFile, int, int], None]


def release_with_madvise(mf: MappedFile, start: int, end: int) -> None:
    """The pure-Python release (holds the GIL for the madvise)."""
    mf.release_range(start, end)


class ReserveAheadService(ServiceThread):
    name = "orbit-reserve-ahead"

    def __init__(
        self,
        mfq: MappedFileQueue,
        *,
        window_bytes: int,
        keep_behind_bytes: int,
        release: Release | None,
    ) -> None:
        super().__init__()
        self._mfq = mfq
        self._window = window_bytes
        self._keep = keep_behind_bytes
        self._step = max(window_bytes // 4, PAGE_SIZE_BYTES)
        self._release = release

    def _release_behind(self, mf: MappedFile, upto: int) -> bool:
        """Drop pages the writer has left behind (they stay in the page cache, dirty or not):
        resident memory stays at the window plus ``keep_behind_bytes`` however fast it writes."""
        upto -= upto % PAGE_SIZE_BYTES
        if self._release is None or (upto - mf.released_behind < self._step and upto < mf.file_size):
            return False
        if upto <= mf.released_behind:
            return False
        self._release(mf, mf.released_behind, upto)
        mf.released_behind = upto
        return True

    def run(self) -> None:
        previous: MappedFile | None = None
        idle_s = BUSY_POLL_S
        while not self._stop.is_set():
            mf = self._mfq.last
            if mf is None or mf.destroyed:
                self.wait_for_running(idle_s)
                idle_s = min(idle_s * 2, IDLE_POLL_MAX_S)
                continue
            if previous is not None and previous is not mf and not previous.destroyed:
                self._release_behind(previous, previous.file_size)  # the writer moved on
            previous = mf
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
            worked = self._release_behind(mf, wrote - self._keep) or worked
            if worked:
                idle_s = BUSY_POLL_S
            else:
                self.wait_for_running(idle_s)
                idle_s = min(idle_s * 2, IDLE_POLL_MAX_S)
