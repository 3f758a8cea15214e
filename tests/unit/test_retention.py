"""Retention: old CommitLog files go, the ConsumeQueues and IndexFiles follow, and the disk
watermarks force deletion and refuse writes (retention.py, MessageStore.clean_once).

The disk-usage reading is the constructor's injectable ``disk_usage_ratio`` callable: it stands
in for the operating system's statvfs figure."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.message import decode_record
from tests.conftest import ManualClock, small_config

FILE_SIZE = 64 * 1024  # small_config's CommitLog file size
CQ_UNITS_PER_FILE = 64  # small_config's ConsumeQueue file size, in units
HOUR_S = 3600.0


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
    queue_offset: int
    offset: int
    size: int
    key: str

    @property
    def end(self) -> int:
        return self.offset + self.size


@pytest.fixture
def open_store(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., MessageStore]]:
    """``open_store(disk, **config changes)``: a started store reading its disk usage from
    ``disk`` (shut down after the test)."""
    made: list[MessageStore] = []

    def make(disk: Callable[[str], float], **changes: object) -> MessageStore:
        store = MessageStore(small_config(str(tmp_path / "store"), **changes), clock_ms=clock, disk_usage_ratio=disk)
        store.start()
        made.append(store)
        return store

    yield make
    for store in made:
        store.shutdown()


def _fill(store: MessageStore, files: int, *, topic: str = "T", queue_id: int = 0) -> list[Put]:
    """Put ~1 KiB messages (one key each) until the log spans ``files`` files."""
    puts: list[Put] = []
    while len(store.commit_log.mfq.files) < files:
        i = len(puts)
        key = f"key-{i}"
        msg = Message(topic, b"%05d" % i + b"r" * 995, queue_id, properties={"KEYS": key})
        result = store.put_messages_blocking([msg])
        assert result.status is PutMessageStatus.PUT_OK, result
        a = result.append
        assert a is not None
        puts.append(Put(a.queue_offset, a.wrote_offset, a.wrote_bytes, key))
    store.commit_log.mfq.flush_all()  # nothing written to the old files from now on
    return puts


def _log_files(store: MessageStore) -> list[str]:
    return sorted(n for n in os.listdir(store.config.commit_log_path) if n.isdigit())


def _age(store: MessageStore, names: list[str], hours: float) -> None:
    """Set the files' last modification ``hours`` into the past."""
    then = time.time() - hours * HOUR_S
    for name in names:
        os.utime(os.path.join(store.config.commit_log_path, name), (then, then))


# --- by age -----------------------------------------------------------------------------------


def test_commit_log_files_older_than_the_reserved_time_are_deleted(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=0.01)  # 36 s
    _fill(store, 5)
    names = _log_files(store)
    assert len(names) == 5
    _age(store, names[:2], hours=1)
    report = store.clean_once(now_s=time.time())
    assert report.commit_log_files_deleted == 2
    assert _log_files(store) == names[2:]
    assert store.min_phy_offset() == 2 * FILE_SIZE
    # Files still inside the reserved time stay.
    assert store.clean_once(now_s=time.time()).commit_log_files_deleted == 0
    assert _log_files(store) == names[2:]


def test_the_file_being_written_is_never_deleted_however_old(open_store: Callable[..., MessageStore]) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=0.01)
    puts = _fill(store, 4)
    names = _log_files(store)
    max_phy = store.max_phy_offset()
    _age(store, names, hours=1000)
    report = store.clean_once(now_s=time.time())
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
    assert store.clean_once(now_s=time.time() + 1000 * HOUR_S).commit_log_files_deleted == 0


def test_consume_queue_min_offsets_move_forward_and_reads_below_them_answer_offset_too_small(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=0.01)
    puts = _fill(store, 5)
    cq_dir = os.path.join(store.config.consume_queue_path, "T", "0")
    cq_files_before = sorted(os.listdir(cq_dir))
    assert len(cq_files_before) >= 3
    _age(store, _log_files(store)[:3], hours=1)
    report = store.clean_once(now_s=time.time())
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
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=0.01, index_max_entries=64)  # 63 keys a file
    puts = _fill(store, 5)
    index_dir = store.config.index_path
    index_before = sorted(os.listdir(index_dir))
    per_file = 63
    assert len(index_before) == -(-len(puts) // per_file)
    _age(store, _log_files(store)[:3], hours=1)
    report = store.clean_once(now_s=time.time())
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


# --- disk watermarks --------------------------------------------------------------------------


def test_at_75_percent_the_oldest_files_go_whatever_their_age_a_batch_at_a_time(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.80), delete_files_batch_max=2)  # 72 h retention: nothing is old
    puts = _fill(store, 6)
    names = _log_files(store)
    deleted = [store.clean_once(now_s=time.time()).commit_log_files_deleted for _ in range(4)]
    assert deleted == [2, 2, 1, 0]
    assert _log_files(store) == names[-1:]
    assert not store.disk_full
    result = store.put_messages_blocking([Message("T", b"below the warning level")])
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    assert result.append.queue_offset == len(puts)


