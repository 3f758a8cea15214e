"""PopulateAheadService: keeps the page cache filled after the CommitLog writer, on spare CPU.

    CommitLog file  |== written ==|-- populated (populate_ahead_bytes) --|.... not yet ....|
                              wrote_position                   populated_upto      file_size

Appends are ``pwrite``s into the page cache. A page not there yet is allocated and zeroed
inside the writer's call, and on a VM whose memory the hypervisor backs on first touch (and
takes back once the guest frees it: virtio-balloon free page reporting) each costs a host fault,
~10 us a 4 KiB page here: in a batched publish that was most of the kernel time of the broker's
event loop, the thread everything waits on. This thread keeps ``populate_ahead_bytes`` (64 MiB)
after the write position in the page cache, in steps of ``POPULATE_STEP_BYTES``: one
``populate`` call a step (``posix_fadvise(WILLNEED)`` in 128 KiB calls, all with the GIL
released in the compiled twin; reserved blocks become zero pages without a disk read). It
starts once the writer has begun a file, and after a roll-over fills the new file from where
the writer is.

The faults are not fewer, they are this thread's, so it runs at ``SCHED_IDLE``: on spare CPU
only, never ahead of the event loop or the clients on the same cores. When no core is spare it
falls behind and the writer takes the faults itself, as it would without it.

It fills in short rounds (``POPULATE_STEP_BYTES``, 256 KiB: two calls) and, once the filled
edge is half the window or more ahead of the writer, rests ``rest_s`` (1 ms) after each one. A
host fault holds the vCPU it happens on, whatever the thread's priority: in 8 MiB rounds back
to back this thread kept a core for 3-8 ms at a time (84 such slices in 11 s of the half-peak
phase of ``orbit bench e2e``) while the broker's event loop and the publisher waited for it.
Resting always cost the synchronous phase, whose writer then caught up with the filler and
took the faults itself; resting only while comfortably ahead keeps both (docs/broker.md, "The
page-cache filler's rests").

The poll follows the writer as ``ReserveAheadService``'s does (``WriterPace``).
"""

from __future__ import annotations

import logging
import os

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile, Populate, py_populate
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.reserve_ahead import WriterPace
from data_plane.store.service import ServiceThread, lower_to_idle_priority

log = logging.getLogger(__name__)

POPULATE_STEP_BYTES = 256 * 1024  # a round: two posix_fadvise calls (~0.6 ms of host faults here)
POPULATE_REST_S = 0.001  # after a round with work, while half the window or more is filled


class PopulateAheadService(ServiceThread):
    name = "orbit-populate-ahead"

    def __init__(
        self,
        mfq: MappedFileQueue,
        *,
        ahead_bytes: int,
        populate: Populate = py_populate,
        step_bytes: int = POPULATE_STEP_BYTES,
        rest_s: float = POPULATE_REST_S,
        idle_priority: bool = True,
    ) -> None:
        super().__init__()
        self._mfq = mfq
        self._ahead = ahead_bytes
        self._populate = populate
        self._step = step_bytes
        self._rest_s = rest_s
        self._idle_priority = idle_priority

    def populate_after(self, mf: MappedFile, wrote: int) -> bool:
        """One step of keeping ``ahead_bytes`` after ``wrote`` in the page cache: from where the
        last step ended, or from the writer if it went past that; nothing before the writer
        begins the file, nor for less than a step unless the file ends there."""
        if self._ahead <= 0 or wrote <= 0:
            return False
        start = max(mf.populated_upto, wrote - wrote % PAGE_SIZE_BYTES)
        target = min(mf.file_size, wrote + self._ahead)
        if start >= target or (target - start < self._step and target < mf.file_size):
            return False
        end = min(target, start + self._step)
        err = mf.populate(start, end, self._populate)
        if err:
            log.warning("cannot populate %s ahead of the writer: %s", mf.path, os.strerror(err))
        mf.populated_upto = end  # not retried: the writer allocates what is missing itself
        return True

    def run(self) -> None:
        if self._idle_priority and not lower_to_idle_priority():
            log.info("%s runs at normal priority (no SCHED_IDLE here)", self.name)
        pace = WriterPace(self._step)
        previous: MappedFile | None = None
        while not self._stop.is_set():
            mf = self._mfq.last
            if mf is None or mf.destroyed:
                self.wait_for_running(pace.no_file())
                continue
            if mf is not previous:
                pace.new_file()
                previous = mf
            wrote = mf.wrote_position
            if wait_s := pace.after_round(wrote, self.populate_after(mf, wrote)):
                self.wait_for_running(wait_s)
            elif self._rest_s > 0 and mf.populated_upto - wrote >= self._ahead // 2:
                self.wait_for_running(self._rest_s)  # comfortably ahead: the cores go back to the others
