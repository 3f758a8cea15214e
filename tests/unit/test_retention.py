"""Retention: files past retention go, the ConsumeQueues and IndexFiles follow; under disk
pressure only files past retention go, at the write watermark puts are refused, and only past
the emergency watermark do files inside retention go — counted per topic (retention.py,
MessageStore.clean_once).

The store's clock is the fixture's ManualClock: every put advances it, so each message has its
own store time and each file's age is known. The disk-usage reading is the constructor's
injectable ``disk_usage_ratio`` callable (or the ``disk_usage_override_file`` setting): it
stands in for the operating system's statvfs figure."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.idle_queues import IdleQueues
from data_plane.store.message import decode_record
from data_plane.store.retention import ForcedDeletion, disk_usage_ratio, newest_store_time_ms
from tests.conftest import ManualClock, small_config

FILE_SIZE = 64 * 1024  # small_config's CommitLog file size
CQ_UNITS_PER_FILE = 64  # small_config's ConsumeQueue file size, in units
HOUR_S = 3600.0
HOUR_MS = 3_600_000
STEP_MS = 60_000  # the clock moves a minute a put: ~1 h of store time a CommitLog file
TOPICS = ("acme%orders", "globex%events")


class Disk:
    """A disk-usage reading the test sets (the store's stand-in for statvfs)."""

    def __init__(self, ratio: float = 0.10) -> None:
        self.ratio = ratio
        self.readings = 0

    def __call__(self, _path: str) -> float:
        self.readings += 1
        return self.ratio


class DiskFilledByTheLog:
    """Usage that grows with the number of CommitLog files: ``base + per_file * files``."""

    def __init__(self, base: float, per_file: float) -> None:
        self.base = base
        self.per_file = per_file

    def __call__(self, path: str) -> float:
        files = [n for n in os.listdir(os.path.join(path, "commitlog")) if n.isdigit()]
        return self.base + self.per_file * len(files)


@dataclass
class Put:
    topic: str
    queue_offset: int
    offset: int
    size: int
    key: str
    stored_ms: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@pytest.fixture
def open_store(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., MessageStore]]:
    """``open_store(disk, **config changes)``: a started store on the fixture's clock, reading its
    disk usage from ``disk`` (shut down after the test)."""
    made: list[MessageStore] = []

    def make(disk: Callable[[str], float] | None, **changes: object) -> MessageStore:
        store = MessageStore(small_config(str(tmp_path / "store"), **changes), clock_ms=clock, disk_usage_ratio=disk)
        store.start()
        made.append(store)
        return store

    yield make
    for store in made:
        store.shutdown()


def _fill(
    store: MessageStore, clock: ManualClock, files: int, *, topics: tuple[str, ...] = ("T",), step_ms: int = STEP_MS
) -> list[Put]:
    """Put ~1 KiB messages (one key each, the topics in turn), the clock ``step_ms`` further at
    each, until the log spans ``files`` files."""
    puts: list[Put] = []
    while len(store.commit_log.mfq.files) < files:
        i = len(puts)
        topic = topics[i % len(topics)]
        key = f"key-{i}"
        clock.advance(step_ms)
        msg = Message(topic, b"%05d" % i + b"r" * 995, 0, properties={"KEYS": key})
        result = store.put_messages_blocking([msg])
        assert result.status is PutMessageStatus.PUT_OK, result
        a = result.append
        assert a is not None
        puts.append(Put(topic, a.queue_offset, a.wrote_offset, a.wrote_bytes, key, clock.now_ms))
    store.commit_log.mfq.flush_all()  # nothing written to the old files from now on
    return puts


def _log_files(store: MessageStore) -> list[str]:
    return sorted(n for n in os.listdir(store.config.commit_log_path) if n.isdigit())


def _first_stored_ms(puts: list[Put], file_index: int) -> int:
    """Store time of the first message of the ``file_index``-th CommitLog file."""
    return next(p.stored_ms for p in puts if p.offset >= file_index * FILE_SIZE)


def _when_past(store: MessageStore, puts: list[Put], files: int) -> float:
    """The first instant (seconds) at which the first ``files`` files are past retention: the
    newest message of file ``files - 1`` is bounded by the first one of file ``files``."""
    return (_first_stored_ms(puts, files) + store.retention_hours * HOUR_MS + 1) / 1000


