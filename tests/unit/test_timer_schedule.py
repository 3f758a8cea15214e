"""Schedule on a real MessageStore with a manual clock: the send path's redirect, delay levels,
timed messages (never early, rolls), restarts, and a crash between re-puts and the checkpoint
(schedule.py, delay_level.py, timer_wheel.py, reput.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.broker.config import BrokerConfig, ConfigError, load
from data_plane.broker.delay_level import SCHEDULE_TOPIC, parse_delay_levels
from data_plane.broker.reput import PROPERTY_REPUT_FROM
from data_plane.broker.schedule import Schedule
from data_plane.broker.timer_wheel import TIMER_TOPIC, due_second
from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.message import TRANSACTION_PREPARED_TYPE, StoredMessage, decode_record
from tests.conftest import ManualClock, small_config

T0 = 1_700_000_000_000  # ManualClock's start: a whole second


def _config(tmp_path: Path, **changes: object) -> BrokerConfig:
    values: dict[str, object] = {
        "store_dir": str(tmp_path),
        "message_delay_level": "1s 2s 5s",
        "schedule_tick_ms": 600_000,  # ticks are driven by the test
        "schedule_checkpoint_interval_ms": 600_000,
        "timer_log_segment_units": 8,
    }
    values.update(changes)
    return BrokerConfig(**values)  # type: ignore[arg-type]


class Rig:
    """A store and a Schedule over one directory, restartable like a broker."""

    def __init__(self, tmp_path: Path, clock: ManualClock, **changes: object) -> None:
        self.tmp_path = tmp_path
        self.clock = clock
        self.changes = changes
        self.notified: list[tuple[str, int, int, int]] = []
        self.store = self._store()
        self.schedule = Schedule(_config(tmp_path, **changes), clock_ms=clock)

    def _store(self) -> MessageStore:
        s = MessageStore(
            small_config(str(self.tmp_path / "store"), commit_log_file_size_bytes=1 << 20), clock_ms=self.clock
        )
        s.start()
        return s

    async def start(self) -> None:
        await self.schedule.start(self.store, lambda *a: self.notified.append(a))

    def send(self, topic: str, body: bytes, queue_id: int = 0, **props: str) -> str | None:
        msgs = [Message(topic, body, queue_id, properties=dict(props))]
        why = self.schedule.redirect(msgs)
        if why is None:
            result, _ = self.store.append(msgs)
            assert result.status is PutMessageStatus.PUT_OK
        return why

    def queue(self, topic: str, queue_id: int = 0) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        offset = 0
        while True:
            r = self.store.get_message(topic, queue_id, offset, 64)
            if r.status is not GetMessageStatus.FOUND:
                return out
            out.extend(decode_record(m) for m in r.messages)
            offset = r.next_begin_offset

    def bodies(self, topic: str, queue_id: int = 0) -> list[bytes]:
        return [m.body for m in self.queue(topic, queue_id)]

    def at(self, ms: int) -> int:
        self.clock.now_ms = T0 + ms
        return self.schedule.tick()

    async def restart(self, *, crash: bool = False) -> None:
        if crash:  # no last checkpoint: the files stay as the last periodic save left them
            for t in self.schedule._tasks:
                t.cancel()
            assert self.schedule.timers is not None
            self.schedule.timers.close()
        else:
            await self.schedule.stop()
        self.store.shutdown()
        self.store = self._store()
        self.schedule = Schedule(_config(self.tmp_path, **self.changes), clock_ms=self.clock)
        await self.start()

    async def close(self) -> None:
        await self.schedule.stop()
        self.store.shutdown()


@pytest.fixture
def rig(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(**changes: object) -> Rig:
        r = Rig(tmp_path, clock, **changes)
        made.append(r)
        return r

    yield make
    for r in made:
        if r.store.running:
            r.store.shutdown()


# --- settings and redirect ----------------------------------------------------------------------------
def test_delay_levels_parse_rocketmqs_format() -> None:
    assert parse_delay_levels("1s 5s 1m 2h 1d") == (1000, 5000, 60_000, 7_200_000, 86_400_000)
    assert len(parse_delay_levels(BrokerConfig().message_delay_level)) == 18
    for bad in ("", "1x", "s", "1.5s"):
        with pytest.raises(ValueError):  # noqa: PT011
            parse_delay_levels(bad)
    with pytest.raises(ConfigError, match="message_delay_level"):
        load(None, {"message_delay_level": "1s 2q"})


@pytest.mark.asyncio
async def test_redirect_moves_delayed_and_timed_messages_and_refuses_bad_ones(rig: Callable[..., Rig]) -> None:
    r = rig()
    s = r.schedule
    m = Message("T", b"x", 2, properties={"DELAY": "2", PROPERTY_REPUT_FROM: "7"})
    assert s.redirect([m]) is None
    assert (m.topic, m.queue_id) == (SCHEDULE_TOPIC, 1)
    assert m.properties == {"DELAY": "2", "REAL_TOPIC": "T", "REAL_QID": "2"}  # a client's marker is dropped
    m = Message("%RETRY%g", b"x", 0, properties={"DELAY": "99"})
    assert s.redirect([m]) is None
    assert (m.topic, m.queue_id, m.properties["DELAY"]) == (SCHEDULE_TOPIC, 2, "3")  # clamped to the last level
    for props in ({"DELAY": "0"}, {"DELAY": "-1"}, {"TIMER_DELIVER_MS": str(T0 - 1)}, {}):
        m = Message("T", b"x", 1, properties=dict(props))
        assert s.redirect([m]) is None
        assert m.topic == "T"
    m = Message("T", b"x", 1, properties={"TIMER_DELIVER_MS": str(T0 - 1), "DELAY": "1"})
    assert s.redirect([m]) is None
    assert m.topic == SCHEDULE_TOPIC  # a stale timer property does not hide a delay level
    m = Message("tenant%T", b"x", 3, properties={"TIMER_DELIVER_MS": str(T0 + 1500), "DELAY": "1"})
    assert s.redirect([m]) is None
    assert (m.topic, m.queue_id) == (TIMER_TOPIC, 0)
    assert m.properties["TIMER_OUT_MS"] == str(T0 + 1500)
    assert "DELAY" not in m.properties
    assert (m.properties["REAL_TOPIC"], m.properties["REAL_QID"]) == ("tenant%T", "3")
    for name, value, due in (
        ("TIMER_DELAY_SEC", "10", T0 + 10_000),
        ("TIMER_DELAY_MS", "2500", T0 + 2500),
        ("__STARTDELIVERTIME", str(T0 + 4000), T0 + 4000),
    ):
        m = Message("T", b"x", properties={name: value})
        assert s.redirect([m]) is None
        assert m.properties["TIMER_OUT_MS"] == str(due)
    week = 7 * 86_400_000
    assert s.redirect([Message("T", b"x", properties={"TIMER_DELIVER_MS": str(T0 + week)})]) is None
    why = s.redirect([Message("T", b"x", properties={"TIMER_DELIVER_MS": str(T0 + week + 1000)})])
    assert why is not None and "timer_max_delay_s" in why  # noqa: PT018
    assert "not a whole number" in (s.redirect([Message("T", b"x", properties={"DELAY": "one"})]) or "")
    assert "not a whole number" in (s.redirect([Message("T", b"x", properties={"TIMER_DELAY_SEC": "1.5"})]) or "")
    batch = [Message("T", b"a"), Message("T", b"b", properties={"DELAY": "1"})]
    assert "batch" in (s.redirect(batch) or "")
    assert s.redirect([Message("T", b"a"), Message("T", b"b")]) is None
    marked = Message("T", b"b", properties={PROPERTY_REPUT_FROM: "9", "k": "v"})
    assert s.redirect([Message("T", b"a"), marked]) is None
    assert marked.properties == {"k": "v"}  # a client's marker is dropped from a batch's message too
    assert "system topic" in (s.redirect([Message("T", b"a"), Message(TIMER_TOPIC, b"b")]) or "")
    assert "system topic" in (s.redirect([Message(SCHEDULE_TOPIC, b"a")]) or "")
    assert "system topic" in (s.redirect([Message(TIMER_TOPIC, b"a")]) or "")
    half = Message("T", b"x", sys_flag=TRANSACTION_PREPARED_TYPE, properties={"DELAY": "1"})
    assert s.redirect([half]) is None
    assert half.topic == "T"  # a transaction half is redirected when committed, not now


def test_due_second_never_rounds_down() -> None:
    assert due_second(T0) == T0 // 1000
    assert due_second(T0 + 1) == T0 // 1000 + 1
    assert due_second(T0 + 999) == T0 // 1000 + 1


# --- delay levels ---------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_delay_levels_hold_each_message_for_its_level(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    r.send("T", b"a1", 1, DELAY="1", TAGS="x")
    r.send("T", b"c5", 0, DELAY="3")
    r.send("%RETRY%g", b"b2", 0, DELAY="2")
    r.at(500)
    r.send("T", b"a1-late", 1, DELAY="1")
    assert r.at(999) == 0
    assert r.bodies("T", 1) == []
    r.at(1000)
    assert r.bodies("T", 1) == [b"a1"]
    r.at(1499)
    assert r.bodies("T", 1) == [b"a1"]
    r.at(1500)
    assert r.bodies("T", 1) == [b"a1", b"a1-late"]
    r.at(2000)
    assert r.bodies("%RETRY%g") == [b"b2"]
    r.at(4999)
    assert r.bodies("T", 0) == []
    r.at(5000)
    got = r.queue("T", 0)
    assert [m.body for m in got] == [b"c5"]
    assert "DELAY" not in got[0].properties
    assert got[0].properties["REAL_TOPIC"] == "T"  # kept, as RocketMQ does
    assert r.notified[0][:3] == ("T", 1, 1)  # held pulls of T/1 were told of offset 0
    assert r.schedule.levels is not None
    assert r.schedule.levels.pending() == 0
    await r.close()


@pytest.mark.asyncio
async def test_delay_levels_survive_a_restart_and_late_ones_go_at_once(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for i in range(5):
        r.send("T", f"m{i}".encode(), 0, DELAY="3")
    await r.restart()
    assert r.bodies("T") == []
    r.at(60_000)  # the broker was down past the messages' time
    assert r.bodies("T") == [f"m{i}".encode() for i in range(5)]
    await r.close()


# --- timed messages -------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_timed_messages_are_never_early_and_at_most_a_second_late(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for due in (2500, 1000, 4000, 2000, 2999):
        assert r.send("T", str(due).encode(), 0, TIMER_DELIVER_MS=str(T0 + due)) is None
    r.send("T", b"sec", 0, TIMER_DELAY_SEC="3")
    seen: list[tuple[int, bytes]] = []
    for ms in range(0, 5000, 100):
        r.at(ms)
        got = r.bodies("T")
        for b in got[len(seen) :]:
            seen.append((ms, b))
    for at, body in seen:
        due = 3000 if body == b"sec" else int(body)
        assert due <= at <= due + 1000, (at, body)
    assert sorted(b for _, b in seen) == sorted([b"2500", b"1000", b"4000", b"2000", b"2999", b"sec"])
    stored = r.queue("T")
    assert all("TIMER_DELIVER_MS" not in m.properties and "TIMER_OUT_MS" in m.properties for m in stored)
    await r.close()


@pytest.mark.asyncio
async def test_a_tick_reads_only_the_due_slot(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for i in range(300):
        r.send("T", b"later", 0, TIMER_DELIVER_MS=str(T0 + 3_600_000 + i * 1000))
    r.send("T", b"soon", 0, TIMER_DELIVER_MS=str(T0 + 2000))
    r.at(100)  # enqueue everything
    timers = r.schedule.timers
    assert timers is not None
    reads = 0
    real_read = timers.timer_log.read

    def counting_read(index: int) -> object:
        nonlocal reads
        reads += 1
        return real_read(index)

    timers.timer_log.read = counting_read  # type: ignore[method-assign,assignment]
    r.at(2000)
    assert r.bodies("T") == [b"soon"]
    assert reads == 1
    assert timers.pending() == 300
    await r.close()


@pytest.mark.asyncio
async def test_far_timers_roll_through_the_window(rig: Callable[..., Rig]) -> None:
    r = rig(timer_roll_window_s=10)
    await r.start()
    r.at(0)
    r.send("T", b"far", 0, TIMER_DELIVER_MS=str(T0 + 25_000))
    for ms in range(0, 30_000, 500):
        r.at(ms)
        if ms < 25_000:
            assert r.bodies("T") == [], ms
    assert r.bodies("T") == [b"far"]
    assert r.schedule.timers is not None
    assert r.schedule.timers.rolled == 2  # stored again at 10 s and at 20 s
    assert len(r.queue(TIMER_TOPIC)) == 3
    await r.close()


@pytest.mark.asyncio
async def test_timers_survive_a_restart_and_overdue_ones_go_at_once(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for i in range(20):
        r.send("T", f"t{i}".encode(), 0, TIMER_DELIVER_MS=str(T0 + 1000 + 500 * i))
    r.at(3000)
    before = r.bodies("T")
    assert 0 < len(before) < 20
    await r.restart()
    r.at(3000)
    assert r.bodies("T") == before
    r.at(120_000)
    assert sorted(r.bodies("T")) == sorted(f"t{i}".encode() for i in range(20))
    await r.close()


@pytest.mark.asyncio
async def test_a_crash_after_reputs_and_before_the_checkpoint_duplicates_nothing(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for i in range(30):
        r.send("T", f"t{i}".encode(), 0, TIMER_DELIVER_MS=str(T0 + 1000 + 100 * i))
        r.send("D", f"d{i}".encode(), 0, DELAY="1" if i % 2 else "2")
    r.at(100)
    assert await r.schedule.persist(wait_durable=False)
    r.at(2000)  # re-puts after the checkpoint, then the crash
    for i in range(30, 40):  # and messages stored, enqueued and delivered after it too
        r.send("T", f"t{i}".encode(), 0, TIMER_DELIVER_MS=str(T0 + 2100))
    r.at(2100)
    r.at(2500)
    delivered_before = len(r.queue("T")) + len(r.queue("D"))
    assert delivered_before > 0
    await r.restart(crash=True)
    assert r.schedule.reputter is not None
    assert r.schedule.reputter.already  # the scan found the re-puts the checkpoint does not know
    r.at(2500)
    r.at(10_000)
    t = r.bodies("T")
    d = r.bodies("D")
    assert sorted(t) == sorted(f"t{i}".encode() for i in range(40))
    assert sorted(d) == sorted(f"d{i}".encode() for i in range(30))
    assert r.schedule.reputter.duplicates_skipped == delivered_before
    assert not r.schedule.reputter.already  # every re-put found was matched
    # A second crash before anything else is saved still finds the first one's re-puts.
    await r.restart(crash=True)
    r.at(20_000)
    assert len(r.bodies("T")) == 40
    assert len(r.bodies("D")) == 30
    await r.close()


@pytest.mark.asyncio
async def test_lost_checkpoint_files_rebuild_without_duplicates(rig: Callable[..., Rig], tmp_path: Path) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for i in range(10):
        r.send("T", f"t{i}".encode(), 0, TIMER_DELIVER_MS=str(T0 + 1000 * (i + 1)))
    r.at(5000)
    await r.schedule.stop()
    r.store.shutdown()
    for name in ("timerCheckpoint.json", "timerCheckpoint.json.bak"):
        (tmp_path / "config" / name).unlink(missing_ok=True)
    r.store = r._store()
    r.schedule = Schedule(_config(tmp_path), clock_ms=r.clock)
    await r.start()
    r.at(20_000)
    assert sorted(r.bodies("T")) == sorted(f"t{i}".encode() for i in range(10))
    await r.close()


@pytest.mark.asyncio
async def test_checkpoint_waits_until_the_reputs_are_durable(rig: Callable[..., Rig], tmp_path: Path) -> None:
    r = rig()
    await r.start()
    r.at(0)
    r.send("T", b"x", 0, DELAY="1")
    r.at(1000)
    assert await r.schedule.persist()
    saved = (tmp_path / "config" / "delayOffset.json").read_text()
    assert '"1": 1' in saved
    mf = r.store.commit_log.mfq.files[-1]
    assert mf.file_from_offset + mf.flushed_position >= r.store.max_phy_offset()  # fdatasync'd first
    info = r.schedule.runtime_info()
    assert info["scheduleReputs"] == 1
    await r.close()


@pytest.mark.asyncio
async def test_a_second_crash_before_the_first_ones_reputs_fire_again_still_skips_them(rig: Callable[..., Rig]) -> None:
    r = rig()
    await r.start()
    r.at(0)
    for i in range(10):
        r.send("T", f"t{i}".encode(), 0, TIMER_DELIVER_MS=str(T0 + 1000))
        r.send("D", f"d{i}".encode(), 0, DELAY="1")
    r.at(100)
    assert await r.schedule.persist(wait_durable=False)
    r.at(1000)
    assert len(r.bodies("T")) == len(r.bodies("D")) == 10
    await r.restart(crash=True)
    assert r.schedule.reputter is not None
    assert len(r.schedule.reputter.already) == 20
    # Checkpoint saved after the recovery, before anything fired again: it carries what was found.
    r.send("T", b"new", 0, TIMER_DELIVER_MS=str(T0 + 3000))
    assert await r.schedule.persist(wait_durable=False)
    await r.restart(crash=True)
    assert len(r.schedule.reputter.already) == 20
    r.at(5000)
    assert sorted(r.bodies("T")) == sorted([b"new", *(f"t{i}".encode() for i in range(10))])
    assert sorted(r.bodies("D")) == sorted(f"d{i}".encode() for i in range(10))
    assert not r.schedule.reputter.already
    await r.close()
