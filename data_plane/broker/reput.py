"""Reputter: how the schedule services hand a held message back to its topic, exactly once.

    source record (SCHEDULE_TOPIC_XXXX / rmq_sys_wheel_timer) ──▶ Message(REAL_TOPIC, REAL_QID,
        properties + ORBIT_REPUT_FROM=<source CommitLog offset>) ──▶ MessageStore.append ──▶ held pulls

Re-puts go to the store directly (not through the send path's auth and quota hooks: the message
was admitted when it was sent) and wake the queue's held pulls as a send does.

Every re-put carries ``ORBIT_REPUT_FROM``, the CommitLog offset of the record it came from. The
services' checkpoints record a CommitLog offset ``scanFrom`` below which every re-put is already
accounted for by the checkpointed progress; after a restart ``scan_reputs`` reads the log from
there and collects the sources already re-put, and ``reput`` skips those (counted in
``duplicates_skipped``) instead of storing them twice. That closes the window between a re-put
and the checkpoint that records it. Sources found so but not yet fired again are saved with
the next checkpoints (``reputBefore``), so a second crash still knows them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from data_plane.store import MessageStore
from data_plane.store.message import (
    PROPERTY_TAGS,
    Message,
    RecordError,
    StoredMessage,
    decode_record,
    pack_host,
    tags_hash_code,
)
from data_plane.store.status import GetMessageStatus, PutMessageStatus

log = logging.getLogger(__name__)

PROPERTY_REPUT_FROM = "ORBIT_REPUT_FROM"
_MARKER = PROPERTY_REPUT_FROM.encode() + b"\x01"

# notify(topic, queue_id, max_offset_exclusive, tags_code): PullRequestHoldService.notify
Notify = Callable[[str, int, int, int], None]


def scan_reputs(store: MessageStore, from_offset: int) -> dict[int, int]:
    """Source offset → offset of its re-put, for every record carrying ``ORBIT_REPUT_FROM``
    from ``from_offset`` to the end of the CommitLog."""
    cl = store.commit_log
    start = max(from_offset, cl.min_offset())
    out: dict[int, int] = {}
    for _end, req in cl.scan(start, check_crc=False):
        if req is None:
            continue
        raw = cl.read_record(req.commit_log_offset)
        if raw is None or _MARKER not in bytes(raw):
            continue
        try:
            m = decode_record(raw, check_crc=False)
        except RecordError:
            continue
        src = m.properties.get(PROPERTY_REPUT_FROM, "")
        if src.isdigit():
            out[int(src)] = req.commit_log_offset
    return out


class Reputter:
    __slots__ = ("already", "cold", "dropped", "duplicates_skipped", "notify", "reputs", "store")

    def __init__(self, store: MessageStore, notify: Notify | None) -> None:
        self.store = store
        self.notify = notify
        # Sources re-put before a crash that the recovered progress fires again → "delay" | "timer"
        self.already: dict[int, str] = {}
        # CommitLog offsets of held records the services stopped at because they are only in the
        # tier now, not in memory (their local file went before they were due): the schedule's
        # loop fetches them, and a later tick reads them.
        self.cold: set[tuple[int, int]] = set()  # what reads stopped at: (record offset, units address)
        self.reputs = 0
        self.duplicates_skipped = 0
        self.dropped = 0

    def reput(self, src: StoredMessage, topic: str, queue_id: int, properties: dict[str, str]) -> bool:
        """Store ``src``'s body and fields under ``topic``/``queue_id`` with ``properties`` (and
        the marker). True when done (or skipped: already re-put, or unstorable and dropped);
        False when the store refused for now (full disk, stopping): try again later."""
        origin = src.commit_log_offset
        if self.already and self.already.pop(origin, None) is not None:
            self.duplicates_skipped += 1
            return True
        properties[PROPERTY_REPUT_FROM] = str(origin)
        msg = Message(
            topic,
            src.body,
            queue_id,
            src.flag,
            properties,
            src.sys_flag,
            src.born_timestamp,
            pack_host(*src.born_host),
            src.reconsume_times,
        )
        result, _end = self.store.entry.append([msg])
        a = result.append
        if a is None:
            if result.status in (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED):
                self.dropped += 1
                log.error("dropping held message %s for %s/%d: %s", src.msg_id, topic, queue_id, result.reason)
                return True
            return False
        self.reputs += 1
        if self.notify is not None:
            tags = properties.get(PROPERTY_TAGS)
            self.notify(topic, queue_id, a.queue_offset + a.msg_num, tags_hash_code(tags) if tags else 0)
        return True


_SKIP = frozenset(
    {
        GetMessageStatus.OFFSET_TOO_SMALL,
        GetMessageStatus.MESSAGE_WAS_REMOVING,
        GetMessageStatus.OFFSET_FOUND_NULL,
        GetMessageStatus.NO_MATCHED_MESSAGE,
    }
)


def read_queue(
    store: MessageStore, topic: str, queue_id: int, offset: int, max_n: int, cold: set[tuple[int, int]]
) -> tuple[list[memoryview], list[int], int]:
    """Up to ``max_n`` records of a schedule queue from ``offset``: ``(records, their queue
    offsets, where to read next)``. Units whose records are gone (retention) are passed over
    with a warning; an offset past the queue's end (a store that lost its tail) moves back to
    the end. A tiered record (or tiered units) not in memory stops the read there, what it
    stopped at added to ``cold`` (``MessageStore.fetch_cold_need`` brings it)."""
    r = store.get_message(topic, queue_id, offset, max_n)
    if r.cold and not r.messages:
        cold.add((r.cold_offset, r.cold_units))
    status = r.status
    if status is GetMessageStatus.FOUND:
        return r.messages, r.queue_offsets, r.next_begin_offset
    if status in _SKIP and r.next_begin_offset > offset:
        log.warning("%s/%d: records %d..%d are gone (%s); skipped", topic, queue_id, offset,
                    r.next_begin_offset - 1, status.value)  # fmt: skip
        return [], [], r.next_begin_offset
    if status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
        log.warning("%s/%d: offset %d is past the queue's end %d", topic, queue_id, offset, r.max_offset)
        return [], [], r.max_offset
    return [], [], offset
