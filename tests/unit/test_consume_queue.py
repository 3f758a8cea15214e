"""ConsumeQueue: the 20-byte-unit index of one (topic, queue id) into the CommitLog (consume_queue.py)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.store.consume_queue import CQ_UNIT_SIZE, ConsumeQueue
from data_plane.store.layouts import CQ_UNIT
from data_plane.store.mapped_file import offset_to_file_name

UNITS_PER_FILE = 4
FILE_SIZE = UNITS_PER_FILE * CQ_UNIT_SIZE
SIZE = 50  # record size used by most tests: unit n points at [100 n, 100 n + 50)

MakeCQ = Callable[..., ConsumeQueue]


@pytest.fixture
def make_cq(tmp_path: Path) -> Iterator[MakeCQ]:
    made: list[ConsumeQueue] = []

    def make(units_per_file: int = UNITS_PER_FILE, *, load: bool = False) -> ConsumeQueue:
        cq = ConsumeQueue(str(tmp_path / "consumequeue"), "TopicA", 3, units_per_file)
        if load:
            cq.load()
            cq.recover()
        made.append(cq)
        return cq

    yield make
    for cq in made:
        cq.close()


def _fill(cq: ConsumeQueue, count: int, start: int = 0) -> None:
    for qo in range(start, start + count):
        assert cq.put(100 * qo, SIZE, qo * 7 - 3, qo)


def test_a_unit_is_20_bytes_of_offset_size_and_tag_hash() -> None:
    assert CQ_UNIT_SIZE == 20
    assert CQ_UNIT.format == ">qiq"
    expect = (1).to_bytes(8, "big") + (2).to_bytes(4, "big") + (-3).to_bytes(8, "big", signed=True)
    assert CQ_UNIT.pack(1, 2, -3) == expect


def test_put_writes_the_unit_read_back_by_unit_and_units(make_cq: MakeCQ) -> None:
    cq = make_cq()
    assert cq.put(1234, 56, -99162322, 0)
    assert cq.put(1290, 70, 42, 1)
    assert cq.unit(0) == (1234, 56, -99162322)
    assert cq.unit(1) == (1290, 70, 42)
    assert cq.unit(2) is None
    found = cq.units(0, 10)
    assert found is not None
    view, count = found
    assert count == 2
    assert bytes(view) == CQ_UNIT.pack(1234, 56, -99162322) + CQ_UNIT.pack(1290, 70, 42)
    assert cq.min_offset_in_queue() == 0
    assert cq.max_offset_in_queue() == 2
    assert cq.max_physic_offset == 1290 + 70
    path = os.path.join(cq.mfq.directory, offset_to_file_name(0))
    assert cq.mfq.directory.endswith(os.path.join("TopicA", "3"))
    assert os.path.exists(path)


def test_units_returns_at_most_what_one_file_holds(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 10)
    found = cq.units(2, 100)
    assert found is not None
    assert found[1] == UNITS_PER_FILE - 2  # the rest of the first file
    found = cq.units(4, 3)
    assert found is not None
    assert found[1] == 3
    assert CQ_UNIT.unpack_from(found[0], 2 * CQ_UNIT_SIZE)[0] == 600
    assert cq.units(10, 5) is None


def test_put_of_a_unit_already_present_returns_false_and_changes_nothing(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 6)
    assert not cq.put(999_999, 1, 1, 2)
    assert not cq.put(999_999, 1, 1, 5)
    assert cq.unit(2) == (200, SIZE, 2 * 7 - 3)
    assert cq.unit(5) == (500, SIZE, 5 * 7 - 3)
    assert cq.max_offset_in_queue() == 6


def test_a_gap_is_filled_with_hole_units(make_cq: MakeCQ) -> None:
    cq = make_cq()
    assert cq.put(0, SIZE, 0, 0)
    assert cq.put(700, SIZE, 5, 7)  # 1..6 are lost: holes, across a file boundary
    assert cq.max_offset_in_queue() == 8
    for qo in range(1, 7):
        assert cq.unit(qo) == (-1, 0, 0)
    assert cq.unit(7) == (700, SIZE, 5)
    assert cq.put(800, SIZE, 6, 8)
    assert cq.unit(8) == (800, SIZE, 6)


def test_a_queue_whose_first_unit_is_not_zero_starts_there(make_cq: MakeCQ) -> None:
    cq = make_cq()
    assert cq.put(5000, SIZE, 1, 6)
    assert cq.min_offset_in_queue() == 6
    assert cq.max_offset_in_queue() == 7
    assert cq.unit(5) is None
    assert cq.unit(6) == (5000, SIZE, 1)
    assert [mf.file_from_offset for mf in cq.mfq.files] == [FILE_SIZE]


def test_units_roll_over_into_files_named_by_their_start_byte(make_cq: MakeCQ, seed: int) -> None:
    rng = random.Random(seed)
    cq = make_cq()
    units = [(rng.randrange(2**40), rng.randrange(1, 2**31), rng.randrange(-(2**63), 2**63)) for _ in range(11)]
    for qo, u in enumerate(units):
        assert cq.put(*u, qo)
    assert [mf.file_name for mf in cq.mfq.files] == [offset_to_file_name(i * FILE_SIZE) for i in range(3)]
    assert sorted(os.listdir(cq.mfq.directory)) == [offset_to_file_name(i * FILE_SIZE) for i in range(3)]
    assert [cq.unit(qo) for qo in range(11)] == units
    assert cq.max_offset_in_queue() == 11


def test_put_units_writes_consecutive_units_in_one_go(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 1)
    raw = b"".join(CQ_UNIT.pack(100 * qo, SIZE, qo) for qo in range(1, 7))
    cq.put_units(raw, 1, 650)
    assert [cq.unit(qo) for qo in range(1, 7)] == [(100 * qo, SIZE, qo) for qo in range(1, 7)]
    assert cq.max_offset_in_queue() == 7


def test_recover_finds_the_last_valid_unit_after_reopening(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 10)
    cq.close()
    again = make_cq(load=True)
    assert again.max_offset_in_queue() == 10
    assert again.min_offset_in_queue() == 0
    assert again.max_physic_offset == 900 + SIZE
    assert [again.unit(qo) for qo in range(10)] == [(100 * qo, SIZE, qo * 7 - 3) for qo in range(10)]
    assert not again.put(0, SIZE, 0, 9)
    assert again.put(1000, SIZE, 0, 10)
    assert again.unit(10) == (1000, SIZE, 0)


def test_recover_of_exactly_full_files_continues_in_a_new_file(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 2 * UNITS_PER_FILE)
    cq.close()
    again = make_cq(load=True)
    assert again.max_offset_in_queue() == 2 * UNITS_PER_FILE
    assert again.put(800, SIZE, 0, 8)
    assert [mf.file_from_offset for mf in again.mfq.files] == [0, FILE_SIZE, 2 * FILE_SIZE]


def test_recover_keeps_hole_units(make_cq: MakeCQ) -> None:
    cq = make_cq()
    assert cq.put(0, SIZE, 0, 0)
    assert cq.put(300, SIZE, 0, 3)
    cq.close()
    again = make_cq(load=True)
    assert again.max_offset_in_queue() == 4
    assert again.unit(1) == (-1, 0, 0)
    assert again.unit(3) == (300, SIZE, 0)


def test_recover_drops_trailing_files_without_a_valid_unit(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 5)
    cq.close()
    stray = os.path.join(cq.mfq.directory, offset_to_file_name(2 * FILE_SIZE))
    with open(stray, "wb") as f:
        f.write(bytes(FILE_SIZE))
    again = make_cq(load=True)
    assert again.max_offset_in_queue() == 5
    assert not os.path.exists(stray)


def test_recover_stops_at_a_torn_unit(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 3)
    cq.close()
    path = os.path.join(cq.mfq.directory, offset_to_file_name(0))
    with open(path, "r+b") as f:
        f.seek(2 * CQ_UNIT_SIZE + 8)
        f.write(b"\0\0\0\0")  # the third unit's size: zero
    again = make_cq(load=True)
    assert again.max_offset_in_queue() == 2
    assert again.max_physic_offset == 100 + SIZE


def test_recover_finds_the_units_of_a_queue_that_started_in_the_middle_of_a_file(make_cq: MakeCQ) -> None:
    cq = make_cq()
    assert cq.put(5000, SIZE, 1, 5)
    assert cq.put(5100, SIZE, 2, 6)
    cq.close()
    again = make_cq(load=True)
    assert again.max_offset_in_queue() == 7
    assert again.unit(5) == (5000, SIZE, 1)
    assert again.unit(6) == (5100, SIZE, 2)
    assert again.put(5200, SIZE, 3, 7)
    assert again.unit(5) == (5000, SIZE, 1)


def test_truncate_dirty_drops_units_pointing_at_or_past_the_offset(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 10)  # unit n: [100 n, 100 n + 50)
    files_before = [mf.path for mf in cq.mfq.files]
    cq.truncate_dirty(550)  # unit 5 ends at 550: kept; unit 6 starts at 600: dropped
    assert cq.max_offset_in_queue() == 6
    assert cq.unit(5) == (500, SIZE, 5 * 7 - 3)
    assert cq.unit(6) is None
    assert cq.max_physic_offset == 550
    assert not os.path.exists(files_before[2])
    assert len(cq.mfq.files) == 2
    second = cq.mfq.files[1]
    assert bytes(second.mv[2 * CQ_UNIT_SIZE :]) == bytes(FILE_SIZE - 2 * CQ_UNIT_SIZE)
    assert cq.put(600, 10, 0, 6)  # the queue continues where the log does
    assert cq.unit(6) == (600, 10, 0)


def test_truncate_dirty_drops_a_unit_whose_record_is_cut_in_the_middle(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 3)
    cq.truncate_dirty(220)  # unit 2 is [200, 250): not whole below 220
    assert cq.max_offset_in_queue() == 2
    assert cq.max_physic_offset == 150


def test_truncate_dirty_below_every_unit_empties_the_queue(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 6)
    cq.truncate_dirty(0)
    assert cq.max_offset_in_queue() == 0
    assert cq.unit(0) is None
    assert cq.put(0, 40, 0, 0)


def test_truncate_dirty_past_every_unit_changes_nothing(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 6)
    cq.truncate_dirty(10_000)
    assert cq.max_offset_in_queue() == 6
    assert cq.unit(5) == (500, SIZE, 5 * 7 - 3)


def test_correct_min_offset_moves_to_the_first_unit_whose_record_is_at_or_after_the_offset(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 10)
    cq.correct_min_offset(150)
    assert cq.min_offset_in_queue() == 2
    assert cq.unit(1) is None
    assert cq.unit(2) == (200, SIZE, 2 * 7 - 3)
    cq.correct_min_offset(200)  # exactly at a record
    assert cq.min_offset_in_queue() == 2
    cq.correct_min_offset(0)  # never moves back
    assert cq.min_offset_in_queue() == 2


def test_correct_min_offset_looks_past_the_first_file(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 10)  # three files: units 0-3, 4-7, 8-9
    cq.correct_min_offset(650)
    assert cq.min_offset_in_queue() == 7
    assert cq.unit(6) is None


def test_delete_expired_files_deletes_leading_files_pointing_below_the_offset(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 10)
    paths = [mf.path for mf in cq.mfq.files]
    assert cq.delete_expired_files(350) == 1  # units 0-3 end at 350
    assert not os.path.exists(paths[0])
    assert cq.min_offset_in_queue() == 4
    assert cq.unit(3) is None
    assert cq.delete_expired_files(600) == 0  # unit 7 still exists
    assert cq.min_offset_in_queue() == 6
    assert cq.delete_expired_files(100_000) == 1  # the last file is never deleted
    assert [mf.path for mf in cq.mfq.files] == paths[2:]
    assert cq.max_offset_in_queue() == 10


def test_offset_by_time_finds_the_first_offset_stored_at_or_after_the_time(make_cq: MakeCQ, seed: int) -> None:
    rng = random.Random(seed)
    cq = make_cq()
    n = rng.randrange(1, 40)
    stamps: list[int] = []
    ts = 1_700_000_000_000
    for qo in range(n):
        ts += rng.choice([0, 0, 1, 5, 1000])  # non-decreasing, with equal stamps
        stamps.append(ts)
        assert cq.put(100 * qo, SIZE, 0, qo)
    by_offset = {100 * qo: s for qo, s in enumerate(stamps)}

    def store_timestamp_at(offset: int) -> int:
        return by_offset.get(offset, -1)

    for t in [stamps[0] - 1, *stamps, stamps[-1] + 1, *(s + 1 for s in stamps)]:
        expect = next((qo for qo, s in enumerate(stamps) if s >= t), n)
        assert cq.offset_by_time(t, store_timestamp_at) == expect, t


def test_offset_by_time_treats_removed_records_as_older_than_any_time(make_cq: MakeCQ) -> None:
    cq = make_cq()
    _fill(cq, 8)

    def store_timestamp_at(offset: int) -> int:
        return -1 if offset < 300 else 10_000 + offset  # records 0-2 were deleted

    assert cq.offset_by_time(0, store_timestamp_at) == 3
    assert cq.offset_by_time(10_500, store_timestamp_at) == 5
    assert cq.offset_by_time(99_999, store_timestamp_at) == 8


def test_offset_by_time_of_an_empty_queue_is_zero(make_cq: MakeCQ) -> None:
    cq = make_cq()
    assert cq.offset_by_time(123, lambda _offset: 0) == 0


def test_dirty_pages_counts_what_was_written_since_the_last_flush(make_cq: MakeCQ) -> None:
    cq = make_cq(units_per_file=1000)
    assert cq.dirty_pages() == 0
    _fill(cq, 3)
    assert cq.dirty_pages() >= 1
    cq.flush(0)
    assert cq.dirty_pages() == 0
