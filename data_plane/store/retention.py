"""Retention: delete old CommitLog files, and the ConsumeQueue/IndexFile parts that follow them.

Rules (RocketMQ's, with its defaults):

* a CommitLog file whose last write is older than ``file_reserved_time_hours`` (72 h) goes;
* disk use >= ``disk_max_used_space_ratio`` (75 %): the oldest files go whatever their age, up
  to ``delete_files_batch_max`` a round;
* disk use >= ``disk_space_clean_forcibly_ratio`` (85 %): oldest files go, round after round,
  until use is back under 75 % or only the file being written is left;
* disk use >= ``disk_space_warning_level_ratio`` (90 %): writes are refused with DISK_FULL until
  use drops below it again.

The file being written is never deleted. After the log's min offset moves, ConsumeQueue files
whose units all point below it are deleted and each queue's min offset moves to its first unit
whose record still exists; IndexFiles whose entries all point below it go too.

``clean_once`` runs on the thread that serves reads (the broker's event loop), so a read never
races a deletion; mappings that a reader still holds are unmapped on a later round.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)


def disk_usage_ratio(path: str) -> float:
    """Used space as ``df`` shows it: used / (used + available to us). The blocks a filesystem
    reserves for root count neither way, so a 95%-full ext4 volume is 95% here too, not 100%."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = used + st.f_bavail * st.f_frsize
    if usable <= 0:
        return 0.0
    return used / usable


def memory_for_hot_data_bytes() -> int:
    """40 % of physical memory: data further behind the write point than this is probably no
    longer in the page cache (RocketMQ's accessMessageInMemoryMaxRatio)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.4)
    except (ValueError, OSError):
        return 8 << 30


@dataclass(slots=True)
class CleanReport:
    disk_usage_ratio: float
    commit_log_files_deleted: int
    consume_queue_files_deleted: int
    index_files_deleted: int
    disk_full: bool
    redispatched: bool


def clean_once(store: MessageStore, now_s: float) -> CleanReport:
    cfg = store.config
    usage = store._disk_usage_ratio(cfg.store_path)
    mfq = store.commit_log.mfq
    expired_before = now_s - store.retention_hours * 3600
    deleted = 0
    with store.commit_log.lock:
        if usage >= cfg.disk_space_clean_forcibly_ratio:
            while len(mfq.files) > 1:
                deleted += len(mfq.delete_first_files(1))
                usage = store._disk_usage_ratio(cfg.store_path)
                if usage < cfg.disk_max_used_space_ratio:
                    break
        elif usage >= cfg.disk_max_used_space_ratio:
            gone = mfq.delete_expired_by_time(
                expired_before=expired_before, force=True, max_batch=cfg.delete_files_batch_max
            )
            deleted += len(gone)
        else:
            deleted += len(
                mfq.delete_expired_by_time(
                    expired_before=expired_before, force=False, max_batch=cfg.delete_files_batch_max
                )
            )
        mfq.retry_zombies()
        cq_deleted = idx_deleted = 0
        phy_min = mfq.min_offset()
        if deleted:
            log.info("retention deleted %d CommitLog files; log now starts at %d", deleted, phy_min)
            for cq in store.queues:
                cq_deleted += cq.delete_expired_files(phy_min)
            usage = store._disk_usage_ratio(cfg.store_path)
        for cq in store.queues:
            cq.mfq.retry_zombies()
        if store.index is not None:
            idx_deleted = store.index.delete_expired(phy_min)
        was_full = store.disk_full or store.dispatch_broken
        store.disk_full = usage >= cfg.disk_space_warning_level_ratio
        redispatched = False
        if store.dispatch_broken and not store.disk_full:
            # Indexes stopped at a full disk: rebuild them from the log, then accept writes.
            try:
                store.dispatcher.redispatch(store.commit_log, store.dispatcher.dispatched_offset)
                store.dispatch_broken = False
                redispatched = True
            except OSError as e:
                log.warning("indexes still cannot catch up: %s", e)
        if was_full and not (store.disk_full or store.dispatch_broken):
            log.warning("disk has room again (%.0f%% used): writes resume", usage * 100)
    return CleanReport(usage, deleted, cq_deleted, idx_deleted, store.disk_full, redispatched)
