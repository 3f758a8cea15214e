"""TimerLog: units round-trip, segments roll over, the checkpoint cuts what came after it, whole
delivered segments are deleted, and a corrupt unit is passed over (timer_log.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from data_plane.broker.timer_log import NO_PREV, UNIT_SIZE, TimerLog, TimerLogError, TimerUnit


def _log(path: Path, end: int = 0, per: int = 4) -> TimerLog:
    tl = TimerLog(str(path), units_per_segment=per)
    tl.load(end)
    return tl


def test_units_round_trip_and_roll_into_new_segments(tmp_path: Path) -> None:
    tl = _log(tmp_path)
    for i in range(10):
        assert tl.append(100 + i, 1000 * i, 50 + i, i - 1 if i else NO_PREV) == i
    assert tl.end == 10
    assert sorted(os.listdir(tmp_path)) == [f"{n:020d}" for n in (0, 4, 8)]
    assert tl.read(7) == TimerUnit(107, 7000, 57, 6)
    assert [i for i, _ in tl.scan()] == list(range(10))
    tl.flush()
    tl.close()


def test_load_cuts_units_after_the_checkpoint(tmp_path: Path) -> None:
    tl = _log(tmp_path)
    for i in range(10):
        tl.append(5, i, 1, NO_PREV)
    tl.close()
    tl = _log(tmp_path, end=6)
    assert tl.end == 6
    assert sorted(os.listdir(tmp_path)) == [f"{n:020d}" for n in (0, 4)]
    assert os.path.getsize(tmp_path / f"{4:020d}") == 2 * UNIT_SIZE
    assert tl.append(9, 99, 1, NO_PREV) == 6
    tl.close()


def test_a_checkpoint_ahead_of_the_files_is_an_error(tmp_path: Path) -> None:
    tl = _log(tmp_path)
    tl.append(5, 1, 1, NO_PREV)
    tl.close()
    with pytest.raises(TimerLogError):
        _log(tmp_path, end=3)


def test_delivered_segments_are_deleted_but_not_the_last(tmp_path: Path) -> None:
    tl = _log(tmp_path)
    for i in range(10):
        tl.append(100 + i, i, 1, NO_PREV)
    assert tl.delete_segments(104) == 1  # segment 0 holds slots 100..103
    assert tl.first == 4
    assert tl.delete_segments(10_000) == 1  # segment 8 is the one written to: kept
    assert tl.first == 8
    with pytest.raises(TimerLogError):
        tl.read(3)
    tl.close()
    # A log whose every earlier segment was deleted reopens at its checkpointed end.
    tl = _log(tmp_path, end=10)
    assert tl.first == 8 and tl.end == 10  # noqa: PT018
    tl.close()


def test_a_corrupt_unit_is_skipped_by_the_scan(tmp_path: Path) -> None:
    tl = _log(tmp_path, per=100)
    for i in range(3):
        tl.append(7, i, 1, NO_PREV)
    tl.close()
    path = tmp_path / f"{0:020d}"
    raw = bytearray(path.read_bytes())
    raw[UNIT_SIZE + 3] ^= 0xFF
    path.write_bytes(bytes(raw))
    tl = _log(tmp_path, end=3, per=100)
    assert [i for i, _ in tl.scan()] == [0, 2]
    with pytest.raises(TimerLogError):
        tl.read(1)
    tl.close()
