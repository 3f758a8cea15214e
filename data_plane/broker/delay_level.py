"""DelayLevelService: RocketMQ's ScheduleMessageService — messages sent with ``DELAY=<level>``.

    send DELAY=3 to T/q ─▶ SCHEDULE_TOPIC_XXXX queue 2 (REAL_TOPIC=T, REAL_QID=q, DELAY=3)
    every tick, per level: read the level's queue from its offset, in order; while the next
    record's store time + the level's delay has passed ─▶ re-put it to T/q without DELAY ─▶ offset+1

One queue per level keeps each level's messages in due order (same delay, stored in order), so a
tick reads one record per level that is not yet due: the cost does not grow with how many
messages wait. Levels come from ``message_delay_level`` (RocketMQ's "1s 5s 10s 30s 1m … 2h"
format: a number and one of s m h d per level).

Progress (the next offset of each level's queue) is saved in ``config/delayOffset.json``
(RocketMQ's file) as ``{"offsetTable": {"<level>": offset}, "scanFrom": <CommitLog offset>}``
by ``Schedule``; see ``reput`` for how re-puts made after the last save are recognised after
a crash.
"""

from __future__ import annotations

import logging
from typing import Any

from data_plane.broker.reput import Reputter, read_queue
from data_plane.store import MessageStore
from data_plane.store.message import (
    OFF_STORE_TIMESTAMP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    STORE_TIMESTAMP,
    RecordError,
    decode_record,
)

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_BATCH = 32


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel`` ("1s 5s … 2h") as milliseconds per level (level 1
    first). ValueError says what is wrong."""
    out = []
    for item in text.split():
        unit = _UNIT_MS.get(item[-1:])
        number = item[:-1]
        if unit is None or not number.isdigit():
            raise ValueError(f"delay level {item!r} is not a whole number followed by s, m, h or d")
        out.append(int(number) * unit)
    if not out:
        raise ValueError("message_delay_level names no level")
    return tuple(out)


def _real_destination(props: dict[str, str]) -> tuple[str, int] | None:
    topic = props.get(PROPERTY_REAL_TOPIC)
    qid = props.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not qid.isdigit():
        return None
    return topic, int(qid)


class DelayLevelService:
    def __init__(self, store: MessageStore, reputter: Reputter, delays_ms: tuple[int, ...]) -> None:
        self.store = store
        self.reputter = reputter
        self.delays_ms = delays_ms
        self.offsets: list[int] = [0] * len(delays_ms)  # next queue offset of each level (index level-1)

    @property
    def levels(self) -> int:
        return len(self.delays_ms)

    def load(self, doc: dict[str, Any] | None) -> None:
        table = (doc or {}).get("offsetTable") or {}
        for i in range(self.levels):
            saved = table.get(str(i + 1))
            first = self.store.min_offset_in_queue(SCHEDULE_TOPIC, i)
            self.offsets[i] = max(int(saved), first) if saved is not None else first

    def snapshot(self) -> dict[str, int]:
        return {str(i + 1): off for i, off in enumerate(self.offsets)}

    def pending(self) -> int:
        """Messages held in the level queues (stored, not yet re-put)."""
        st = self.store
        return sum(max(0, st.max_offset_in_queue(SCHEDULE_TOPIC, i) - off) for i, off in enumerate(self.offsets))

    def has_data(self) -> bool:
        return any(self.store.max_offset_in_queue(SCHEDULE_TOPIC, i) > 0 for i in range(self.levels))

    def tick(self, now_ms: int, budget: int) -> int:
        """Re-put every due message, at most ``budget``; returns how many records were handled.
        Stops early (to try again next tick) when the store refuses a re-put."""
        done = 0
        for i, delay in enumerate(self.delays_ms):
            n, blocked = self._level(i, delay, now_ms, budget - done)
            done += n
            if blocked or done >= budget:
                break
        return done

    def _level(self, i: int, delay_ms: int, now_ms: int, budget: int) -> tuple[int, bool]:
        done = 0
        offset = self.offsets[i]
        try:
            while done < budget:
                records, queue_offsets, next_offset = read_queue(
                    self.store, SCHEDULE_TOPIC, i, offset, min(_BATCH, budget - done), self.reputter.cold
                )
                if not records:
                    offset = next_offset
                    return done, False
                for raw, qoff in zip(records, queue_offsets, strict=True):
                    stored_ms = STORE_TIMESTAMP.unpack_from(raw, OFF_STORE_TIMESTAMP)[0]
                    if stored_ms + delay_ms > now_ms:
                        return done, False
                    if not self._reput(raw):
                        return done, True
                    offset = qoff + 1
                    done += 1
                offset = max(offset, next_offset)
            return done, False
        finally:
            self.offsets[i] = offset

    def _reput(self, raw: memoryview) -> bool:
        try:
            m = decode_record(raw)
        except RecordError as e:
            log.error("%s: unreadable record skipped: %s", SCHEDULE_TOPIC, e)
            return True
        props = dict(m.properties)
        dest = _real_destination(props)
        if dest is None:
            log.error("%s: message %s has no REAL_TOPIC/REAL_QID; dropped", SCHEDULE_TOPIC, m.msg_id)
            self.reputter.dropped += 1
            return True
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        return self.reputter.reput(m, dest[0], dest[1], props)
