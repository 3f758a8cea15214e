"""Recalling a timed message before it is delivered (RocketMQ 5's RecallMessage).

A recall is a record on the system topic ``rmq_sys_RECALL`` (in the CommitLog, so it survives a
restart and reaches the slaves like the timed message itself) naming the message's topic, its
message id and its delivery time; a recall drops only a message of the topic it names (the caller
may publish to that topic), so naming another tenant's message id reaches nothing. The timer
service asks the book before it delivers a message and drops a recalled one instead. A broker
rebuilds the book from the records whose delivery time is not long past when its schedule starts.

Recall handles are what a v5 producer is given for a timed message: base64url of
``topic \\n message id \\n delivery ms``. A handle names nothing the holder could not name anyway;
the caller checks that the holder may publish to the topic.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from typing import TYPE_CHECKING

import orjson

from data_plane.store.message import Message, decode_record
from data_plane.store.status import GetMessageStatus, PutMessageStatus

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)

RECALL_TOPIC = "rmq_sys_RECALL"
MAX_RECALLS = 1_000_000
KEEP_PAST_DUE_MS = 24 * 3600 * 1000  # a timer late by a day still finds its recall


def recall_handle(topic: str, message_id: str, due_ms: int) -> str:
    return base64.urlsafe_b64encode(f"{topic}\n{message_id}\n{due_ms}".encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str, int]:
    """``(topic, message id, delivery ms)``; ValueError when ``handle`` is not a recall handle."""
    if len(handle) > 1024:
        raise ValueError("too long")
    try:
        topic, message_id, due = base64.urlsafe_b64decode(handle.encode()).decode().split("\n")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a recall handle") from None
    if not topic or not message_id or not due.isdigit():
        raise ValueError("not a recall handle")
    return topic, message_id, int(due)


class RecallBook:
    def __init__(self) -> None:
        self.recalled: dict[tuple[str, str], int] = {}  # (topic, message id) -> delivery ms
        self.dropped = 0  # recalled messages the timer did not deliver

    def load(self, store: MessageStore, now_ms: int | None = None) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        offset = store.min_offset_in_queue(RECALL_TOPIC, 0)
        end = store.max_offset_in_queue(RECALL_TOPIC, 0)
        while offset < end:
            got = store.get_message(RECALL_TOPIC, 0, offset, 256)
            if got.status is not GetMessageStatus.FOUND:
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset
                continue
            for view in got.messages:
                topic, message_id, due = orjson.loads(decode_record(view, check_crc=False).body)
                if due > now - KEEP_PAST_DUE_MS and len(self.recalled) < MAX_RECALLS:
                    self.recalled[(topic, message_id)] = due
            offset = got.next_begin_offset
        if self.recalled:
            log.info("recalled timed messages not yet due: %d", len(self.recalled))

    def recall(self, store: MessageStore, topic: str, message_id: str, due_ms: int) -> tuple[PutMessageStatus, int]:
        """Record the recall; (status, CommitLog end) of its record. ValueError when the book is
        full (MAX_RECALLS recalls not yet due)."""
        if len(self.recalled) >= MAX_RECALLS:
            self.expire()
            if len(self.recalled) >= MAX_RECALLS:
                raise ValueError(f"{MAX_RECALLS} recalls wait already")
        record = Message(
            RECALL_TOPIC, orjson.dumps([topic, message_id, due_ms]), 0, born_timestamp=int(time.time() * 1000)
        )
        result, _end = store.entry.append([record])
        a = result.append
        if result.status is PutMessageStatus.PUT_OK:
            self.recalled[(topic, message_id)] = due_ms
        return result.status, (a.wrote_offset + a.wrote_bytes) if a is not None else 0

    def take(self, topic: str | None, message_id: str | None) -> bool:
        """Whether the timer must drop this message of ``topic`` (recalled); forgets the recall."""
        if topic is None or message_id is None or self.recalled.pop((topic, message_id), None) is None:
            return False
        self.dropped += 1
        return True

    def expire(self, now_ms: int | None = None) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        self.recalled = {k: v for k, v in self.recalled.items() if v > now - KEEP_PAST_DUE_MS}
