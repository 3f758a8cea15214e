"""ReserveAheadService: keeps the CommitLog's next blocks reserved and in the page cache, and
its past pages unmapped.

* **Reserve ahead.** Every block of the CommitLog must be allocated before an append writes it,
  so that a full disk is an ENOSPC at reservation time, never a failure half-way through a
  record. CommitLog files are created with every block reserved (``posix_fallocate``, by
  ``AllocateMappedFileService`` ahead of need, or on the write path); only a file reopened
  after recovery truncated it has an unreserved tail, which this thread reserves
  ``reserve_ahead_bytes`` (128 MiB) ahead of the writer, off the writer's thread.
* **Populate ahead.** Appends are ``pwrite``s into the page cache; a page that is not there yet
  is allocated and zeroed inside the writer's call, and on a VM whose memory the hypervisor
  backs on first touch (and takes back once the guest frees it: virtio-balloon free page
  reporting) that costs ~10 us a 4 KiB page — measured here, it was two thirds of the broker's
  event-loop time in a batched publish. This thread keeps ``populate_ahead_bytes`` (64 MiB)
  after the writer in the page cache (``posix_fadvise(WILLNEED)``: reserved blocks become zero
  pages, no disk read) in steps of ``POPULATE_STEP_BYTES`` (8 MiB), with the GIL released, once the
  writer has begun a file; the allocation thread fills the head of each next file. The
  cost moves to this thread: a win when the writer is the bottleneck and a core has room.
* **Release behind.** Appends are ``pwrite``s; the mapping is only read (consumers, lookups),
  and pages it has read stay in the process's page tables. This thread drops the pages more
  than ``release_keep_bytes`` (16 MiB) behind the writer from them (the page cache keeps them),
  so resident memory does not grow with the amount stored. Without the compiled module the
  release holds the GIL.

The thread polls the writer's position (``next_poll_s``): right away again after a round with
work; otherwise after the time the writer needs, at its recent rate, for a quarter of a release
step (8 MiB of the default 32), between 2 and 64 ms, doubling while the writer stands still.
Each wake-up takes the GIL from the event loop; at a fixed 2 ms that was ~500 handoffs a
second however slowly the store was written.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile, Populate, py_populate
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)

POPULATE_STEP_BYTES = 8 * 1024 * 1024  # one populate call a round (~20 ms of page faults here)
BUSY_POLL_S = 0.002  # the shortest wait (a round that reserved or released something waits none)
IDLE_POLL_MAX_S = 0.064  # the longest wait


Release = Callable[[MappedFile, int, int], None]


def next_poll_s(moved_bytes: int, elapsed_s: float, step_bytes: int, previous_s: float) -> float:
    """How long to wait after a round with nothing to do. The writer moved ``moved_bytes`` in
    the ``elapsed_s`` since the last round: wait for it to write a quarter of a release step at
    that rate, so pages are released at most that far behind schedule; a writer that stands
    still doubles the wait. Always within [BUSY_POLL_S, IDLE_POLL_MAX_S]."""
    standing_still = moved_bytes <= 0 or elapsed_s <= 0
    wait = previous_s * 2 if standing_still else elapsed_s * (step_bytes / 4) / moved_bytes
    return min(IDLE_POLL_MAX_S, max(BUSY_POLL_S, wait))


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
        populate_ahead_bytes: int = 0,
        populate: Populate = py_populate,
        populate_step_bytes: int = POPULATE_STEP_BYTES,
    ) -> None:
        super().__init__()
        self._mfq = mfq
        self._window = window_bytes
        self._keep = keep_behind_bytes
        self._step = max(window_bytes // 4, PAGE_SIZE_BYTES)
        self._release = release
        self._populate_ahead = populate_ahead_bytes
        self._populate = populate
        self._populate_step = populate_step_bytes

    def _populate_after(self, mf: MappedFile, wrote: int) -> bool:
        """One step of keeping ``populate_ahead_bytes`` after ``wrote`` in the page cache: from
        where the last step ended, or from the writer if it went past that; nothing before the
        writer begins the file, nor for less than a step unless the file ends there."""
        if self._populate_ahead <= 0 or wrote <= 0:
            return False
        start = max(mf.populated_upto, wrote - wrote % PAGE_SIZE_BYTES)
        target = min(mf.file_size, wrote + self._populate_ahead)
        if start >= target or (target - start < self._populate_step and target < mf.file_size):
            return False
        end = min(target, start + self._populate_step)
        err = mf.populate(start, end, self._populate)
        if err:
            log.warning("cannot populate %s ahead of the writer: %s", mf.path, os.strerror(err))
        mf.populated_upto = end  # not retried: the writer allocates what is missing itself
        return True

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
        wait_s = BUSY_POLL_S
        seen_at, seen_wrote = time.monotonic(), -1
        while not self._stop.is_set():
            mf = self._mfq.last
            if mf is None or mf.destroyed:
                self.wait_for_running(wait_s)
                wait_s = min(wait_s * 2, IDLE_POLL_MAX_S)
                continue
            if previous is not None and previous is not mf and not previous.destroyed:
                self._release_behind(previous, previous.file_size)  # the writer moved on
                seen_wrote = -1  # a new file: its position says nothing about the rate yet
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
            worked = self._populate_after(mf, wrote) or worked
            worked = self._release_behind(mf, wrote - self._keep) or worked
            now = time.monotonic()
            if worked:
                wait_s = BUSY_POLL_S
            else:
                moved = wrote - seen_wrote if seen_wrote >= 0 else 0
                wait_s = next_poll_s(moved, now - seen_at, self._step, wait_s)
            seen_at, seen_wrote = now, wrote
            if not worked:
                self.wait_for_running(wait_s)
