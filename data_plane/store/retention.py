"""Retention: delete the CommitLog files whose messages are past retention, and the
ConsumeQueue/IndexFile parts that follow them; watch the disk.

The rule (``clean_once``, every ``clean_resource_interval_ms``):

* A CommitLog file is *past retention* when its newest message was stored more than
  ``MessageStore.retention_hours`` ago: ``file_reserved_time_hours`` (72 h), which the broker
  raises to the longest retention any topic it hosts was promised. The store time compared is
  that of the first record of the next file: records never span files and store times never go
  backwards, so no message of the file is newer. A file no record follows yet holds the log's
  newest messages and is inside retention. Files past retention go, oldest first,
  ``delete_files_batch_max`` a round.
* Disk use >= ``disk_max_used_space_ratio`` (75 %), pressure: every file past retention goes
  in the round. Files inside retention stay.
* Disk use >= ``disk_space_warning_level_ratio`` (90 %): puts are refused with DISK_FULL — the
  reason names the use and the watermark — until use drops below it. Nothing inside retention
  is deleted to make room for new messages.
* Disk use >= ``disk_space_clean_forcibly_ratio`` (95 %), the emergency watermark: the oldest
  files go whatever their age, one at a time, the use read again after each, until it is below
  the watermark or only the file being written is left. Before a file inside retention goes,
  its messages still inside their own topic's retention (``MessageStore.topic_retention_hours``,
  ``file_reserved_time_hours`` for a topic without one) are counted per topic from the
  ConsumeQueues; the file is logged and handed, as a ``ForcedDeletion``, to
  ``MessageStore.on_forced_deletion`` (the broker counts it per tenant, exposes it and reports
  it to the control plane).

The file being written is never deleted. After the log's min offset moves, ConsumeQueue files
whose units all point below it are deleted and each queue's min offset moves to its first unit
whose record still exists; IndexFiles whose entries all point below it go too.

``clean_once`` runs on the thread that serves reads (the broker's event loop), so a read never
races a deletion; mappings that a reader still holds are unmapped on a later round (their
blocks are freed then, so a round at the emergency watermark may delete one file more than
the space needed).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from data_plane.store.commit_log import CommitLog
    from data_plane.store.consume_queue import ConsumeQueue
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
DISK_FULL_REASON = "disk is full; writes resume when space returns"


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


@dataclass(frozen=True, slots=True)
class ForcedDeletion:
    """One CommitLog file deleted inside retention at the emergency watermark."""

    file_name: str
    from_offset: int  # the file's first CommitLog offset
    # No message of the file is newer (the next file's first store time); None: none followed it.
    newest_store_time_ms: int | None
    disk_usage_ratio: float  # the reading that forced the deletion
    # Per topic: the file's messages (as its ConsumeQueues list them) still inside their topic's
    # retention when the file went.
    messages_in_retention: dict[str, int]

    @property
    def messages(self) -> int:
        return sum(self.messages_in_retention.values())


@dataclass(slots=True)
class CleanReport:
    disk_usage_ratio: float
    commit_log_files_deleted: int
    consume_queue_files_deleted: int
    index_files_deleted: int
    disk_full: bool
    redispatched: bool
    forced: list[ForcedDeletion] = field(default_factory=list)  # the files deleted inside retention


def disk_usage_from_file(path: str) -> Callable[[str], float]:
    """The probe of ``disk_usage_override_file`` (a test hook): the ratio written in ``path``,
    read at every call; the filesystem's reading when the file cannot be read or parsed."""

    def read(store_path: str) -> float:
        try:
            with open(path, encoding="ascii") as f:
                return float(f.read().strip())
        except (OSError, ValueError) as e:
            log.warning("disk_usage_override_file %s unreadable (%s): using the filesystem's figure", path, e)
            return disk_usage_ratio(store_path)

    return read


