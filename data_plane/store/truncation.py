"""Truncation: a running store's log cut back to an earlier record boundary — a slave whose log
diverged from its master's (the HA handshake), a slave promoted with a partial record at its end.

    cut_log(store, offset)      on the thread that reads the store (the broker's event loop),
       │                        under the CommitLog lock; memory and mapped pages only, in
       │                        proportion to what is cut:
       ├─ CommitLog             positions back to ``offset``, later files out of the queue
       ├─ ConsumeQueues         of the queues naming bytes past it (``max_physic_offset``):
       │                        those units dropped (zeroed through the mapping), the
       │                        queue's next offset reset
       ├─ IndexFiles            entries past it dropped in place (``IndexService.cut``)
       └─ dispatcher            dispatched no further than ``offset``
    LogCut.finish()             any thread — a worker (``asyncio.to_thread``) — before anything
                                is appended again; blocking I/O that releases the GIL:
       ├─ zero [offset, old end) of the file holding ``offset`` (``MappedFile.zero_range``:
       │                        what was cut, not the rest of a 1 GiB file)
       ├─ make the ConsumeQueue units zeroed in step 1 durable
       ├─ delete the later files
       └─ flush ConsumeQueues and IndexFiles, write a checkpoint that agrees

Readers between the two steps (pulls, queries, on the loop) already see the cut log: every
position they go by ends at ``offset``, and nothing there names a byte past it. The bytes the
worker zeroes are past every position, so no reader looks at them — except one that took a
slice of a record before the cut and still holds it, which may see that record's bytes turn to
zeros (the record was cut: a slave's copy of a record its master never had).

A crash between the steps leaves the cut records on disk; recovery finds them sound and the log
ends where it did before the cut — the next handshake cuts it again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from data_plane.store.mapped_file import MappedFile
from data_plane.store.mapped_file_queue import TailCut

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)


class LogCut:
    """The disk work ``cut_log`` leaves (see the module's docstring)."""

    __slots__ = ("new_end", "old_end", "store", "tail", "zeroed")

    def __init__(
        self, store: MessageStore, tail: TailCut, zeroed: list[MappedFile], old_end: int, new_end: int
    ) -> None:
        self.store = store
        self.tail = tail  # the CommitLog's: the bytes to wipe, the files to delete
        self.zeroed = zeroed  # ConsumeQueue files whose dropped units were zeroed in the mapping
        self.old_end = old_end
        self.new_end = new_end

    def finish(self) -> None:
        """Wipe, delete and flush (blocking; releases the GIL for its I/O)."""
        store = self.store
        mapped = self.tail.finish()
        if mapped:  # deleted files a reader still maps: closed by retention's next round
            with store.commit_log.lock:
                store.commit_log.mfq.add_zombies(mapped)
        for mf in self.zeroed:  # (past their wrote position: no flush of theirs would look)
            mf.sync()
        store.flush_indexes(True)


def cut_log(store: MessageStore, offset: int) -> LogCut | None:
    """Drop every record at or past ``offset`` (a record boundary) from the CommitLog and every
    ConsumeQueue unit and index entry naming them; None when the log ends at or before it.
    Returns the disk work left (``LogCut.finish``), which must be done before the next append."""
    cl = store.commit_log
    with cl.lock:
        old_end = cl.max_offset()
        if offset >= old_end:
            return None
        log.warning("truncating the CommitLog from %d to %d", old_end, offset)
        tail = cl.mfq.cut(offset)
        zeroed: list[MappedFile] = []  # ConsumeQueue files whose dropped units were zeroed
        for cq in store.queues:
            if cq.max_physic_offset > offset:
                mf = cq.truncate_dirty(offset, torn_tail=False)
                if mf is not None:
                    zeroed.append(mf)
                cl.queue_offsets[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue()
        if store.index is not None:
            store.index.cut(offset)
        dispatcher = store.dispatcher
        dispatcher.dispatched_offset = max(min(dispatcher.dispatched_offset, offset), cl.min_offset())
        dispatcher.redispatch(cl, dispatcher.dispatched_offset)  # (records below it not yet dispatched)
        dispatcher.dispatched_offset = min(dispatcher.dispatched_offset, cl.max_offset())
        return LogCut(store, tail, zeroed, old_end, cl.max_offset())
