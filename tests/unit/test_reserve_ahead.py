"""ReserveAheadService (reserve_ahead.py): blocks reserved and the page cache filled ahead of the
CommitLog writer, pages released behind it, and a poll that backs off while there is nothing to
do."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile, offset_to_file_name, py_populate
from data_plane.store.mapped_file_queue import AllocateMappedFileService, MappedFileQueue
from data_plane.store.reserve_ahead import BUSY_POLL_S, IDLE_POLL_MAX_S, ReserveAheadService, next_poll_s
from tests.page_cache import resident_pages

FILE_SIZE = 256 * PAGE_SIZE_BYTES  # 1 MiB
WINDOW = 64 * PAGE_SIZE_BYTES
KEEP = 16 * PAGE_SIZE_BYTES


def until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.002)
    return check()


class Recorded(ReserveAheadService):
    """The service as it is, with each wait's length and each release written down."""

    def __init__(self, mfq: MappedFileQueue) -> None:
        self.waits: list[float] = []
        self.released: list[tuple[int, int]] = []
        super().__init__(mfq, window_bytes=WINDOW, keep_behind_bytes=KEEP, release=self._release_range)

    def _release_range(self, mf: MappedFile, start: int, end: int) -> None:
        self.released.append((start, end))

    def wait_for_running(self, interval_s: float) -> bool:
        self.waits.append(interval_s)
        return super().wait_for_running(interval_s)


@pytest.fixture
def mfq(tmp_path: Path) -> Iterator[MappedFileQueue]:
    q = MappedFileQueue(str(tmp_path / "commitlog"), FILE_SIZE)
    # A file whose blocks are not reserved yet (what recovery leaves after truncating a tail).
    mf = MappedFile(str(tmp_path / "commitlog" / offset_to_file_name(0)), FILE_SIZE, reserve=False, keep_fd=True)
    q.files.append(mf)
    yield q
    for f in q.files:
        f.close()


@pytest.fixture
def svc(mfq: MappedFileQueue) -> Iterator[Recorded]:
    service = Recorded(mfq)
    service.start()
    yield service
    service.stop()


def test_blocks_are_reserved_a_window_ahead_of_the_writer_and_pages_released_behind_it(
    mfq: MappedFileQueue, svc: Recorded
) -> None:
    mf = mfq.files[0]
    assert until(lambda: mf.reserved_upto >= WINDOW), mf.reserved_upto
    assert mf.reserved_upto < FILE_SIZE  # a window ahead, not the whole file
    mf.wrote_position = 128 * PAGE_SIZE_BYTES
    assert until(lambda: mf.reserved_upto >= mf.wrote_position + WINDOW), mf.reserved_upto
    assert until(lambda: mf.released_behind == mf.wrote_position - KEEP), mf.released_behind
    assert svc.released
    assert svc.released[-1][1] == mf.wrote_position - KEEP
    assert all(end <= mf.wrote_position - KEEP for _start, end in svc.released)  # never the kept pages


def test_the_poll_backs_off_while_idle_and_tightens_when_the_writer_moves(mfq: MappedFileQueue, svc: Recorded) -> None:
    mf = mfq.files[0]
    assert until(lambda: mf.reserved_upto >= WINDOW)
    # Nothing moves: the waits double up to the cap instead of waking every 2 ms.
    assert until(lambda: svc.waits[-1:] == [IDLE_POLL_MAX_S])
    quiet_from = len(svc.waits)
    time.sleep(0.5)
    idle_wakeups = len(svc.waits) - quiet_from
    assert idle_wakeups <= 0.5 / IDLE_POLL_MAX_S + 2, idle_wakeups  # ~8, not ~250
    # The writer moves on: the rounds have work again, and the next wait starts short.
    before = len(svc.waits)
    mf.wrote_position = 192 * PAGE_SIZE_BYTES
    assert until(lambda: mf.reserved_upto >= mf.wrote_position + WINDOW or mf.reserved_upto == FILE_SIZE)
    assert until(lambda: len(svc.waits) > before)
    assert svc.waits[before] <= 2 * BUSY_POLL_S, svc.waits[before:]


STEP = 32 * 1024 * 1024


def test_a_writer_standing_still_doubles_the_wait_up_to_the_cap() -> None:
    assert next_poll_s(0, 0.01, STEP, 0.004) == 0.008
    assert next_poll_s(0, 0.01, STEP, IDLE_POLL_MAX_S) == IDLE_POLL_MAX_S
    assert next_poll_s(0, 0.0, STEP, 0.0) == BUSY_POLL_S


