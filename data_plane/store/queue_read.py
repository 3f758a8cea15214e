"""A queue's pull read: up to n messages of a ConsumeQueue from an offset, as views of the
CommitLog's mapped files (RocketMQ's ``getMessage``), with tag and record filters and, for the
wire, back-to-back records coalesced into one slice. ``MessageStore.get_message`` is the entry."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from data_plane.store import fastpath
from data_plane.store.layouts import CQ_UNIT
from data_plane.store.status import GetMessageResult, GetMessageStatus

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

RecordFilter = Callable[[memoryview], bool]


def get_message(
    store: MessageStore,
    topic: str,
    queue_id: int,
    offset: int,
    max_msg_nums: int,
    *,
    tags_codes: Collection[int] | None = None,
    record_filter: RecordFilter | None = None,
    coalesce: bool = False,
) -> GetMessageResult:
    """Up to ``max_msg_nums`` messages of a queue from ``offset``: RocketMQ's pull read.
    ``tags_codes`` filters on the ConsumeQueue's tag hash (None: every tag);
    ``record_filter`` is then applied to each record's bytes. With ``coalesce`` (the wire
    form a pull answers with), records that lie back to back in the CommitLog come as one
    slice of ``messages``; ``queue_offsets`` still has one entry per message."""
    cq = store.queues.get(topic, queue_id)
    if cq is None:
        return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=0)
    local_min = cq.min_offset_in_queue()
    min_offset = queue_min(store, topic, queue_id, local_min)
    max_offset = cq.max_offset_in_queue()
    result = GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, min_offset=min_offset, max_offset=max_offset)
    if max_offset == 0:
        result.status = GetMessageStatus.NO_MESSAGE_IN_QUEUE
        result.next_begin_offset = 0
        return result
    if offset < min_offset:
        result.status = GetMessageStatus.OFFSET_TOO_SMALL
        result.next_begin_offset = min_offset
        return result
    if offset == max_offset:
        result.status = GetMessageStatus.OFFSET_OVERFLOW_ONE
        result.next_begin_offset = offset
        return result
    if offset > max_offset:
        result.status = GetMessageStatus.OFFSET_OVERFLOW_BADLY
        result.next_begin_offset = min_offset if min_offset == 0 else max_offset
        return result
    max_msg_nums = max(1, max_msg_nums)
    # Scan at least a page of units so that a selective tag filter still makes progress.
    want = max(max_msg_nums, 800 if tags_codes is not None or record_filter else 0)
    tier = store.tier
    if offset < local_min and tier is not None:  # units the local queue no longer holds
        tiered = tier.units(topic, queue_id, offset, want)
        if isinstance(tiered, int):  # not in memory: the caller fetches them (``fetch_cold_read``)
            result.cold_units = -1 - tiered
            result.next_begin_offset = offset
            return result
        if tiered is None:  # units that are gone: go on where there are some
            result.status = GetMessageStatus.OFFSET_FOUND_NULL
            result.next_begin_offset = min(tier.gap(topic, queue_id, offset) or local_min, local_min)
            return result
        found: tuple[memoryview, int] | None = tiered
    else:
        found = cq.units(offset, want)
    if found is None:
        result.status = GetMessageStatus.OFFSET_FOUND_NULL
        result.next_begin_offset = offset + 1
        return result
    units, n = found
    cl = store.commit_log
    log_min = cl.min_offset()
    max_bytes = store.config.max_transfer_bytes_on_message
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    messages = result.messages
    queue_offsets = result.queue_offsets
    total_bytes = 0
    unpack = CQ_UNIT.unpack_from
    # The compiled loop when built; the pure-Python twin of it is no faster than the loop below.
    collect = fastpath.collect_units if fastpath.COMPILED and record_filter is None else None
    cur = None
    cur_from = cur_end = 0
    i = 0
    last_phy = 0
    run_at = run_end = -1  # coalesce: the last slice below covers [run_at, ...) of cur, up to run_end (log)
    while i < n:
        if collect is not None:  # the common units, in a loop of their own
            got = collect(
                units, i, n, cur, cur_from, cur_end, log_min, max_msg_nums, max_bytes, total_bytes,
                tags_codes, messages, queue_offsets, offset, coalesce,
            )  # fmt: skip
            i, total_bytes = got.next_unit, got.total_bytes
            run_end = -1
            if got.last_phy_offset:
                last_phy = got.last_phy_offset
            if got.full or i >= n:
                break
        # One unit the loop above stopped at (or every unit, without it).
        phy, size, tags = unpack(units, i * 20)
        if queue_offsets and (len(queue_offsets) >= max_msg_nums or total_bytes + size > max_bytes):
            break
        i += 1
        if phy < log_min and tier is not None and size > 0 and tier.covers(phy):
            # Tiered: from the tier's memory, or stop here for the caller to fetch it.
            if tags_codes is not None and tags not in tags_codes:
                continue
            view = tier.view(phy, size)
            if view is None:
                i -= 1
                result.cold_offset = phy
                break
            if record_filter is not None and not record_filter(view):
                continue
            messages.append(view)
            queue_offsets.append(offset + i - 1)
            total_bytes += size
            last_phy = phy
            run_end = -1
            continue
        if phy < log_min or size <= 0:
            if not messages:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
            continue
        if tags_codes is not None and tags not in tags_codes:
            continue
        if not cur_from <= phy < cur_end:
            mf = cl.mfq.find_by_offset(phy)
            if mf is None:
                if not messages:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            cur = mf.mv
            cur_from = mf.file_from_offset
            cur_end = cur_from + mf.wrote_position
            run_end = -1
            if collect is not None and cur_from <= phy < cur_end:
                i -= 1  # the loop above takes this unit, and those after it, from the file
                continue
        pos = phy - cur_from
        if phy + size > cur_end or cur is None:
            if not messages:
                status = GetMessageStatus.OFFSET_FOUND_NULL
            continue
        record = cur[pos : pos + size]
        if record_filter is not None and not record_filter(record):
            continue
        if coalesce and phy == run_end:
            messages[-1] = cur[run_at : pos + size]
        else:
            messages.append(record)
            run_at = pos
        run_end = phy + size
        queue_offsets.append(offset + i - 1)
        total_bytes += size
        last_phy = phy
    if messages:  # any other status is only ever set while nothing was found
        status = GetMessageStatus.FOUND
    result.status = status
    result.next_begin_offset = offset + i
    result.buffer_total_size = total_bytes
    if messages:
        behind = cl.max_offset() - last_phy
        # (a tiered read is never suggested to a slave: the slave reads the same bucket)
        result.suggest_pulling_from_slave = behind > store.hot_data_bytes and last_phy >= log_min
    return result


def queue_min(store: MessageStore, topic: str, queue_id: int, local_min: int) -> int:
    """A queue's first offset: in the tier's indexes when they reach further back than the local
    queue's units."""
    tier = store.tier
    first = tier.queues.first(topic, queue_id) if tier is not None else None
    return first if first is not None and first < local_min else local_min
