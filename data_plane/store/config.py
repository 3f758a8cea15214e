"""Store configuration: one frozen object, read once, passed down.

Every size carries its unit in its name (``_bytes``, ``_ms``, ``_hours``, ``_ratio``). The
defaults are RocketMQ 4.x's (seed 001 §7 and ``MessageStoreConfig``): 1 GiB CommitLog files,
300,000 ConsumeQueue units a file, 4 MiB messages, 72 h retention, asynchronous flush every
500 ms or 4 dirty pages, a full flush every 10 s — except the disk watermarks, whose order is
Orbit's: writes are refused (90 %) before any file inside retention may be deleted (95 %).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, replace
from typing import Any


class FlushDiskType(enum.Enum):
    """When an append is allowed to answer PUT_OK."""

    ASYNC_FLUSH = "ASYNC_FLUSH"  # once the bytes are in the page cache; a flusher catches up
    SYNC_FLUSH = "SYNC_FLUSH"  # once the bytes are on disk (group commit)


PAGE_SIZE_BYTES = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Everything the store needs to know, with RocketMQ's defaults."""

    store_path: str
    # --- CommitLog -------------------------------------------------------------------------
    commit_log_file_size_bytes: int = 1024 * 1024 * 1024
    max_message_size_bytes: int = 4 * 1024 * 1024
    max_topic_length: int = 127
    max_properties_size_bytes: int = 32767  # 32 KiB less one byte: a signed short on disk
    # Appends taken by the compiled appender (single messages and batches) gather up to this
    # many bytes and reach the file in one pwrite (RocketMQ's transient store pool does the same
    # with a direct buffer). Any reader, flush, rollover or other writer writes them first, so
    # nobody ever sees them missing. 0 = each append is written on its own.
    write_stage_bytes: int = 128 * 1024
    # --- ConsumeQueue ------------------------------------------------------------------------
    consume_queue_units_per_file: int = 300_000
    # --- IndexFile ---------------------------------------------------------------------------
    index_enabled: bool = True
    index_hash_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    # --- Flush -------------------------------------------------------------------------------
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log_ms: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1_000
    # IndexFiles are flushed (and the checkpoint's index offset moved) this often, and at a
    # clean stop. Their slot table is written at random through the mapping: every flush
    # write-protects its pages, and the next write to each takes a page fault — at 5,000
    # msgs/s, ~2,300 faults a second in bursts after each 1 s flush, the broker's latency tail.
    # RocketMQ flushes an IndexFile only when it is full; the kernel writes dirty pages back
    # within ~30 s (dirty_expire_centisecs) either way. After a crash, recovery rebuilds the
    # entries past the last index flush from the CommitLog.
    flush_interval_index_ms: int = 30_000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 60_000
    sync_flush_timeout_ms: int = 5_000
    # --- Allocation and page cache ------------------------------------------------------------
    warm_mapped_file_enabled: bool = False
    # Keep this much after the CommitLog write position reserved by a background thread
    # (see reserve_ahead.py).
    reserve_ahead_bytes: int = 128 * 1024 * 1024
    # The ConsumeQueues and the IndexFile being written keep this many seconds of their recent
    # write rate reserved ahead of the writer, topped up by the ConsumeQueue flush thread each
    # round, so the writer's thread (the broker's event loop) seldom zero-fills blocks itself
    # (0 = reserve only on the write path, a chunk at a time). docs/store.md, "Reserving ahead".
    reserve_indexes_ahead_s: float = 3.0
    preallocate_next_file: bool = True
    # Keep this much after the CommitLog write position in the page cache, filled by a
    # background thread on spare CPU (populate_ahead.py; 0 = off): an append then copies into pages that are
    # there, and the cost of new page-cache pages (allocating and zeroing them; on a VM, often
    # the hypervisor backing them too) is not the writer's.
    populate_ahead_bytes: int = 64 * 1024 * 1024
    # Pages behind the flush point are dropped from this process's page tables (the page
    # cache keeps them), so resident memory does not grow with the amount stored.
    release_flushed_pages: bool = True
    release_keep_bytes: int = 16 * 1024 * 1024
    os_page_cache_busy_timeout_ms: int = 1_000
    # --- Retention (retention.py; docs/store.md, "Retention") ---------------------------------
    # A CommitLog file goes once its newest message is older than this (raised at run time to
    # the longest retention any hosted topic was promised: ``MessageStore.retention_hours``).
    file_reserved_time_hours: float = 72.0
    # Disk pressure: at or above it, every file past retention goes at once (no batch limit).
    disk_max_used_space_ratio: float = 0.75
    # At or above it, puts are refused with DISK_FULL (and a reason) until use drops below it.
    disk_space_warning_level_ratio: float = 0.90
    # The emergency watermark: at or above it, the oldest files go whatever their age, one at a
    # time, until use is below it; messages so deleted inside their topic's retention are counted
    # per topic and reported (``MessageStore.on_forced_deletion``). 1.0 = only a disk with no
    # byte left.
    disk_space_clean_forcibly_ratio: float = 0.95
    delete_files_batch_max: int = 10  # files past retention deleted a round below the pressure mark
    clean_resource_interval_ms: int = 10_000
    # Test hook: when set, the disk-usage reading is the ratio (0.0-1.0) written in this file,
    # read again every round, instead of the filesystem's (an unreadable file falls back to the
    # filesystem's). Lets a test drive the watermarks of a real broker process.
    disk_usage_override_file: str = ""
    # --- Reads -------------------------------------------------------------------------------
    # Data further behind the write point than this is taken to be out of the page cache: a
    # master then suggests reading from a slave (seed 7.15). 0 = 40% of physical memory
    # (RocketMQ's accessMessageInMemoryMaxRatio).
    hot_data_bytes: int = 0
    # Bytes of records one pull read returns at most (one record always goes, however large);
    # RocketMQ's maxTransferBytesOnMessageInMemory. The count is the puller's maxMsgNums, capped
    # by the broker's max_pull_messages.
    max_transfer_bytes_on_message: int = 256 * 1024
    # --- Tiered storage (tier/; docs/tiered_storage.md) ---------------------------------------
    # Sealed CommitLog files are copied to object storage at this URL ("s3://bucket/prefix";
    # empty: no tier). Credentials come from the usual AWS chain, never from this file.
    tier_url: str = ""
    tier_endpoint_url: str = ""  # an S3-compatible endpoint ("http://host:port"); empty: AWS's
    tier_region: str = "us-east-1"
    # A named profile of the AWS shared files (~/.aws/credentials, ~/.aws/config) to take the
    # credentials from; empty: boto3's default chain (environment, shared files, instance role).
    tier_profile: str = ""
    # This store's broker group: its objects and manifest live under <prefix>/<tier_group>/.
    tier_group: str = ""
    # A sealed file is uploaded once its newest message is this old (0: as soon as it is sealed).
    tier_after_hours: float = 0.0
    # With a tier, an uploaded file stays on local disk until its newest message is older than
    # this (or disk pressure needs the room); files not yet uploaded stay whatever their age
    # (until total retention). Topics may ask for longer (``topic_local_retention_hours``).
    local_retention_hours: float = 24.0
    tier_upload_part_bytes: int = 16 * 1024 * 1024  # multipart part size (S3: >= 5 MiB)
    # An upload's bandwidth at most (0: no limit): what it takes from the hot path at any moment.
    tier_upload_bytes_per_s: int = 0
    # Uploads and index builds run in worker processes under SCHED_IDLE (only on CPU nothing else
    # wants); false: at nice 10 (they then get a share of a saturated host's CPU).
    tier_offload_idle: bool = True
    tier_read_chunk_bytes: int = 4 * 1024 * 1024  # one ranged GET of a cold read
    tier_read_ahead_chunks: int = 4  # fetched behind a cold read, in the background
    tier_cache_memory_bytes: int = 256 * 1024 * 1024  # cold chunks kept in memory
    tier_cache_dir_bytes: int = 2 * 1024 * 1024 * 1024  # and on local disk (0: none)
    tier_cache_dir: str = ""  # empty: <store_path>/tiercache
    tier_check_interval_ms: int = 10_000  # how often the offloader looks for work
    tier_request_timeout_ms: int = 10_000  # one object-store request, connect and read
    # --- Identity of this store on the wire ---------------------------------------------------
    store_host: str = "127.0.0.1"
    store_port: int = 10911

    def __post_init__(self) -> None:
        problems = []
        if self.commit_log_file_size_bytes < 4096:
            problems.append("commit_log_file_size_bytes must be at least 4096")
        if self.max_message_size_bytes + 1024 > self.commit_log_file_size_bytes:
            problems.append("a message of max_message_size_bytes must fit in one CommitLog file")
        if not 1 <= self.max_topic_length <= 127:
            problems.append("max_topic_length must be 1..127 (one length byte on disk)")
        if not 0 < self.max_properties_size_bytes <= 32767:
            problems.append("max_properties_size_bytes must be 1..32767 (a signed short on disk)")
        if not 0 <= self.write_stage_bytes <= 64 * 1024 * 1024:
            problems.append("write_stage_bytes must be 0..64 MiB")
        if not 0 <= self.populate_ahead_bytes <= 1024 * 1024 * 1024:
            problems.append("populate_ahead_bytes must be 0..1 GiB")
        if not 0 <= self.reserve_indexes_ahead_s <= 60:
            problems.append("reserve_indexes_ahead_s must be 0..60")
        if self.consume_queue_units_per_file < 1:
            problems.append("consume_queue_units_per_file must be positive")
        if self.index_hash_slots < 1 or self.index_max_entries < 2:
            problems.append("index_hash_slots must be >= 1 and index_max_entries >= 2")
        if not (
            0
            < self.disk_max_used_space_ratio
            <= self.disk_space_warning_level_ratio
            <= self.disk_space_clean_forcibly_ratio
            <= 1.0
        ):
            # Writes are refused before any message inside its retention may be deleted.
            problems.append(
                "disk ratios must satisfy 0 < disk_max_used_space_ratio <= disk_space_warning_level_ratio"
                " <= disk_space_clean_forcibly_ratio <= 1"
            )
        if self.tier_url:
            problems += tier_problems(self)
        if problems:
            raise ValueError("invalid StoreConfig: " + "; ".join(problems))

    @property
    def tier_cache_path(self) -> str:
        return self.tier_cache_dir or os.path.join(self.store_path, "tiercache")

    @property
    def tier_state_path(self) -> str:
        """The local copy of the tier's manifest (read at start: no network on the way up)."""
        return os.path.join(self.store_path, "tier")

    # Paths of the on-disk structures, in RocketMQ's directory layout.
    @property
    def commit_log_path(self) -> str:
        return os.path.join(self.store_path, "commitlog")

    @property
    def consume_queue_path(self) -> str:
        return os.path.join(self.store_path, "consumequeue")

    @property
    def index_path(self) -> str:
        return os.path.join(self.store_path, "index")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_path, "checkpoint")

    @property
    def abort_path(self) -> str:
        return os.path.join(self.store_path, "abort")

    @property
    def consume_queue_file_size_bytes(self) -> int:
        from data_plane.store.consume_queue import CQ_UNIT_SIZE

        return self.consume_queue_units_per_file * CQ_UNIT_SIZE

    def with_changes(self, **changes: Any) -> StoreConfig:
        return replace(self, **changes)


