"""What each tenant keeps on this broker: bytes on its disk, and bytes in object storage only.

A tenant's messages are the ConsumeQueue units [min offset, max offset) of each queue of its
topics. With a tier, a queue's min offset reaches back into object storage: the sealed CommitLog
files moved there are gone from the local log, whose first offset is ``commit_log.min_offset()``.
Units point at ever larger CommitLog offsets, so one binary search (retention's
``_first_unit_at``) splits a queue's range at its first unit whose record starts at or past the
local log's first offset:

    queue units   [min ........................ split ........................ max)
                   tiered: in object storage only   local: on this broker's disk

Each part's bytes are its unit count times the mean record size of up to ``STORAGE_SAMPLES`` of
its units, sampled evenly — an estimate: the CommitLog holds every tenant's records together, and
retention frees whole files. Without a tier, retention moves each queue's min offset to its first
unit whose record still exists, so nothing is tiered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from data_plane.store.retention import _first_unit_at
from data_plane.tenancy.namespace import tenant_of

if TYPE_CHECKING:
    from data_plane.store.consume_queue import ConsumeQueue
    from data_plane.store.message_store import MessageStore

STORAGE_SAMPLES = 8  # ConsumeQueue units sampled in each part of a queue to estimate its bytes


@dataclass(frozen=True, slots=True)
class TenantBytes:
    """Per tenant (tenants with nothing kept are left out)."""

    local: dict[str, int]  # on this broker's disk
    tiered: dict[str, int]  # in object storage only


def range_bytes(cq: ConsumeQueue, lo: int, hi: int) -> int:
    """The bytes of the records of queue units [lo, hi), estimated from up to
    ``STORAGE_SAMPLES`` units spread evenly over the range."""
    if hi <= lo:
        return 0
    step = max(1, (hi - lo) // STORAGE_SAMPLES)
    sizes = [u[1] for u in (cq.unit(i) for i in range(lo, hi, step)) if u is not None]
    return (hi - lo) * sum(sizes) // len(sizes) if sizes else 0


def queue_bytes(cq: ConsumeQueue, local_from: int) -> tuple[int, int]:
    """(local, tiered) bytes of one queue, split at its first unit whose record starts at or past
    CommitLog offset ``local_from`` (the local log's first offset)."""
    lo, hi = cq.min_offset_in_queue(), cq.max_offset_in_queue()
    if hi <= lo:
        return 0, 0
    split = _first_unit_at(cq, lo, hi, local_from)
    return range_bytes(cq, split, hi), range_bytes(cq, lo, split)


def measure(store: MessageStore, topics: Mapping[str, Mapping[str, Any]]) -> TenantBytes:
    """Each tenant's bytes over the write queues of its ``topics`` (name → topic config, as the
    broker's TopicConfigManager holds them; topics outside every tenant's namespace are skipped)."""
    local_from = store.commit_log.min_offset()
    local: dict[str, int] = {}
    tiered: dict[str, int] = {}
    for topic, tc in list(topics.items()):
        tenant = tenant_of(topic)
        if tenant is None:
            continue
        for q in range(int(tc.get("writeQueueNums", 0))):
            cq = store.queues.get(topic, q)
            if cq is None:
                continue
            here, there = queue_bytes(cq, local_from)
            if store.tier is not None:  # what only the tier's indexes still list
                there += store.tier.queues.bytes_below(topic, q, cq.min_offset_in_queue())
            if here:
                local[tenant] = local.get(tenant, 0) + here
            if there:
                tiered[tenant] = tiered.get(tenant, 0) + there
    return TenantBytes(local, tiered)
