"""Timed messages (RocketMQ 5's TimerMessageStore): delivery at a given second, up to
``timer_max_delay_s`` (7 days) ahead.

    send TIMER_DELIVER_MS=t to T/q ─▶ rmq_sys_wheel_timer queue 0 (REAL_TOPIC, REAL_QID, TIMER_OUT_MS=t)
        enqueue (every tick): read that queue from ``enqueueOffset`` ─▶ TimerLog unit in slot
            ceil(t / 1000) s ─▶ TimerWheel[slot] = (newest unit, count)
        deliver (every tick): for each second s from the cursor to now: walk slot s's units
            (TimerLog linked list) ─▶ re-put each message to T/q ─▶ drop the slot ─▶ cursor = s + 1

A tick touches the units of the due slots only: its cost does not depend on how many timers
wait for later seconds. A message is never delivered before its time and, on a running broker,
at most one second plus a tick after it.

Slots are absolute seconds. A message due further than ``timer_roll_window_s`` after the cursor
goes into the slot at the window's edge instead; when that slot fires the message is stored
again under rmq_sys_wheel_timer (a "roll", as in RocketMQ 5) and enqueued anew. Every held
message is therefore re-stored at least once per window, so CommitLog retention (72 h) never
deletes a pending timer's record when the window is shorter than the retention time.

State and recovery: ``config/timerCheckpoint.json`` holds ``enqueueOffset`` (next timer-queue
offset to enqueue), ``timerLogEnd`` (TimerLog units that reflect exactly the enqueued
messages), ``deliveredSecond`` (every slot before it was delivered) and ``scanFrom`` (the
CommitLog offset at which the current slot began to be delivered). At start the TimerLog is cut
to ``timerLogEnd``, the wheel is rebuilt from the units whose slot is not delivered, messages
from ``enqueueOffset`` on are enqueued again, and delivery resumes at ``deliveredSecond``; the
re-puts found after ``scanFrom`` are skipped (``reput``), so nothing is lost or duplicated.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from data_plane.broker.recall import RecallBook
from data_plane.broker.reput import Reputter, read_queue
from data_plane.broker.timer_log import NO_PREV, TimerLog, TimerLogError, TimerUnit
from data_plane.store import MessageStore
from data_plane.store.message import (
    OFF_PHYSICAL_OFFSET,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    RecordError,
    decode_properties,
    parse_record,
)

log = logging.getLogger(__name__)

TIMER_TOPIC = "rmq_sys_wheel_timer"
# RocketMQ 5's names. Asked for by the producer (any one of them):
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # epoch ms
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"  # seconds from the broker's now
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"  # milliseconds from the broker's now
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"  # epoch ms (Aliyun ONS)
TIMER_REQUEST_PROPERTIES = (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_START_DELIVER_TIME,
)
# Set by the broker: when the message is due (epoch ms); kept on the delivered message.
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"

_BATCH = 256


def due_second(due_ms: int) -> int:
    """The slot of a message due at ``due_ms``: the first whole second not before it."""
    return -(-due_ms // 1000)


class TimerWheel:
    """Slot second → (index of the slot's newest TimerLog unit, units in the slot). Only
    seconds with timers have an entry; memory grows with distinct seconds, not timers."""

    __slots__ = ("pending", "slots")

    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, int]] = {}
        self.pending = 0

    def last(self, slot_s: int) -> int:
        e = self.slots.get(slot_s)
        return e[0] if e is not None else NO_PREV

    def add(self, slot_s: int, index: int) -> None:
        e = self.slots.get(slot_s)
        self.slots[slot_s] = (index, (e[1] if e is not None else 0) + 1)
        self.pending += 1

    def pop(self, slot_s: int) -> tuple[int, int] | None:
        e = self.slots.pop(slot_s, None)
        if e is not None:
            self.pending -= e[1]
        return e


class TimerMessageService:
    def __init__(
        self,
        store: MessageStore,
        reputter: Reputter,
        log_dir: str,
        *,
        roll_window_s: int,
        units_per_segment: int,
    ) -> None:
        self.store = store
        self.reputter = reputter
        self.roll_window_s = max(1, roll_window_s)
        self.timer_log = TimerLog(log_dir, units_per_segment=units_per_segment)
        self.wheel = TimerWheel()
        self.enqueue_offset = 0
        self.cursor_s = 0  # every slot before it is delivered
        self.slot_scan_from = 0  # CommitLog end when delivery of the cursor's slot began
        self._current: list[TimerUnit] | None = None  # the cursor slot's units, oldest first
        self._current_pos = 0
        self.enqueue_blocked = False
        self.rolled = 0
        self.lost = 0
        self.recalls = RecallBook()  # timed messages recalled before their time (recall.py)

    # --- life cycle ----------------------------------------------------------------------------
    def load(self, doc: dict[str, Any] | None, now_ms: int) -> int:
        """Recover from the checkpoint ``doc`` (None: none was ever saved). Returns the CommitLog
        offset from which re-puts may not be accounted for by the recovered progress."""
        st = self.store
        if doc is None:
            self.enqueue_offset = st.min_offset_in_queue(TIMER_TOPIC, 0)
            self.cursor_s = now_ms // 1000
            end = 0
            # Progress unknown: any re-put in the log may be one of ours.
            self.slot_scan_from = st.min_phy_offset() if self.has_data() else st.max_phy_offset()
        else:
            self.enqueue_offset = max(int(doc["enqueueOffset"]), st.min_offset_in_queue(TIMER_TOPIC, 0))
            self.cursor_s = int(doc["deliveredSecond"])
            end = int(doc["timerLogEnd"])
            self.slot_scan_from = int(doc["scanFrom"])
        try:
            self.timer_log.load(end)
        except TimerLogError as e:
            # The files do not hold what the checkpoint says (lost or damaged): start the log
            # afresh and enqueue every timer message still in the store again. Re-puts already
            # made are recognised through the CommitLog scan (scanFrom is moved back).
            log.error("timer log unusable (%s): rebuilding it from %s", e, TIMER_TOPIC)
            self.timer_log.close()
            for name in os.listdir(self.timer_log.directory):
                os.unlink(os.path.join(self.timer_log.directory, name))
            self.timer_log.load(0)
            self.enqueue_offset = st.min_offset_in_queue(TIMER_TOPIC, 0)
            self.slot_scan_from = st.min_phy_offset()
        wheel = self.wheel
        cursor = self.cursor_s
        for index, unit in self.timer_log.scan():
            if unit.slot_s >= cursor:
                wheel.add(unit.slot_s, index)
        return self.slot_scan_from

    def close(self) -> None:
        self.timer_log.close()

    def snapshot(self) -> dict[str, int]:
        """The checkpoint of this moment (take it on the loop, between ticks)."""
        return {
            "enqueueOffset": self.enqueue_offset,
            "timerLogEnd": self.timer_log.end,
            "deliveredSecond": self.cursor_s,
            "scanFrom": self.slot_scan_from,
        }

    def has_data(self) -> bool:
        return self.store.max_offset_in_queue(TIMER_TOPIC, 0) > 0

    # --- enqueue -------------------------------------------------------------------------------
    def enqueue(self, budget: int) -> int:
        """Index newly stored timer messages (at most ``budget``); returns how many."""
        done = 0
        offset = self.enqueue_offset
        self.enqueue_blocked = False
        try:
            while done < budget:
                records, queue_offsets, next_offset = read_queue(
                    self.store, TIMER_TOPIC, 0, offset, min(_BATCH, budget - done), self.reputter.cold
                )
                if not records:
                    offset = next_offset
                    return done
                for raw, qoff in zip(records, queue_offsets, strict=True):
                    if not self._enqueue_one(raw):
                        self.enqueue_blocked = True
                        return done
                    offset = qoff + 1
                    done += 1
                offset = max(offset, next_offset)
            return done
        finally:
            self.enqueue_offset = offset

    def _enqueue_one(self, raw: memoryview) -> bool:
        try:
            parsed = parse_record(raw, check_crc=False)
            out_ms = int(decode_properties(parsed.properties).get(PROPERTY_TIMER_OUT_MS, "0"))
        except (RecordError, ValueError, UnicodeDecodeError) as e:
            log.error("%s: unreadable record skipped: %s", TIMER_TOPIC, e)
            return True
        phy = int.from_bytes(raw[OFF_PHYSICAL_OFFSET : OFF_PHYSICAL_OFFSET + 8], "big")
        cursor = self.cursor_s
        slot = max(due_second(out_ms), cursor)
        slot = min(slot, cursor + self.roll_window_s)
        try:
            index = self.timer_log.append(slot, phy, len(raw), self.wheel.last(slot))
        except OSError as e:
            log.error("cannot append to the timer log (timers wait): %s", e)
            return False
        self.wheel.add(slot, index)
        if slot == cursor and self._current is not None:
            # Late for the slot being delivered right now: deliver it with the slot.
            self._current.append(TimerUnit(slot, phy, len(raw), NO_PREV))
        return True

    # --- deliver -------------------------------------------------------------------------------
    def deliver(self, now_ms: int, budget: int) -> int:
        """Fire every slot up to the current second, at most ``budget`` messages; returns how
        many units were handled. Stops (to go on next tick) when the store refuses a re-put."""
        now_s = now_ms // 1000
        done = 0
        while self.cursor_s <= now_s and done < budget:
            units = self._current
            if units is None:
                units = self._current = self._slot_units(self.cursor_s)
                self._current_pos = 0
            while self._current_pos < len(units) and done < budget:
                if not self._fire(units[self._current_pos], self.cursor_s, now_ms):
                    return done
                self._current_pos += 1
                done += 1
            if self._current_pos < len(units):
                return done
            self.wheel.pop(self.cursor_s)
            self.cursor_s += 1
            self._current = None
            self.slot_scan_from = self.store.max_phy_offset()
        return done

    def _slot_units(self, slot_s: int) -> list[TimerUnit]:
        """The slot's units, oldest first (the list is linked newest first)."""
        units: list[TimerUnit] = []
        index = self.wheel.last(slot_s)
        first = self.timer_log.first
        while index != NO_PREV and index >= first:
            try:
                unit = self.timer_log.read(index)
            except TimerLogError as e:
                log.error("timer log unit %d of slot %d unreadable: %s", index, slot_s, e)
                break
            units.append(unit)
            index = unit.prev
        units.reverse()
        return units

    def _fire(self, unit: TimerUnit, slot_s: int, now_ms: int) -> bool:
        m = self.store.look_message_by_offset(unit.phy_offset)
        if m is None and self.store.cold(unit.phy_offset):
            self.reputter.cold.add((unit.phy_offset, -1))  # in the tier, not fetched yet: next tick
            return False
        if m is None or m.topic != TIMER_TOPIC:
            self.lost += 1
            log.error("timer message at CommitLog offset %d is gone (retention?): lost", unit.phy_offset)
            return True
        props = dict(m.properties)
        try:
            due_ms = int(props.get(PROPERTY_TIMER_OUT_MS, "0"))
        except ValueError:
            due_ms = 0
        if due_second(due_ms) > slot_s:  # not yet: store it again and let it move further
            self.rolled += 1
            return self.reputter.reput(m, TIMER_TOPIC, 0, props)
        topic = props.get(PROPERTY_REAL_TOPIC)
        qid = props.get(PROPERTY_REAL_QUEUE_ID, "")
        if not topic or not qid.isdigit():
            log.error("%s: message %s has no REAL_TOPIC/REAL_QID; dropped", TIMER_TOPIC, m.msg_id)
            self.reputter.dropped += 1
            return True
        if self.recalls.take(topic, props.get(PROPERTY_UNIQ_KEY)):
            return True  # recalled: not delivered
        for name in TIMER_REQUEST_PROPERTIES:
            props.pop(name, None)
        return self.reputter.reput(m, topic, int(qid), props)

    def pending(self) -> int:
        """Timers not yet delivered: indexed ones plus those stored but not yet indexed."""
        waiting = max(0, self.store.max_offset_in_queue(TIMER_TOPIC, 0) - self.enqueue_offset)
        fired = self._current_pos if self._current is not None else 0
        return self.wheel.pending - fired + waiting

    def __repr__(self) -> str:
        return f"TimerMessageService(cursor={self.cursor_s}, pending={self.wheel.pending})"
