"""Schedule: delayed messages (RocketMQ's 18 ``DELAY`` levels) and timed messages (RocketMQ 5's
``TIMER_DELIVER_MS`` / ``TIMER_DELAY_SEC``, up to ``timer_max_delay_s`` ahead) on the broker.

    SendProcessor ─▶ schedule.redirect(msgs) ─▶ MessageStore.append
        TIMER_* later than now  → rmq_sys_wheel_timer / 0      (timer_wheel.TimerMessageService)
        DELAY=n (n > 0)         → SCHEDULE_TOPIC_XXXX / n-1    (delay_level.DelayLevelService)
    tick loop, every schedule_tick_ms: due delay levels, timer enqueue, due timer slots
        ─▶ reput.Reputter ─▶ MessageStore.append (REAL_TOPIC / REAL_QID) ─▶ held pulls woken
    checkpoint loop, every schedule_checkpoint_interval_ms: a snapshot taken on the loop, then on
        a worker thread: wait until the CommitLog is durable past the snapshot, fsync the
        TimerLog, save config/delayOffset.json and config/timerCheckpoint.json

Anything that stores a message which may carry ``DELAY`` (a retry helper sending to
``%RETRY%<group>``, a transaction commit) calls ``redirect`` on it before ``MessageStore.append``,
as the send path does. ``redirect`` leaves prepared transaction halves alone (RocketMQ's rule).

Guarantee (proved by tests/integration/test_delayed_messages.py with kill -9): a message whose
send was answered SEND_OK is delivered to its topic exactly once, never before its time, also
across a crash or restart at any moment; due messages that a stopped broker could not deliver
go out at once after it starts. The checkpoint never claims progress whose re-puts are not on
disk, so the same holds across a power loss for SYNC_FLUSH brokers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from data_plane.broker.delay_level import SCHEDULE_TOPIC, DelayLevelService, parse_delay_levels
from data_plane.broker.persisted import ConfigFile, SaveBehind
from data_plane.broker.reput import PROPERTY_REPUT_FROM, Notify, Reputter, scan_reputs
from data_plane.broker.timer_wheel import (
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    TIMER_REQUEST_PROPERTIES,
    TIMER_TOPIC,
    TimerMessageService,
)
from data_plane.store import MessageStore
from data_plane.store.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    properties_of,
    topic_of,
)
from data_plane.store.tier.object_store import ObjectStoreError
from data_plane.tasks import cancel_all

if TYPE_CHECKING:
    from data_plane.broker.config import BrokerConfig

log = logging.getLogger(__name__)

SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})
# Properties the schedule acts on: a delay level or delivery time moves the message to a schedule
# topic; the re-put marker is the broker's own (a client's is dropped).
TRIGGER_PROPERTIES = frozenset({PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REPUT_FROM, *TIMER_REQUEST_PROPERTIES})
_TICK_BUDGET = 2_000  # messages re-put / indexed per service per tick before yielding the loop


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def config_problems(config: BrokerConfig) -> list[str]:
    """What is wrong with the schedule settings of ``config`` (BrokerConfig.validate)."""
    out = []
    try:
        parse_delay_levels(config.message_delay_level)
    except ValueError as e:
        out.append(f"message_delay_level: {e}")
    if config.timer_max_delay_s < 1:
        out.append("timer_max_delay_s must be >= 1")
    if config.timer_roll_window_s < 1:
        out.append("timer_roll_window_s must be >= 1")
    if config.schedule_tick_ms < 1 or config.schedule_checkpoint_interval_ms < 1:
        out.append("schedule_tick_ms and schedule_checkpoint_interval_ms must be >= 1")
    if config.timer_log_segment_units < 1:
        out.append("timer_log_segment_units must be >= 1")
    return out


class Schedule:
    def __init__(self, config: BrokerConfig, *, clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        self.config = config
        self.clock_ms = clock_ms
        self.delays_ms = parse_delay_levels(config.message_delay_level)
        self.max_delay_ms = config.timer_max_delay_s * 1000
        conf_dir = os.path.join(config.store_dir, "config")
        self._delay_file = ConfigFile(os.path.join(conf_dir, "delayOffset.json"))
        # A slave's copy of its master's delay progress, saved on a worker thread.
        self._master_delay: dict[str, Any] = {}
        self._master_delay_behind = SaveBehind(self._delay_file, lambda: self._master_delay, "delay progress")
        self._timer_file = ConfigFile(os.path.join(conf_dir, "timerCheckpoint.json"))
        self._log_dir = os.path.join(config.store_dir, "timerlog")
        self.store: MessageStore | None = None
        self.reputter: Reputter | None = None
        self.levels: DelayLevelService | None = None
        self.timers: TimerMessageService | None = None
        self._saved: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.ticks = 0

    # --- the send path's hook --------------------------------------------------------------------
    def redirect(self, msgs: list[Message]) -> str | None:
        """Move delayed and timed messages to their schedule topic (in place). Returns why the
        messages must be refused (MESSAGE_ILLEGAL), or None."""
        if len(msgs) != 1:
            # A batch's messages, looked at in C (map) first: nearly all batches are plain.
            if all(map(TRIGGER_PROPERTIES.isdisjoint, map(properties_of, msgs))) and not any(
                map(SYSTEM_TOPICS.__contains__, map(topic_of, msgs))
            ):
                return None
            for m in msgs:
                if m.topic in SYSTEM_TOPICS:
                    return f"topic {m.topic} is a system topic"
                if not TRIGGER_PROPERTIES.isdisjoint(m.properties):
                    m.properties.pop(PROPERTY_REPUT_FROM, None)  # the broker's own: never a client's
                    if not TRIGGER_PROPERTIES.isdisjoint(m.properties):
                        return "delayed and timed messages cannot be sent in a batch"
            return None
        m = msgs[0]
        if m.topic in SYSTEM_TOPICS:
            return f"topic {m.topic} is a system topic"
        props = m.properties
        if TRIGGER_PROPERTIES.isdisjoint(props):
            return None
        props.pop(PROPERTY_REPUT_FROM, None)  # the broker's own (reput): never a client's
        if m.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_PREPARED_TYPE:
            return None  # a half message: its commit is redirected, not the half
        try:
            due_ms = self._due_ms(props)
        except ValueError as e:
            return str(e)
        if due_ms is not None:
            ahead = due_ms - self.clock_ms()
            if ahead > self.max_delay_ms:
                return (
                    f"the delivery time is {ahead // 1000} s ahead, more than timer_max_delay_s "
                    f"({self.max_delay_ms // 1000} s)"
                )
            if ahead > 0:
                props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
                props[PROPERTY_TIMER_OUT_MS] = str(due_ms)
                _move(m, TIMER_TOPIC, 0)
                return None
        raw = props.get(PROPERTY_DELAY_TIME_LEVEL)
        if raw is None:
            return None
        try:
            level = int(raw)
        except ValueError:
            return f"DELAY {raw!r} is not a whole number (a delay level, 1..{len(self.delays_ms)})"
        if level <= 0:
            return None
        level = min(level, len(self.delays_ms))
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        _move(m, SCHEDULE_TOPIC, level - 1)
        return None

    def _due_ms(self, props: dict[str, str]) -> int | None:
        """When a timed message is due (epoch ms), from whichever property asks; None if none."""
        for name, relative, scale in (
            (PROPERTY_TIMER_DELIVER_MS, False, 1),
            (PROPERTY_TIMER_DELAY_SEC, True, 1000),
            (PROPERTY_TIMER_DELAY_MS, True, 1),
            (PROPERTY_START_DELIVER_TIME, False, 1),
        ):
            raw = props.get(name)
            if raw is None:
                continue
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name} {raw!r} is not a whole number") from None
            return self.clock_ms() + value * scale if relative else value
        return None

    # --- life cycle ------------------------------------------------------------------------------
    async def start(self, store: MessageStore, notify: Notify | None) -> None:
        """Recover (before the broker serves) and start the tick and checkpoint loops."""
        self.store = store
        cfg = self.config
        # A promoted slave: the progress its master sent last (its save may still be on its way).
        delay_doc = self._master_delay or self._delay_file.load()
        timer_doc = self._timer_file.load()
        reputter = self.reputter = Reputter(store, notify)
        levels = self.levels = DelayLevelService(store, reputter, self.delays_ms)
        levels.load(delay_doc)
        timers = self.timers = TimerMessageService(
            store,
            reputter,
            self._log_dir,
            roll_window_s=cfg.timer_roll_window_s,
            units_per_segment=cfg.timer_log_segment_units,
        )
        timer_scan = await asyncio.to_thread(timers.load, timer_doc, self.clock_ms())
        await asyncio.to_thread(timers.recalls.load, store, self.clock_ms())
        if delay_doc is not None and isinstance(delay_doc.get("scanFrom"), int):
            delay_scan = int(delay_doc["scanFrom"])
        else:  # progress unknown: any re-put in the log may be one of ours
            delay_scan = store.min_phy_offset() if levels.has_data() else store.max_phy_offset()
        scan_from = min(delay_scan, timer_scan, store.max_phy_offset())
        for doc, kind in ((delay_doc, "delay"), (timer_doc, "timer")):
            for src in (doc or {}).get("reputBefore") or ():
                reputter.already[int(src)] = kind  # found after an earlier crash, not yet fired again
        if scan_from < store.max_phy_offset():
            began = time.monotonic()
            found = await asyncio.to_thread(scan_reputs, store, scan_from)
            reputter.already.update(self._refire_candidates(found, delay_scan, timer_scan))
            log.info(
                "schedule recovery: %d re-puts after CommitLog offset %d, %d of them not in the checkpoint "
                "(%.0f ms scan)",
                len(found), scan_from, len(reputter.already), (time.monotonic() - began) * 1000,
            )  # fmt: skip
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._tick_loop(), name="orbit-schedule-tick"),
            loop.create_task(self._checkpoint_loop(), name="orbit-schedule-checkpoint"),
        ]
        if store.tier is not None:
            self._tasks.append(loop.create_task(self._cold_loop(), name="orbit-schedule-cold"))
        log.info(
            "schedule: %d delay levels, %d held, %d timers pending, cursor %d",
            levels.levels, levels.pending(), timers.pending(), timers.cursor_s,
        )  # fmt: skip

    def _refire_candidates(self, found: dict[int, int], delay_scan: int, timer_scan: int) -> dict[int, str]:
        """Of the re-puts ``found`` (source → re-put offset), those whose source the recovered
        progress will fire again: each service's own, made after its own ``scanFrom``, and for a
        delay level, at or after the level's recovered offset. Only these can be duplicated, and
        each of them is matched (and dropped from the set) when it fires."""
        assert self.store is not None
        assert self.levels is not None
        offsets = self.levels.offsets
        out = {}
        for src, at in found.items():
            m = self.store.look_message_by_offset(src)
            if m is None:
                continue
            if m.topic == SCHEDULE_TOPIC:
                q = m.queue_id
                if at >= delay_scan and q < len(offsets) and m.queue_offset >= offsets[q]:
                    out[src] = "delay"
            elif m.topic == TIMER_TOPIC and at >= timer_scan:
                out[src] = "timer"
        return out

    async def stop(self) -> None:
        """Stop the loops and save a last checkpoint (before the store shuts down)."""
        await cancel_all(self._tasks)
        self._tasks = []
        if self.timers is None:
            return
        try:
            await self.persist(wait_durable=False)  # the store's shutdown flushes everything next
        except OSError:
            log.exception("saving the schedule checkpoint failed")
        self.timers.close()

    # --- work ------------------------------------------------------------------------------------
    def tick(self, now_ms: int | None = None) -> int:
        """One round of every service; returns how many messages it handled."""
        assert self.levels is not None
        assert self.timers is not None
        now = self.clock_ms() if now_ms is None else now_ms
        self.ticks += 1
        done = self.levels.tick(now, _TICK_BUDGET)
        done += self.timers.enqueue(_TICK_BUDGET)
        done += self.timers.deliver(now, _TICK_BUDGET)
        return done

    async def _tick_loop(self) -> None:
        interval = self.config.schedule_tick_ms / 1000
        while True:
            try:
                busy = self.tick() >= _TICK_BUDGET
            except Exception:
                log.exception("schedule tick failed")
                busy = False
            await asyncio.sleep(0 if busy else interval)

    async def _cold_loop(self) -> None:
        """Held messages whose records are only in the tier (their local file went before they
        were due): fetched here, off the ticks, which stop at them until they are in memory."""
        assert self.store is not None
        assert self.reputter is not None
        interval = self.config.schedule_tick_ms / 1000
        while True:
            wanted, self.reputter.cold = sorted(self.reputter.cold), set()
            try:
                for record_offset, units in wanted:
                    await self.store.fetch_cold_need(record_offset, units)
            except ObjectStoreError as e:  # the object store is away: they wait, nothing is lost
                log.warning("schedule: held messages in the tier cannot be read now: %s", e)
            await asyncio.sleep(interval)

    # --- checkpoints -----------------------------------------------------------------------------
    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any], int]:
        """(delayOffset.json, timerCheckpoint.json, CommitLog offset that must be durable first),
        taken at one moment on the loop."""
        assert self.store is not None
        assert self.levels is not None
        assert self.timers is not None
        end = self.store.max_phy_offset()
        already = self.reputter.already if self.reputter is not None else {}
        delay_doc: dict[str, Any] = {
            "offsetTable": self.levels.snapshot(),
            "scanFrom": end,
            "reputBefore": sorted(src for src, kind in already.items() if kind == "delay"),
        }
        timer_doc: dict[str, Any] = dict(self.timers.snapshot())
        timer_doc["reputBefore"] = sorted(src for src, kind in already.items() if kind == "timer")
        return delay_doc, timer_doc, end

    async def persist(self, *, wait_durable: bool = True) -> bool:
        """Save a checkpoint of now; False when skipped (unchanged, or the log not durable)."""
        delay_doc, timer_doc, durable_needed = self.snapshot()
        if self._saved == (delay_doc, timer_doc):
            return False
        saved = await asyncio.to_thread(self._save, delay_doc, timer_doc, durable_needed if wait_durable else -1)
        if saved:
            self._saved = (delay_doc, timer_doc)
            assert self.timers is not None
            self.timers.timer_log.delete_segments(int(timer_doc["deliveredSecond"]))
        return saved

    def save_delay_progress(self, delay_doc: dict[str, Any]) -> None:
        """A slave keeps its master's delay-level progress (replication.py), so that a
        promotion starts the levels where the master left them; ignored while running. Saved
        behind, on a worker thread (the event loop does no fsync)."""
        if self.levels is None and delay_doc != self._master_delay:
            self._master_delay = dict(delay_doc)
            self._master_delay_behind.changed()

    def _save(self, delay_doc: dict[str, Any], timer_doc: dict[str, Any], durable_needed: int) -> bool:
        """On a worker thread: never record progress whose re-puts could still be lost."""
        assert self.store is not None
        assert self.timers is not None
        if durable_needed >= 0 and not _make_durable(self.store, durable_needed):
            log.warning("schedule checkpoint skipped: the CommitLog is not durable up to %d yet", durable_needed)
            return False
        self.timers.timer_log.flush()
        self._delay_file.save(delay_doc)
        self._timer_file.save(timer_doc)
        return True

    async def _checkpoint_loop(self) -> None:
        interval = self.config.schedule_checkpoint_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.persist()
            except OSError:
                log.exception("saving the schedule checkpoint failed")

    # --- figures ---------------------------------------------------------------------------------
    def runtime_info(self) -> dict[str, int]:
        if self.levels is None or self.timers is None or self.reputter is None:
            return {}
        return {
            "scheduleDelayPending": self.levels.pending(),
            "timerPending": self.timers.pending(),
            "timerCursorSecond": self.timers.cursor_s,
            "scheduleReputs": self.reputter.reputs,
            "scheduleDuplicatesSkipped": self.reputter.duplicates_skipped,
            "scheduleDropped": self.reputter.dropped,
            "timerRolled": self.timers.rolled,
            "timerLost": self.timers.lost,
        }


def _move(m: Message, topic: str, queue_id: int) -> None:
    m.properties[PROPERTY_REAL_TOPIC] = m.topic
    m.properties[PROPERTY_REAL_QUEUE_ID] = str(m.queue_id)
    m.topic = topic
    m.queue_id = queue_id


def _make_durable(store: MessageStore, offset: int) -> bool:
    """On a worker thread: fdatasync the CommitLog files holding bytes below ``offset`` that are
    not yet flushed (``MappedFile.flush`` is safe beside the store's own flush threads, which
    pick up the new flushed positions). True when every byte below ``offset`` is on disk."""
    mfq = store.commit_log.mfq
    if not store.running:
        return False
    try:
        for mf in list(mfq.files):
            start = mf.file_from_offset
            if start >= offset or start + mf.file_size <= mfq.flushed_where:
                continue
            if start + mf.flush(0) < min(offset, start + mf.file_size):
                return False
    except (OSError, ValueError):
        log.exception("flushing the CommitLog for the schedule checkpoint failed")
        return False
    return True