def _readable(store: MessageStore, puts: list[Put]) -> list[Put]:
    """The puts whose message still reads back by queue offset."""
    out = []
    for p in puts:
        r = store.get_message(p.topic, 0, p.queue_offset, 1)
        if r.status is GetMessageStatus.FOUND:
            assert decode_record(r.messages[0]).commit_log_offset == p.offset
            r.messages[0].release()
            out.append(p)
    return out


# --- by age -----------------------------------------------------------------------------------


def test_a_file_goes_once_the_first_message_after_it_is_past_the_retention(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=3.0)
    puts = _fill(store, clock, 5)
    names = _log_files(store)
    assert len(names) == 5
    # At the very instant file 1's newest possible message (file 2's first) turns 3 h old, it is
    # still inside retention; one millisecond later files 0 and 1 go.
    boundary_s = (_first_stored_ms(puts, 2) + 3 * HOUR_MS) / 1000
    assert store.clean_once(now_s=boundary_s).commit_log_files_deleted == 1
    assert _log_files(store) == names[1:]
    report = store.clean_once(now_s=_when_past(store, puts, 2))
    assert report.commit_log_files_deleted == 1
    assert report.forced == []
    assert _log_files(store) == names[2:]
    assert store.min_phy_offset() == 2 * FILE_SIZE
    # Files inside retention stay.
    assert store.clean_once(now_s=_when_past(store, puts, 2)).commit_log_files_deleted == 0
    assert _log_files(store) == names[2:]


def test_the_store_time_decides_not_the_files_modification_time(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=3.0)
    puts = _fill(store, clock, 4)
    names = _log_files(store)
    then = time.time() - 1000 * HOUR_S  # files that look ancient on disk ...
    for name in names:
        os.utime(os.path.join(store.config.commit_log_path, name), (then, then))
    # ... but whose messages are young stay.
    assert store.clean_once(now_s=clock.now_ms / 1000).commit_log_files_deleted == 0
    assert _log_files(store) == names
    assert len(_readable(store, puts)) == len(puts)


def test_the_newest_store_time_of_a_file_is_the_first_of_the_next_and_unknown_for_the_last(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10))
    puts = _fill(store, clock, 3)
    cl = store.commit_log
    for i in range(2):
        newest = newest_store_time_ms(cl, i)
        assert newest == _first_stored_ms(puts, i + 1)
        assert max(p.stored_ms for p in puts if i * FILE_SIZE <= p.offset < (i + 1) * FILE_SIZE) <= newest
    assert newest_store_time_ms(cl, 2) is None


def test_the_file_being_written_is_never_deleted_however_old(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=1.0)
    puts = _fill(store, clock, 4)
    names = _log_files(store)
    max_phy = store.max_phy_offset()
    report = store.clean_once(now_s=clock.now_ms / 1000 + 1000 * HOUR_S)
    assert report.commit_log_files_deleted == 3
    assert _log_files(store) == names[-1:]
    assert store.max_phy_offset() == max_phy
    # Writes go on in the same file, at the next queue offset.
    result = store.put_messages_blocking([Message("T", b"still writing")])
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    assert result.append.queue_offset == len(puts)
    assert result.append.wrote_offset == max_phy
    r = store.get_message("T", 0, len(puts), 1)
    assert r.status is GetMessageStatus.FOUND
    assert decode_record(r.messages[0]).body == b"still writing"
    r.messages[0].release()
    assert store.clean_once(now_s=clock.now_ms / 1000 + 2000 * HOUR_S).commit_log_files_deleted == 0


def test_files_past_retention_go_a_batch_a_round_below_the_pressure_watermark(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.74), file_reserved_time_hours=1.0, delete_files_batch_max=2)
    _fill(store, clock, 6)
    far = clock.now_ms / 1000 + 100 * HOUR_S
    assert [store.clean_once(now_s=far).commit_log_files_deleted for _ in range(4)] == [2, 2, 1, 0]


def test_the_broker_set_retention_keeps_files_longer_than_the_store_default(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=1.0)
    puts = _fill(store, clock, 4)
    store.retention_hours = 48.0  # the longest retention a hosted topic was promised
    assert store.clean_once(now_s=clock.now_ms / 1000 + 24 * HOUR_S).commit_log_files_deleted == 0
    assert store.clean_once(now_s=_when_past(store, puts, 3)).commit_log_files_deleted == 3