def test_a_moving_writer_is_polled_once_per_quarter_release_step_at_its_rate() -> None:
    # A quarter step (8 MiB) in 10 ms: the next look in 10 ms, whatever the previous wait.
    assert next_poll_s(STEP // 4, 0.010, STEP, IDLE_POLL_MAX_S) == pytest.approx(0.010)
    # 100 MB/s: a quarter step takes ~84 ms, over the cap.
    assert next_poll_s(1_000_000, 0.010, STEP, BUSY_POLL_S) == IDLE_POLL_MAX_S
    # 8 GB/s: a quarter step in ~1 ms, under the floor.
    assert next_poll_s(80_000_000, 0.010, STEP, IDLE_POLL_MAX_S) == BUSY_POLL_S


# --- populate ahead ------------------------------------------------------------------------------
AHEAD = 32 * PAGE_SIZE_BYTES
POP_STEP = 8 * PAGE_SIZE_BYTES


class Populating(ReserveAheadService):
    """The service keeping AHEAD bytes after the writer in the page cache, each call noted."""

    def __init__(self, mfq: MappedFileQueue) -> None:
        self.filled: list[tuple[int, int]] = []
        self.rounds = 0
        super().__init__(
            mfq, window_bytes=WINDOW, keep_behind_bytes=KEEP, release=None,
            populate_ahead_bytes=AHEAD, populate=self._fill, populate_step_bytes=POP_STEP,
        )  # fmt: skip

    def wait_for_running(self, interval_s: float) -> bool:
        self.rounds += 1
        return super().wait_for_running(interval_s)

    def _fill(self, fd: int, start: int, length: int, call_bytes: int) -> int:
        self.filled.append((start, start + length))
        return py_populate(fd, start, length, call_bytes)


@pytest.fixture
def reserved(tmp_path: Path) -> Iterator[MappedFileQueue]:
    q = MappedFileQueue(str(tmp_path / "commitlog"), FILE_SIZE)
    path = q.directory + "/" + offset_to_file_name(0)
    q.files.append(MappedFile(path, FILE_SIZE, reserve=True, keep_fd=True, zero_fill=False))  # as the CommitLog's
    yield q
    for f in q.files:
        f.close()


def test_pages_after_the_writer_are_brought_into_the_page_cache_in_steps(reserved: MappedFileQueue) -> None:
    mf = reserved.files[0]
    svc = Populating(reserved)
    svc.start()
    try:
        assert until(lambda: svc.rounds >= 3)
        assert svc.filled == []  # the writer has not begun the file: nothing is filled for nothing
        assert not any(resident_pages(mf.path, 0, FILE_SIZE))
        mf.wrote_position = 10 * PAGE_SIZE_BYTES + 100
        assert until(lambda: mf.populated_upto == 10 * PAGE_SIZE_BYTES + AHEAD), mf.populated_upto
        assert svc.filled == [(10 * PAGE_SIZE_BYTES + i * POP_STEP, 10 * PAGE_SIZE_BYTES + (i + 1) * POP_STEP)
                              for i in range(AHEAD // POP_STEP)]  # fmt: skip
        cached = resident_pages(mf.path, 0, FILE_SIZE)
        assert all(cached[10 : 10 + AHEAD // PAGE_SIZE_BYTES])
        assert not any(cached[10 + AHEAD // PAGE_SIZE_BYTES :])  # a window, not the file
        # Less than a step more: not worth a call yet.
        mf.wrote_position += POP_STEP - PAGE_SIZE_BYTES
        seen = svc.rounds
        assert until(lambda: svc.rounds >= seen + 3)
        assert len(svc.filled) == AHEAD // POP_STEP
        # The writer runs past everything filled: filling resumes at the writer, not behind it.
        far = 240 * PAGE_SIZE_BYTES  # AHEAD after it is past the end of the file
        mf.wrote_position = far
        assert until(lambda: mf.populated_upto == FILE_SIZE), mf.populated_upto  # up to the end, no further
        assert all(start >= far for start, _end in svc.filled[AHEAD // POP_STEP + 1 :])
        assert svc.filled[-1][1] == FILE_SIZE
        assert all(resident_pages(mf.path, far, FILE_SIZE))
    finally:
        svc.stop()


def test_the_allocation_thread_fills_the_head_of_each_next_file(tmp_path: Path) -> None:
    allocator = AllocateMappedFileService(warm_up=False, populate_head_bytes=AHEAD)
    q = MappedFileQueue(str(tmp_path / "commitlog"), FILE_SIZE, allocator=allocator)
    try:
        q.last_file_for_write()  # the first file, and the next one requested ahead of need
        nxt = q.directory + "/" + offset_to_file_name(FILE_SIZE)
        assert until(lambda: os.path.exists(nxt) and any(resident_pages(nxt, 0, FILE_SIZE)))
        assert until(lambda: resident_pages(nxt, 0, FILE_SIZE) == [True] * (AHEAD // PAGE_SIZE_BYTES)
                     + [False] * ((FILE_SIZE - AHEAD) // PAGE_SIZE_BYTES))  # fmt: skip
    finally:
        allocator.shutdown()
        q.close()