def newest_store_time_ms(commit_log: CommitLog, index: int) -> int | None:
    """No message of the ``index``-th CommitLog file was stored later than this: the store time
    of the next file's first record. None when no record follows the file yet."""
    files = commit_log.mfq.files
    if index + 1 >= len(files):
        return None
    ts = commit_log.store_timestamp_at(files[index + 1].file_from_offset)
    return ts if ts >= 0 else None


def _past_retention(commit_log: CommitLog, index: int, cutoff_ms: float) -> bool:
    newest = newest_store_time_ms(commit_log, index)
    return newest is not None and newest < cutoff_ms


def _local_copy_may_go(store: MessageStore, index: int, cutoff_ms: float, now_ms: float, pressure: bool) -> bool:
    """May the ``index``-th CommitLog file leave local disk? Past total retention, always; with a
    tier, also once the manifest names it (uploaded and verified) and either the disk is under
    pressure or its newest message is past the local retention of every topic in it."""
    cl = store.commit_log
    newest = newest_store_time_ms(cl, index)
    if newest is None:
        return False
    if newest < cutoff_ms:
        return True
    tier = store.tier
    if tier is None:
        return False
    tiered = tier.manifest.find(cl.mfq.files[index].file_from_offset)
    if tiered is None:
        return False
    if pressure:
        return True
    default_h = store.config.local_retention_hours
    local = store.topic_local_retention_hours
    keep_h = max((local.get(t, default_h) for t in tiered.topics), default=default_h)
    return newest < now_ms - keep_h * HOUR_MS


def _uploaded(store: MessageStore, index: int) -> bool:
    tier = store.tier
    return tier is not None and tier.manifest.find(store.commit_log.mfq.files[index].file_from_offset) is not None


def _first_unit_at(cq: ConsumeQueue, lo: int, hi: int, phy_offset: int) -> int:
    """The first queue offset in ``lo..hi`` whose record starts at or after ``phy_offset``."""
    while lo < hi:
        mid = (lo + hi) // 2
        u = cq.unit(mid)
        if u is None or u[0] < phy_offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _first_stored_since(
    cq: ConsumeQueue, lo: int, hi: int, since_ms: float, store_timestamp_at: Callable[[int], int]
) -> int:
    """The first queue offset in ``lo..hi`` whose message was stored at or after ``since_ms``."""
    while lo < hi:
        mid = (lo + hi) // 2
        u = cq.unit(mid)
        ts = store_timestamp_at(u[0]) if u is not None and u[0] >= 0 else -1
        if ts < since_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def messages_in_retention(store: MessageStore, start_offset: int, end_offset: int, now_ms: float) -> dict[str, int]:
    """Per topic: the messages stored in ``start_offset..end_offset`` of the CommitLog that are
    still inside their topic's retention at ``now_ms``. Two binary searches over each
    ConsumeQueue's units and one over their store times: units point at ever larger offsets,
    and store times never go backwards."""
    default_hours = store.config.file_reserved_time_hours
    retention = store.topic_retention_hours
    store_timestamp_at = store.commit_log.store_timestamp_at
    out: dict[str, int] = {}
    for cq in store.queues:
        lo, hi = cq.min_offset_in_queue(), cq.max_offset_in_queue()
        first = _first_unit_at(cq, lo, hi, start_offset)
        end = _first_unit_at(cq, first, hi, end_offset)
        if end <= first:
            continue
        since_ms = now_ms - retention.get(cq.topic, default_hours) * HOUR_MS
        inside = end - _first_stored_since(cq, first, end, since_ms, store_timestamp_at)
        if inside > 0:
            out[cq.topic] = out.get(cq.topic, 0) + inside
    return out


