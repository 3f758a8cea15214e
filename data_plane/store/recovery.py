"""Recovery: make the log and every index agree after a clean stop or a crash.

The CommitLog is the single source of truth. Steps:

1. each ConsumeQueue finds its last valid unit; each IndexFile counts its entries;
2. the CommitLog is walked from the checkpoint's safe point (from its first file when the
   checkpoint is missing, torn, or the abort file says the last stop was a crash and the
   checkpoint is behind) verifying magic, shape, physical offset and body CRC of every record;
   the first unsound byte is where the log ends: the torn tail is zeroed and later files removed;
3. ConsumeQueue units and IndexFiles that point at or past that end are dropped;
4. records after the safe point are dispatched again (units already present are kept), so
   indexes that lag the log catch up;
5. per-queue next offsets and min offsets are rebuilt from the ConsumeQueues, and a fresh
   checkpoint is written.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)


def recover(store: MessageStore, *, crashed: bool) -> int:
    """Recover ``store`` in place; returns the offset where the valid log ends."""
    cl = store.commit_log
    mfq = cl.mfq
    cp = store.checkpoint
    for cq in store.queues:
        cq.recover()

    log_min = mfq.min_offset()
    log_max = mfq.max_offset()  # every loaded file counts as full until scanned
    safe = cp.min_offset() if cp.valid and log_min <= cp.min_offset() <= log_max else log_min
    # Walk from the start of the file holding the safe point (every record of that file is
    # verified: a torn write lands after the last flush, which is in that file or later).
    safe_file = mfq.find_by_offset(safe)
    scan_from = safe_file.file_from_offset if safe_file is not None else safe
    scan_from = max(scan_from, log_min)
    valid_end = scan_from
    for item in cl.scan(scan_from):
        valid_end = item[0]
    if not mfq.files:
        valid_end = safe = 0
    log.log(
        logging.WARNING if crashed else logging.INFO,
        "recovering after %s: CommitLog valid from %d to %d",
        "a crash" if crashed else "a clean stop",
        log_min,
        valid_end,
    )
    mfq.truncate_dirty_files(valid_end)
    mfq.flushed_where = valid_end

    # Drop index entries that point at bytes that did not survive.
    for cq in store.queues:
        cq.truncate_dirty(valid_end)
    # Dispatch again from the safe point — or from further back when an index is behind it: a
    # ConsumeQueue or IndexFile directory that was lost (or never flushed) is rebuilt from the
    # log (RocketMQ's reput starts from the ConsumeQueues' max physical offset likewise).
    cq_end = max((cq.max_physic_offset for cq in store.queues), default=-1)
    dispatch_from = min(safe, valid_end, cq_end if cq_end >= 0 else log_min)
    if store.index is not None:
        # IndexFiles holding entries past the end go; the index is rebuilt from the last
        # record the remaining files index (that record may be indexed twice: queries dedupe).
        store.index.truncate_after(valid_end)
        ix_end = store.index.end_phy_offset()
        dispatch_from = min(dispatch_from, ix_end if ix_end >= 0 else log_min)
    dispatch_from = max(dispatch_from, log_min)
    # A queue whose last unit lies before the safe point is complete; one that is missing
    # units after it is filled in by the redispatch.
    store.dispatcher.dispatched_offset = dispatch_from
    end = store.dispatcher.redispatch(cl, dispatch_from)
    if end != valid_end:
        raise RuntimeError(f"recovery disagrees with itself: log valid to {valid_end}, redispatch to {end}")

    for cq in store.queues:
        cq.correct_min_offset(store.queues_local_floor())  # (below it: the tier's indexes)
    adopt_queue_state(store)
    store.flush_indexes(True)
    return valid_end


def adopt_queue_state(store: MessageStore) -> None:
    """Make what the CommitLog assigns next agree with the ConsumeQueues: each queue's next
    offset, and the last store timestamp (timestamps never go backwards). Recovery does this;
    so does a slave becoming master, whose records came as raw bytes (``append_raw``) that
    built ConsumeQueue units but never passed the CommitLog's own offset assignment."""
    cl = store.commit_log
    last_ts = 0
    for cq in store.queues:
        cl.queue_offsets[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue()
        if cq.max_physic_offset > 0:
            u = cq.unit(cq.max_offset_in_queue() - 1)
            if u is not None and u[0] >= 0:
                last_ts = max(last_ts, cl.store_timestamp_at(u[0]))
    cl.last_store_timestamp = max(cl.last_store_timestamp, last_ts)
