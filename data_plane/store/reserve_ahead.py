"""ReserveAheadService: keeps the CommitLog's next blocks reserved and its past pages unmapped
(the page cache after the writer is populate_ahead.py's).

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

The thread polls the writer's position (``next_poll_s``): right away again after a round with
work; otherwise after the time the writer needs, at its recent rate, for a quarter of a release
step (8 MiB of the default 32), between 2 and 64 ms, doubling while the writer stands still.
Each wake-up takes the GIL from the event loop; at a fixed 2 ms that was ~500 handoffs a
second however slowly the store was written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)

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


class WriterPace:
    """When a thread that follows the writer looks again: at once after a round with work,
    otherwise ``next_poll_s`` from how far the writer moved since the round before."""

    __slots__ = ("_step", "seen_at", "seen_wrote", "wait_s")

    def __init__(self, step_bytes: int) -> None:
        self._step = step_bytes
        self.wait_s = BUSY_POLL_S
        self.seen_at = time.monotonic()
        self.seen_wrote = -1

    def new_file(self) -> None:
        self.seen_wrote = -1  # its position says nothing about the rate yet

    def after_round(self, wrote: int, worked: bool) -> float:
        """The wait before the next round (0 after a round with work)."""
        now = time.monotonic()
        if worked:
            self.wait_s = BUSY_POLL_S
        else:
            moved = wrote - self.seen_wrote if self.seen_wrote >= 0 else 0
            self.wait_s = next_poll_s(moved, now - self.seen_at, self._step, self.wait_s)
        self.seen_at, self.seen_wrote = now, wrote
        return 0.0 if worked else self.wait_s

    def no_file(self) -> float:
        """The wait while there is no file to follow (doubling up to the cap)."""
        wait = self.wait_s
        self.wait_s = min(wait * 2, IDLE_POLL_MAX_S)
        return wait


def release_with_madvise(mf: MappedFile, start: int, end: int) -> None:
    """The pure-Python release (holds the GIL for the madvise)."""
    mf.release_range(start, end)


class ReserveAheadService(ServiceThread):
    name = "orbit-reserve-ahead"
    background = True  # a lower priority (service.py)

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
        pace = WriterPace(self._step)
        while not self._stop.is_set():
            mf = self._mfq.last
            if mf is None or mf.destroyed:
                self.wait_for_running(pace.no_file())
                continue
            if previous is not None and previous is not mf and not previous.destroyed:
                self._release_behind(previous, previous.file_size)  # the writer moved on
                pace.new_file()
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
            if wait_s := pace.after_round(wrote, worked):
                self.wait_for_running(wait_s)
