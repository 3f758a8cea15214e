"""ReserveAheadService (reserve_ahead.py): blocks reserved ahead of the CommitLog writer, pages
released behind it, and a poll that backs off while there is nothing to do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile, offset_to_file_name
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.reserve_ahead import BUSY_POLL_S, IDLE_POLL_MAX_S, ReserveAheadService, next_poll_s
from tests.conftest import until

FILE_SIZE = 256 * PAGE_SIZE_BYTES  # 1 MiB
WINDOW = 64 * PAGE_SIZE_BYTES
KEEP = 16 * PAGE_SIZE_BYTES


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
