"""MappedFileQueue: equal-size files forming one logical byte stream (mapped_file_queue.py)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.store.mapped_file import offset_to_file_name
from data_plane.store.mapped_file_queue import AllocateMappedFileService, MappedFileQueue
from tests.page_cache import mapped_resident_kib

SIZE = 4096

MakeQueue = Callable[..., MappedFileQueue]


@pytest.fixture
def make_queue(tmp_path: Path) -> Iterator[MakeQueue]:
    made: list[MappedFileQueue] = []

    def make(directory: Path | None = None, file_size: int = SIZE, **kw: object) -> MappedFileQueue:
        q = MappedFileQueue(str(directory or tmp_path / "q"), file_size, **kw)  # type: ignore[arg-type]
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


def _write(q: MappedFileQueue, data: bytes) -> None:
    """Append ``data`` across as many files as it takes."""
    view = memoryview(data)
    while view:
        mf = q.last_file_for_write()
        n = min(len(view), mf.remaining)
        assert mf.append_bytes(view[:n])
        view = view[n:]


def _pattern(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(1, 256) for _ in range(n))


def _names(q: MappedFileQueue) -> list[str]:
    return sorted(n for n in os.listdir(q.directory))


def test_an_empty_queue_has_no_files_and_offsets_zero(make_queue: MakeQueue) -> None:
    q = make_queue()
    assert q.files == []
    assert q.first is None
    assert q.last is None
    assert q.min_offset() == 0
    assert q.max_offset() == 0
    assert q.find_by_offset(0) is None


def test_the_queue_rolls_over_to_a_new_file_named_by_its_start_offset_when_full(make_queue: MakeQueue) -> None:
    q = make_queue()
    first = q.last_file_for_write()
    assert first.file_from_offset == 0
    assert first.append_bytes(b"a" * SIZE)
    assert q.last_file_for_write() is not first  # full: a new one
    _write(q, b"b" * (SIZE + 10))
    assert [mf.file_name for mf in q.files] == [offset_to_file_name(i * SIZE) for i in range(3)]
    assert _names(q) == [offset_to_file_name(i * SIZE) for i in range(3)]
    assert q.max_offset() == 2 * SIZE + 10
    assert q.min_offset() == 0
    assert q.last_file_for_write() is q.files[-1]  # not full: the same one


def test_the_first_file_of_a_queue_starting_mid_file_is_the_one_holding_the_start(make_queue: MakeQueue) -> None:
    q = make_queue()
    mf = q.last_file_for_write(start_offset=2 * SIZE + 300)
    assert mf.file_from_offset == 2 * SIZE
    assert mf.wrote_position == 300
    assert q.max_offset() == 2 * SIZE + 300
    assert q.flushed_where == 2 * SIZE + 300


def test_find_by_offset_returns_the_file_holding_the_offset(make_queue: MakeQueue, seed: int) -> None:
    q = make_queue()
    _write(q, _pattern(3 * SIZE + 100, seed))
    for offset in (0, 1, SIZE - 1, SIZE, 2 * SIZE + 5, 3 * SIZE, 3 * SIZE + 99, 4 * SIZE - 1):
        mf = q.find_by_offset(offset)
        assert mf is not None
        assert mf.file_from_offset == offset // SIZE * SIZE
    assert q.find_by_offset(4 * SIZE) is None
    assert q.find_by_offset(-1) is None


def test_find_by_offset_still_works_after_the_first_files_were_deleted(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"x" * (4 * SIZE + 1))
    q.delete_first_files(2)
    assert q.min_offset() == 2 * SIZE
    assert q.find_by_offset(SIZE) is None
    found = q.find_by_offset(3 * SIZE + 7)
    assert found is not None
    assert found.file_from_offset == 3 * SIZE


def test_min_and_max_offset_follow_the_first_file_and_the_last_write(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"m" * (2 * SIZE + 123))
    assert (q.min_offset(), q.max_offset()) == (0, 2 * SIZE + 123)
    q.delete_first_files(1)
    assert (q.min_offset(), q.max_offset()) == (SIZE, 2 * SIZE + 123)


def test_flush_all_makes_everything_written_durable(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"d" * (2 * SIZE + 50))
    assert q.flushed_where == 0
    q.flush_all()
    assert q.flushed_where == 2 * SIZE + 50
    assert all(mf.flushed_position == mf.wrote_position for mf in q.files)


def test_truncate_dirty_files_keeps_bytes_before_the_offset_zeroes_the_rest_and_deletes_later_files(
    make_queue: MakeQueue, seed: int
) -> None:
    q = make_queue()
    data = _pattern(4 * SIZE, seed)
    _write(q, data)
    q.flush_all()
    cut = SIZE + random.Random(seed).randrange(1, SIZE)
    later = [mf.path for mf in q.files[2:]]
    q.truncate_dirty_files(cut)
    assert [mf.file_from_offset for mf in q.files] == [0, SIZE]
    assert all(not os.path.exists(p) for p in later)
    assert _names(q) == [offset_to_file_name(0), offset_to_file_name(SIZE)]
    assert q.max_offset() == cut
    assert q.flushed_where == cut  # nothing after the cut can count as durable
    assert bytes(q.files[0].mv) == data[:SIZE]
    kept = q.files[1]
    assert kept.wrote_position == cut - SIZE
    assert bytes(kept.mv[: cut - SIZE]) == data[SIZE:cut]
    assert bytes(kept.mv[cut - SIZE :]) == bytes(2 * SIZE - cut)
    with open(kept.path, "rb") as f:
        assert f.read() == data[SIZE:cut] + bytes(2 * SIZE - cut)
    # Writing resumes right at the cut.
    _write(q, b"\x01\x02")
    assert bytes(kept.mv[cut - SIZE : cut - SIZE + 2]) == b"\x01\x02"
    assert q.max_offset() == cut + 2


def test_truncate_dirty_files_at_a_file_boundary_keeps_that_file_empty(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"t" * (3 * SIZE))
    q.truncate_dirty_files(SIZE)
    assert [mf.file_from_offset for mf in q.files] == [0, SIZE]
    assert q.files[1].wrote_position == 0
    assert bytes(q.files[1].mv) == bytes(SIZE)
    assert q.max_offset() == SIZE


def test_delete_first_files_never_deletes_the_last_file(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"z" * (3 * SIZE - 1))
    paths = [mf.path for mf in q.files]
    gone = q.delete_first_files(10)
    assert [mf.path for mf in gone] == paths[:2]
    assert [mf.path for mf in q.files] == paths[2:]
    assert not os.path.exists(paths[0])
    assert not os.path.exists(paths[1])
    assert os.path.exists(paths[2])
    assert q.delete_first_files(1) == []
    assert len(q.files) == 1


def test_delete_expired_by_time_deletes_oldest_files_by_modification_time(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"e" * (5 * SIZE - 1))
    now = time.time()
    old, new = now - 10_000, now - 10
    for mf, mtime in zip(q.files, [old, old, new, old, old], strict=True):
        os.utime(mf.path, (mtime, mtime))
    paths = [mf.path for mf in q.files]
    gone = q.delete_expired_by_time(expired_before=now - 3600, force=False, max_batch=10)
    # Stops at the first file that is not expired, even if later ones are.
    assert [mf.path for mf in gone] == paths[:2]
    assert [mf.path for mf in q.files] == paths[2:]
    assert not os.path.exists(paths[0])
    assert os.path.exists(paths[3])


def test_delete_expired_by_time_keeps_the_last_file_even_when_expired(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"e" * (2 * SIZE + 1))
    ancient = time.time() - 1_000_000
    for mf in q.files:
        os.utime(mf.path, (ancient, ancient))
    gone = q.delete_expired_by_time(expired_before=time.time(), force=False, max_batch=10)
    assert len(gone) == 2
    assert len(q.files) == 1
    assert os.path.exists(q.files[0].path)


def test_delete_expired_by_time_deletes_at_most_max_batch_files(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"e" * (5 * SIZE + 1))
    ancient = time.time() - 1_000_000
    for mf in q.files:
        os.utime(mf.path, (ancient, ancient))
    assert len(q.delete_expired_by_time(expired_before=time.time(), force=False, max_batch=2)) == 2
    assert q.min_offset() == 2 * SIZE


def test_delete_expired_by_time_with_force_deletes_young_files_too(make_queue: MakeQueue) -> None:
    q = make_queue()
    _write(q, b"f" * (3 * SIZE + 1))
    gone = q.delete_expired_by_time(expired_before=0.0, force=True, max_batch=2)
    assert len(gone) == 2
    assert q.min_offset() == 2 * SIZE


def test_load_maps_the_files_of_a_directory_again(make_queue: MakeQueue, tmp_path: Path, seed: int) -> None:
    q = make_queue()
    data = _pattern(3 * SIZE + 500, seed)
    _write(q, data)
    q.flush_all()
    q.close()
    again = make_queue()
    again.load()
    assert [mf.file_from_offset for mf in again.files] == [0, SIZE, 2 * SIZE, 3 * SIZE]
    # Loaded files count as full until recovery sets the positions.
    assert all(mf.wrote_position == SIZE for mf in again.files)
    assert b"".join(bytes(mf.mv) for mf in again.files)[: len(data)] == data
    found = again.find_by_offset(2 * SIZE + 10)
    assert found is not None
    assert found.mv[10] == data[2 * SIZE + 10]


def test_load_ignores_other_files_keeps_a_short_last_file_and_removes_an_empty_one(
    make_queue: MakeQueue, tmp_path: Path
) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    (directory / offset_to_file_name(0)).write_bytes(b"a" * SIZE)
    (directory / offset_to_file_name(SIZE)).write_bytes(b"b" * 100)  # lost its tail
    (directory / "notes.txt").write_text("not a data file")
    q = make_queue(directory)
    q.load()
    # A last file that lost its tail keeps what it has (recovery decides what is sound) and
    # gets its size back; an empty one (creation cut short) goes.
    assert [mf.file_from_offset for mf in q.files] == [0, SIZE]
    assert os.path.getsize(directory / offset_to_file_name(SIZE)) == SIZE
    assert bytes(q.files[1].mv[:101]) == b"b" * 100 + b"\0"
    assert (directory / "notes.txt").exists()
    q.close()
    (directory / offset_to_file_name(2 * SIZE)).write_bytes(b"")
    q2 = make_queue(directory)
    q2.load()
    assert [mf.file_from_offset for mf in q2.files] == [0, SIZE]
    assert not (directory / offset_to_file_name(2 * SIZE)).exists()


def test_load_refuses_a_file_of_another_size_in_the_middle(make_queue: MakeQueue, tmp_path: Path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    (directory / offset_to_file_name(0)).write_bytes(b"a" * 100)
    (directory / offset_to_file_name(SIZE)).write_bytes(b"b" * SIZE)
    q = make_queue(directory)
    with pytest.raises(OSError, match="differs"):
        q.load()


def test_a_queue_with_an_allocator_rolls_over_into_pre_created_files(make_queue: MakeQueue) -> None:
    allocator = AllocateMappedFileService(warm_up=False)
    try:
        q = make_queue(allocator=allocator)
        _write(q, b"w" * (3 * SIZE + 1))
        assert [mf.file_from_offset for mf in q.files] == [0, SIZE, 2 * SIZE, 3 * SIZE]
        assert bytes(q.files[2].mv[:3]) == b"www"
    finally:
        allocator.shutdown()
    # The file created ahead of need, never written, is not left behind.
    assert offset_to_file_name(4 * SIZE) not in os.listdir(q.directory)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_files_that_keep_a_descriptor_are_written_with_pwrite_not_through_the_mapping(
    make_queue: MakeQueue,
) -> None:
    # A write through the mapping faults each new page in (and may read megabytes ahead inside
    # the fault); pwrite copies into the page cache and leaves the mapping untouched.
    q = make_queue(keep_fd=True, file_size=64 * 1024)
    mf = q.last_file_for_write()
    data = _pattern(48 * 1024, seed=3)
    assert mf.append_bytes(data)
    assert mapped_resident_kib(mf.path) == 0, "the writer mapped none of the pages it wrote"
    assert bytes(mf.mv[: len(data)]) == data, "readers see the bytes through the mapping"
    assert mapped_resident_kib(mf.path) > 0
    with open(mf.path, "rb") as f:
        assert f.read(len(data)) == data

    cq = make_queue(directory=Path(q.directory) / "cq", keep_fd=False, file_size=64 * 1024)
    cq_file = cq.last_file_for_write()
    assert cq_file.append_bytes(b"u" * 8192)
    assert mapped_resident_kib(cq_file.path) > 0, "files without a descriptor are written through the mapping"