def clean_once(store: MessageStore, now_s: float) -> CleanReport:
    """One round of the rule above at ``now_s`` (epoch seconds on the store's clock)."""
    cfg = store.config
    usage = store._disk_usage_ratio(cfg.store_path)
    cl = store.commit_log
    mfq = cl.mfq
    now_ms = now_s * 1000
    cutoff_ms = now_ms - store.retention_hours * HOUR_MS
    deleted = 0
    forced: list[ForcedDeletion] = []
    with cl.lock:
        # Past retention (or, with a tier, uploaded and past local retention): a batch a round,
        # or all of them under pressure.
        pressure = usage >= cfg.disk_max_used_space_ratio
        limit = len(mfq.files) if pressure else cfg.delete_files_batch_max
        expired = 0
        while expired < min(limit, len(mfq.files) - 1) and _local_copy_may_go(
            store, expired, cutoff_ms, now_ms, pressure
        ):
            expired += 1
        if expired:
            deleted += len(mfq.delete_first_files(expired))
            usage = store._disk_usage_ratio(cfg.store_path)
        # The emergency watermark: the oldest files go whatever their age.
        while usage >= cfg.disk_space_clean_forcibly_ratio and len(mfq.files) > 1:
            if store.tier is not None and not _uploaded(store, 0):
                break  # with a tier, nothing leaves before it is uploaded: writes wait instead
            first = mfq.files[0]
            newest = newest_store_time_ms(cl, 0)
            if newest is None or newest >= cutoff_ms:
                counts = messages_in_retention(store, first.file_from_offset, first.file_from_offset + mfq.file_size,
                                               now_ms)  # fmt: skip
                f = ForcedDeletion(os.path.basename(first.path), first.file_from_offset, newest, usage, counts)
                forced.append(f)
                log.warning(
                    "disk %.1f%% used, at or past disk_space_clean_forcibly_ratio (%.0f%%): deleting CommitLog file "
                    "%s inside retention (%d messages inside their topic's retention, %d topics)",
                    usage * 100, cfg.disk_space_clean_forcibly_ratio * 100, f.file_name, f.messages, len(counts),
                )  # fmt: skip
            deleted += len(mfq.delete_first_files(1))
            usage = store._disk_usage_ratio(cfg.store_path)
        mfq.retry_zombies()
        cq_deleted = idx_deleted = 0
        # The queues and the index keep what the tier's indexes do not hold (with a tier, the
        # units and keys of the files in it are in their index objects: ``file_index``).
        phy_min = store.queues_local_floor()
        if deleted:
            log.info("retention deleted %d CommitLog files; local log now starts at %d, messages at %d", deleted,
                     mfq.min_offset(), store.log_floor())  # fmt: skip
        if deleted or phy_min != store.queues_floor:  # (tier retention and uploads move the floor too)
            store.queues_floor = phy_min
            for cq in store.queues:
                cq_deleted += cq.delete_expired_files(phy_min)
            usage = store._disk_usage_ratio(cfg.store_path)
        for cq in store.queues:
            cq.mfq.retry_zombies()
        if store.index is not None:
            idx_deleted = store.index.delete_expired(phy_min)
        was_full = store.disk_full or store.dispatch_broken
        warning = cfg.disk_space_warning_level_ratio
        store.disk_full = usage >= warning
        if store.disk_full:
            store.disk_full_reason = (
                f"disk is full: {usage:.1%} used, at or past disk_space_warning_level_ratio ({warning:.0%}); "
                "stored messages are kept, writes resume when space returns"
            )
            if store.tier is not None and store.tier.offloader.last_error:
                store.disk_full_reason += (
                    f" (the object store is unavailable, so sealed files cannot move there: "
                    f"{store.tier.offloader.last_error[:200]})"
                )
            if not was_full:
                log.warning("disk %.1f%% used, at or past disk_space_warning_level_ratio (%.0f%%): puts are "
                            "refused with DISK_FULL", usage * 100, warning * 100)  # fmt: skip
        else:
            store.disk_full_reason = DISK_FULL_REASON
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
    hook = store.on_forced_deletion
    if hook is not None:
        for f in forced:
            try:
                hook(f)
            except Exception:  # the deletion happened: a failing hook must not hide the rest
                log.exception("on_forced_deletion failed for %s", f.file_name)
    return CleanReport(usage, deleted, cq_deleted, idx_deleted, store.disk_full, redispatched, forced)
