"""StoreCheckpoint and the abort file (checkpoint.py)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from data_plane.store.checkpoint import (
    CHECKPOINT,
    CHECKPOINT_FILE_SIZE,
    StoreCheckpoint,
    create_abort_file,
    delete_abort_file,
)


def _sample(path: str) -> StoreCheckpoint:
    return StoreCheckpoint(
        path,
        physic_msg_timestamp=1_700_000_000_001,
        logics_msg_timestamp=1_700_000_000_002,
        index_msg_timestamp=1_700_000_000_003,
        physic_offset=123_456_789,
        logics_offset=123_000_000,
        index_offset=122_999_999,
    )


def test_flush_then_load_gives_back_every_field(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint")
    _sample(path).flush()
    got = StoreCheckpoint.load(path)
    assert got.valid
    assert (
        got.physic_msg_timestamp,
        got.logics_msg_timestamp,
        got.index_msg_timestamp,
        got.physic_offset,
        got.logics_offset,
        got.index_offset,
    ) == (1_700_000_000_001, 1_700_000_000_002, 1_700_000_000_003, 123_456_789, 123_000_000, 122_999_999)
    assert got.min_offset() == 122_999_999
    assert os.path.getsize(path) == CHECKPOINT_FILE_SIZE


def test_a_second_flush_replaces_the_first(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint")
    cp = _sample(path)
    cp.flush()
    cp.physic_offset = 5
    cp.flush()
    got = StoreCheckpoint.load(path)
    assert got.valid
    assert got.physic_offset == 5
    assert got.min_offset() == 5


def test_a_flipped_byte_makes_load_return_an_invalid_checkpoint(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "checkpoint")
    _sample(path).flush()
    for _ in range(20):
        at = rng.randrange(CHECKPOINT.size)
        bit = 1 << rng.randrange(8)
        with open(path, "r+b") as f:
            f.seek(at)
            old = f.read(1)[0]
            f.seek(at)
            f.write(bytes([old ^ bit]))
        got = StoreCheckpoint.load(path)
        assert not got.valid, (at, bit)
        assert (got.physic_offset, got.logics_offset, got.index_offset) == (0, 0, 0)
        with open(path, "r+b") as f:  # put it back for the next round
            f.seek(at)
            f.write(bytes([old]))
        assert StoreCheckpoint.load(path).valid


def test_a_torn_checkpoint_write_makes_load_return_an_invalid_checkpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoint")
    newer = StoreCheckpoint(path, 7, 8, 9, 2**40 + 1, 2**40 + 2, 2**40 + 3)
    newer.flush()
    new_bytes = Path(path).read_bytes()
    _sample(path).flush()
    old_bytes = Path(path).read_bytes()
    assert new_bytes[:20] != old_bytes[:20]
    # The first 20 bytes of the new write reached the disk, the rest did not.
    Path(path).write_bytes(new_bytes[:20] + old_bytes[20:])
    assert not StoreCheckpoint.load(path).valid


def test_a_missing_checkpoint_file_loads_as_invalid(tmp_path: Path) -> None:
    got = StoreCheckpoint.load(str(tmp_path / "nope"))
    assert not got.valid
    assert got.min_offset() == 0


def test_a_short_checkpoint_file_loads_as_invalid(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"\x00" * 51)
    assert not StoreCheckpoint.load(str(path)).valid


def test_an_all_zero_checkpoint_file_loads_as_invalid(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(b"\x00" * CHECKPOINT_FILE_SIZE)
    assert not StoreCheckpoint.load(str(path)).valid


def test_create_abort_file_says_whether_the_file_was_already_there(tmp_path: Path) -> None:
    path = str(tmp_path / "abort")
    assert create_abort_file(path) is False
    assert os.path.exists(path)
    assert create_abort_file(path) is True
    delete_abort_file(path)
    assert not os.path.exists(path)
    delete_abort_file(path)  # deleting a missing abort file is fine
    assert create_abort_file(path) is False


@pytest.mark.parametrize("value", [-1, 2**63 - 1])
def test_extreme_offsets_round_trip(tmp_path: Path, value: int) -> None:
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path, physic_offset=value, logics_offset=value, index_offset=value)
    cp.flush()
    got = StoreCheckpoint.load(path)
    assert got.valid
    assert got.min_offset() == value