@pytest.mark.parametrize("idle", [False, True])
def test_consume_queue_min_offsets_move_forward_and_reads_below_them_answer_offset_too_small(
    open_store: Callable[..., MessageStore], clock: ManualClock, idle: bool
) -> None:
    """Also for a queue closed to idle (idle_queues.py): its min offset moves and its files go."""
    store = open_store(Disk(0.10), file_reserved_time_hours=1.0)
    puts = _fill(store, clock, 5)
    if idle:
        sweep = IdleQueues(store, 1.0)
        asyncio.run(sweep.sweep())
        clock.advance(1001)
        assert asyncio.run(sweep.sweep()) == 1
    cq_dir = os.path.join(store.config.consume_queue_path, "T", "0")
    cq_files_before = sorted(os.listdir(cq_dir))
    assert len(cq_files_before) >= 3
    report = store.clean_once(now_s=_when_past(store, puts, 3))
    assert report.commit_log_files_deleted == 3
    log_min = store.min_phy_offset()
    assert log_min == 3 * FILE_SIZE

    new_min = next(p.queue_offset for p in puts if p.offset >= log_min)
    assert store.min_offset_in_queue("T", 0) == new_min
    assert store.max_offset_in_queue("T", 0) == len(puts)
    for offset in (0, 1, new_min - 1):
        r = store.get_message("T", 0, offset, 32)
        assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert r.next_begin_offset == new_min
        assert r.min_offset == new_min
    r = store.get_message("T", 0, new_min, 32)
    assert r.status is GetMessageStatus.FOUND
    first = decode_record(r.messages[0])
    assert first.commit_log_offset == puts[new_min].offset >= log_min
    for m in r.messages:
        m.release()

    # ConsumeQueue files whose every unit points below the new log start are gone, the rest stay.
    full_files = len(puts) // CQ_UNITS_PER_FILE  # files before the one being written
    expected_gone = sum(
        1 for k in range(full_files) if puts[k * CQ_UNITS_PER_FILE + CQ_UNITS_PER_FILE - 1].end <= log_min
    )
    assert expected_gone >= 1
    assert report.consume_queue_files_deleted == expected_gone
    assert sorted(os.listdir(cq_dir)) == cq_files_before[expected_gone:]


def test_index_files_whose_entries_all_point_below_the_new_log_start_are_deleted(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=1.0, index_max_entries=64)  # 63 keys a file
    puts = _fill(store, clock, 5)
    index_dir = store.config.index_path
    index_before = sorted(os.listdir(index_dir))
    per_file = 63
    assert len(index_before) == -(-len(puts) // per_file)
    report = store.clean_once(now_s=_when_past(store, puts, 3))
    log_min = store.min_phy_offset()
    assert log_min == 3 * FILE_SIZE
    # File k indexes messages 63k .. 63k+62; it goes when its newest entry is below log_min.
    expected_gone = 0
    for k in range(len(index_before) - 1):
        if puts[k * per_file + per_file - 1].offset < log_min:
            expected_gone += 1
        else:
            break
    assert expected_gone >= 1
    assert report.index_files_deleted == expected_gone
    assert sorted(os.listdir(index_dir)) == index_before[expected_gone:]
    for p in puts:
        found = store.query_message("T", p.key)
        assert [m.commit_log_offset for m in found] == ([p.offset] if p.offset >= log_min else [])


# --- disk pressure: only files past retention go ------------------------------------------------


@pytest.mark.parametrize("usage", [0.75, 0.80, 0.85, 0.89])
def test_under_pressure_files_inside_retention_stay_and_writes_go_on(
    open_store: Callable[..., MessageStore], clock: ManualClock, usage: float
) -> None:
    store = open_store(Disk(usage), delete_files_batch_max=1)  # 72 h retention: nothing is old
    puts = _fill(store, clock, 6, topics=TOPICS)
    names = _log_files(store)
    for _ in range(3):
        report = store.clean_once(now_s=clock.now_ms / 1000)
        assert report.commit_log_files_deleted == 0
        assert not report.disk_full
    assert _log_files(store) == names
    assert len(_readable(store, puts)) == len(puts)
    result = store.put_messages_blocking([Message("T", b"below the write watermark")])
    assert result.status is PutMessageStatus.PUT_OK


def test_under_pressure_every_file_past_retention_goes_in_one_round(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.80), file_reserved_time_hours=2.0, delete_files_batch_max=1)
    puts = _fill(store, clock, 7)
    names = _log_files(store)
    report = store.clean_once(now_s=_when_past(store, puts, 4))
    assert report.commit_log_files_deleted == 4  # not one: the batch limit is lifted
    assert report.forced == []
    assert _log_files(store) == names[4:]
    assert {p.key for p in _readable(store, puts)} == {p.key for p in puts if p.offset >= 4 * FILE_SIZE}