def parse_tier_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix without slashes at its ends). Raises ValueError."""
    if not url.startswith("s3://"):
        raise ValueError(f"tier_url must look like s3://bucket/prefix, not {url[:80]!r}")
    bucket, _, prefix = url[5:].partition("/")
    # S3's bucket naming rules: 3-63 of lower-case letters, digits, dots and hyphens.
    if not 3 <= len(bucket) <= 63 or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
        raise ValueError(f"tier_url: bucket {bucket[:80]!r} is not a valid S3 bucket name")
    prefix = prefix.strip("/")
    if len(prefix) > 512 or any(ord(c) < 32 for c in prefix):
        raise ValueError("tier_url: the prefix must be at most 512 printable characters")
    return bucket, prefix


def tier_problems(cfg: StoreConfig) -> list[str]:
    out = []
    try:
        parse_tier_url(cfg.tier_url)
    except ValueError as e:
        out.append(str(e))
    if cfg.tier_endpoint_url and not cfg.tier_endpoint_url.startswith(("http://", "https://")):
        out.append("tier_endpoint_url must be an http:// or https:// URL")
    if len(cfg.tier_profile) > 128 or any(not (c.isalnum() or c in "-_.") for c in cfg.tier_profile):
        out.append("tier_profile must name an AWS profile (letters, digits, '-', '_', '.'; at most 128)")
    if not cfg.tier_group or "/" in cfg.tier_group or len(cfg.tier_group) > 255:
        out.append("tier_group must name the broker group (1-255 characters, no '/')")
    if not 0 <= cfg.tier_after_hours <= 8760:
        out.append("tier_after_hours must be 0..8760")
    if not 0 < cfg.local_retention_hours <= 8760:
        out.append("local_retention_hours must be more than 0 and at most 8760")
    if not 5 * 1024 * 1024 <= cfg.tier_upload_part_bytes <= 5 * 1024 * 1024 * 1024:
        out.append("tier_upload_part_bytes must be 5 MiB..5 GiB (S3's part sizes)")
    if cfg.tier_upload_bytes_per_s and not 1024 * 1024 <= cfg.tier_upload_bytes_per_s <= 100 * 1024**3:
        out.append("tier_upload_bytes_per_s must be 0 (no limit) or 1 MiB/s..100 GiB/s")
    if not 4096 <= cfg.tier_read_chunk_bytes <= 64 * 1024 * 1024:
        out.append("tier_read_chunk_bytes must be 4 KiB..64 MiB")
    if not 0 <= cfg.tier_read_ahead_chunks <= 64:
        out.append("tier_read_ahead_chunks must be 0..64")
    if cfg.tier_cache_memory_bytes < 2 * cfg.tier_read_chunk_bytes * (1 + cfg.tier_read_ahead_chunks):
        out.append("tier_cache_memory_bytes must hold at least twice a chunk and its read-ahead")
    if cfg.tier_cache_dir_bytes < 0:
        out.append("tier_cache_dir_bytes must be >= 0")
    if not 100 <= cfg.tier_check_interval_ms <= 3_600_000:
        out.append("tier_check_interval_ms must be 100..3600000")
    if not 100 <= cfg.tier_request_timeout_ms <= 600_000:
        out.append("tier_request_timeout_ms must be 100..600000")
    return out