def test_below_75_percent_files_inside_the_reserved_time_are_kept(open_store: Callable[..., MessageStore]) -> None:
    disk = Disk(0.74)
    store = open_store(disk)
    _fill(store, 4)
    names = _log_files(store)
    report = store.clean_once(now_s=time.time())
    assert disk.readings >= 1
    assert report.commit_log_files_deleted == 0
    assert report.disk_usage_ratio == pytest.approx(0.74)
    assert _log_files(store) == names


def test_at_85_percent_deletion_goes_on_until_use_is_below_75_percent(
    open_store: Callable[..., MessageStore],
) -> None:
    # 6 files: 86 %; each file deleted frees 5 %: 81, 76, then 71 % < 75 % after three.
    store = open_store(DiskFilledByTheLog(base=0.56, per_file=0.05), delete_files_batch_max=1)
    puts = _fill(store, 6)
    names = _log_files(store)
    assert len(names) == 6
    report = store.clean_once(now_s=time.time())
    assert report.commit_log_files_deleted == 3
    assert _log_files(store) == names[3:]
    assert report.disk_usage_ratio < 0.75
    assert not report.disk_full
    new_min = next(p.queue_offset for p in puts if p.offset >= store.min_phy_offset())
    r = store.get_message("T", 0, 0, 32)
    assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
    assert r.next_begin_offset == new_min


def test_at_85_percent_deletion_stops_at_the_last_file_when_use_stays_high(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.87), delete_files_batch_max=1)
    puts = _fill(store, 5)
    names = _log_files(store)
    report = store.clean_once(now_s=time.time())
    assert report.commit_log_files_deleted == 4
    assert _log_files(store) == names[-1:]
    assert not report.disk_full  # 87 % is under the 90 % warning level: writes go on
    result = store.put_messages_blocking([Message("T", b"still below 90")])
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    assert result.append.queue_offset == len(puts)


def test_at_90_percent_puts_answer_disk_full_until_use_drops_and_clean_once_runs(
    open_store: Callable[..., MessageStore],
) -> None:
    disk = Disk(0.10)
    store = open_store(disk)
    puts = _fill(store, 2)
    disk.ratio = 0.93
    report = store.clean_once(now_s=time.time())
    assert report.disk_full
    max_phy = store.max_phy_offset()
    refused = store.put_messages_blocking([Message("T", b"no room")])
    assert refused.status is PutMessageStatus.DISK_FULL
    assert refused.append is None
    assert refused.reason.strip()
    assert " " in refused.reason
    assert store.max_phy_offset() == max_phy
    assert store.max_offset_in_queue("T", 0) == len(puts)
    # Reads go on while writes are refused.
    assert store.get_message("T", 0, len(puts) - 1, 1).status is GetMessageStatus.FOUND

    disk.ratio = 0.50
    report = store.clean_once(now_s=time.time())
    assert not report.disk_full
    result = store.put_messages_blocking([Message("T", b"room again")])
    assert result.status is PutMessageStatus.PUT_OK
    assert result.append is not None
    assert result.append.queue_offset == len(puts)
    r = store.get_message("T", 0, len(puts), 1)
    assert r.status is GetMessageStatus.FOUND
    assert decode_record(r.messages[0]).body == b"room again"
    r.messages[0].release()


@pytest.mark.asyncio
async def test_an_awaited_put_on_a_full_disk_answers_disk_full_with_a_reason(
    open_store: Callable[..., MessageStore],
) -> None:
    disk = Disk(0.95)
    store = open_store(disk)
    store.clean_once(now_s=time.time())
    result = await store.put_message(Message("T", b"no room"))
    assert result.status is PutMessageStatus.DISK_FULL
    assert result.reason.strip()
    assert store.max_phy_offset() == 0


# --- the periodic task ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_run_maintenance_cleans_on_its_interval_until_cancelled(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(Disk(0.10), file_reserved_time_hours=0.01, clean_resource_interval_ms=20)
    _fill(store, 4)
    names = _log_files(store)
    _age(store, names[:2], hours=1)
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