@pytest.mark.parametrize("usage", [0.90, 0.93, 0.949])
def test_at_the_write_watermark_puts_answer_disk_full_and_nothing_inside_retention_goes(
    open_store: Callable[..., MessageStore], clock: ManualClock, usage: float
) -> None:
    disk = Disk(0.10)
    store = open_store(disk)
    puts = _fill(store, clock, 4)
    names = _log_files(store)
    disk.ratio = usage
    report = store.clean_once(now_s=clock.now_ms / 1000)
    assert report.disk_full
    assert report.commit_log_files_deleted == 0
    assert _log_files(store) == names
    max_phy = store.max_phy_offset()
    refused = store.put_messages_blocking([Message("T", b"no room")])
    assert refused.status is PutMessageStatus.DISK_FULL
    assert refused.append is None
    assert "disk is full" in refused.reason
    assert f"{usage:.1%}" in refused.reason
    assert "disk_space_warning_level_ratio" in refused.reason
    assert store.max_phy_offset() == max_phy
    assert store.max_offset_in_queue("T", 0) == len(puts)
    # Reads go on while writes are refused, and every message is still there.
    assert len(_readable(store, puts)) == len(puts)

    disk.ratio = 0.50
    report = store.clean_once(now_s=clock.now_ms / 1000)
    assert not report.disk_full
    result = store.put_messages_blocking([Message("T", b"room again")])
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    assert result.append.queue_offset == len(puts)
    r = store.get_message("T", 0, len(puts), 1)
    assert r.status is GetMessageStatus.FOUND
    assert decode_record(r.messages[0]).body == b"room again"
    r.messages[0].release()


def test_below_the_emergency_watermark_no_message_inside_retention_is_ever_deleted(
    open_store: Callable[..., MessageStore], clock: ManualClock, seed: int
) -> None:
    """Random disk readings under 95 %, random retentions, random ages: whatever goes is past
    retention; everything inside it reads back."""
    rng = random.Random(seed)
    hours = rng.choice([1.0, 2.0, 5.0])
    store = open_store(Disk(), file_reserved_time_hours=hours, delete_files_batch_max=rng.randint(1, 4))
    puts = _fill(store, clock, rng.randint(3, 8), topics=TOPICS)
    now_s = clock.now_ms / 1000
    for _ in range(12):
        store._disk_usage_ratio = Disk(rng.uniform(0.0, 0.9499))
        now_s += rng.uniform(0, 2) * HOUR_S
        report = store.clean_once(now_s=now_s)
        assert report.forced == []
        kept = {p.key for p in _readable(store, puts)}
        cutoff_ms = now_s * 1000 - hours * HOUR_MS
        for p in puts:
            if p.stored_ms >= cutoff_ms:
                assert p.key in kept, f"message {p.key} stored {p.stored_ms} is inside retention and is gone"


# --- the emergency watermark -------------------------------------------------------------------


def test_past_the_emergency_watermark_the_oldest_files_go_until_use_is_below_it_counted_per_topic(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    # 7 files: 97.5 %; each file deleted frees 1 %: 96.5, 95.5, then 94.5 % < 95 % after three.
    store = open_store(DiskFilledByTheLog(base=0.905, per_file=0.01), delete_files_batch_max=1)
    told: list[ForcedDeletion] = []
    store.on_forced_deletion = told.append
    puts = _fill(store, clock, 7, topics=TOPICS)
    names = _log_files(store)
    report = store.clean_once(now_s=clock.now_ms / 1000)
    assert report.commit_log_files_deleted == 3
    assert _log_files(store) == names[3:]
    assert report.disk_usage_ratio < 0.95
    assert report.disk_full  # 94 % is still past the write watermark
    assert [f.file_name for f in report.forced] == names[:3]
    assert told == report.forced
    for i, f in enumerate(report.forced):
        in_file = [p for p in puts if i * FILE_SIZE <= p.offset < (i + 1) * FILE_SIZE]
        assert f.from_offset == i * FILE_SIZE
        assert f.messages_in_retention == {t: sum(p.topic == t for p in in_file) for t in TOPICS}
        assert f.newest_store_time_ms == _first_stored_ms(puts, i + 1)
        assert f.disk_usage_ratio == pytest.approx(0.975 - 0.01 * i)
    assert sum(f.messages for f in report.forced) == sum(p.offset < 3 * FILE_SIZE for p in puts)
    # The rest reads back; each queue now starts at its first surviving message.
    assert {p.key for p in _readable(store, puts)} == {p.key for p in puts if p.offset >= 3 * FILE_SIZE}
    for t in TOPICS:
        first = next(p for p in puts if p.topic == t and p.offset >= 3 * FILE_SIZE)
        assert store.min_offset_in_queue(t, 0) == first.queue_offset


def test_past_the_emergency_watermark_files_past_retention_go_first_and_are_not_counted(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.97), file_reserved_time_hours=2.0)
    puts = _fill(store, clock, 6, topics=TOPICS)
    report = store.clean_once(now_s=_when_past(store, puts, 2))
    assert report.commit_log_files_deleted == 5  # the reading stays at 97 %: all but the last file
    assert [f.from_offset for f in report.forced] == [2 * FILE_SIZE, 3 * FILE_SIZE, 4 * FILE_SIZE]


