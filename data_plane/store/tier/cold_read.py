"""Reading tiered records: the store's readers take a record from the tier's memory cache when
it is there (never blocking the loop), and otherwise ``await`` a fetch on a worker thread and
read again. Hot reads — records still in the local log — never come here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from data_plane.store.layouts import MESSAGE_MAGIC_CODE, RECORD_HEADER
from data_plane.store.message import MAGIC_AND_SIZE, OFF_STORE_TIMESTAMP, STORE_TIMESTAMP

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore
    from data_plane.store.tier.tier import Tier

HEADER_SIZE = RECORD_HEADER.size
_NOT_A_RECORD = 0


def _record_size(tier: Tier, offset: int) -> int | None:
    """The size of the record at ``offset`` from its header in memory (None: the header is not in
    memory; ``_NOT_A_RECORD``: no record starts there)."""
    head = tier.view(offset, 8)
    if head is None:
        return None
    total, magic = MAGIC_AND_SIZE.unpack_from(head, 0)
    return total if magic == MESSAGE_MAGIC_CODE and total > HEADER_SIZE else _NOT_A_RECORD


def record(tier: Tier, offset: int) -> memoryview | None:
    """The whole record at ``offset`` if the tier has it in memory, else None."""
    total = _record_size(tier, offset)
    return tier.view(offset, total) if total else None


def missing(tier: Tier, offset: int) -> bool:
    """Some of the record at ``offset`` is not in memory (its header, or — a record across two
    chunks — the rest of it)."""
    total = _record_size(tier, offset)
    if total is None:
        return True
    return total != _NOT_A_RECORD and tier.missing(offset, total)


def store_timestamp(tier: Tier, offset: int) -> int:
    head = tier.view(offset, HEADER_SIZE)
    if head is None:
        return -1
    return int(STORE_TIMESTAMP.unpack_from(head, OFF_STORE_TIMESTAMP)[0])


async def fetch(tier: Tier, offset: int, size: int = 0) -> None:
    """Bring ``size`` bytes at ``offset`` into memory; ``size`` 0: the whole record there."""
    if size > 0:
        await tier.load(offset, size)
        return
    await tier.load(offset, HEADER_SIZE)
    total = _record_size(tier, offset)
    if total:
        await tier.load(offset, total)


async def offset_by_time(store: MessageStore, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """``ConsumeQueue.offset_by_time`` over tiered units and records too, each probe fetched
    first when it is only in the tier."""
    lo = store.min_offset_in_queue(topic, queue_id)
    hi = store.max_offset_in_queue(topic, queue_id)
    while lo < hi:
        mid = (lo + hi) // 2
        phy = await store.commit_log_offset_in_queue_cold(topic, queue_id, mid)
        if phy >= 0 and store.cold(phy):
            await store.fetch_cold(phy, HEADER_SIZE)
        ts = store.store_timestamp_at(phy) if phy >= 0 else -1
        if ts < timestamp_ms:  # (a removed or missing record is older than anything still there)
            lo = mid + 1
        else:
            hi = mid
    return lo