def test_the_count_uses_each_topics_own_retention(open_store: Callable[..., MessageStore], clock: ManualClock) -> None:
    store = open_store(DiskFilledByTheLog(base=0.945, per_file=0.002))  # 3 files: 95.1 %; one goes
    puts = _fill(store, clock, 3, topics=TOPICS)
    store.retention_hours = 72.0
    store.topic_retention_hours = {"acme%orders": 72.0, "globex%events": 0.5}
    report = store.clean_once(now_s=clock.now_ms / 1000)
    assert len(report.forced) == 1
    now_ms = clock.now_ms
    in_file = [p for p in puts if p.offset < FILE_SIZE]
    young_globex = sum(p.topic == "globex%events" and p.stored_ms >= now_ms - HOUR_MS // 2 for p in in_file)
    assert young_globex == 0  # the file is ~1 h older than now: its globex messages are past their 30 min
    assert report.forced[0].messages_in_retention == {"acme%orders": sum(p.topic == "acme%orders" for p in in_file)}


def test_a_failing_hook_does_not_stop_the_round(open_store: Callable[..., MessageStore], clock: ManualClock) -> None:
    store = open_store(Disk(0.99))
    calls: list[str] = []

    def hook(f: ForcedDeletion) -> None:
        calls.append(f.file_name)
        raise RuntimeError("boom")

    store.on_forced_deletion = hook
    _fill(store, clock, 3)
    report = store.clean_once(now_s=clock.now_ms / 1000)
    assert report.commit_log_files_deleted == 2
    assert len(calls) == 2


@pytest.mark.asyncio
async def test_an_awaited_put_on_a_full_disk_answers_disk_full_with_a_reason(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.95))
    store.clean_once()
    result = await store.put_message(Message("T", b"no room"))
    assert result.status is PutMessageStatus.DISK_FULL
    assert result.reason.strip()
    assert store.max_phy_offset() == 0


# --- the probe -----------------------------------------------------------------------------------


def test_disk_usage_override_file_drives_the_reading_and_falls_back_when_unreadable(
    open_store: Callable[..., MessageStore], tmp_path: Path, clock: ManualClock
) -> None:
    override = tmp_path / "disk-usage"
    override.write_text("0.93\n")
    store = open_store(None, disk_usage_override_file=str(override))
    assert store.clean_once().disk_full
    override.write_text("0.2")
    report = store.clean_once()
    assert report.disk_usage_ratio == pytest.approx(0.2)
    assert not report.disk_full
    override.write_text("not a number")
    report = store.clean_once()  # the filesystem's own figure
    assert report.disk_usage_ratio == pytest.approx(disk_usage_ratio(store.config.store_path), abs=0.01)


# --- the periodic task ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_run_maintenance_cleans_on_its_interval_until_cancelled(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=1.0, clean_resource_interval_ms=20)
    puts = _fill(store, clock, 4)
    names = _log_files(store)
    clock.now_ms = int(_when_past(store, puts, 2) * 1000)  # run_maintenance reads the store's clock
    task = asyncio.create_task(store.run_maintenance())
    try:
        deadline = time.monotonic() + 5
        while _log_files(store) != names[2:]:
            assert time.monotonic() < deadline, f"maintenance did not delete the old files: {_log_files(store)}"
            await asyncio.sleep(0.01)
        assert store.min_phy_offset() == 2 * FILE_SIZE
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
