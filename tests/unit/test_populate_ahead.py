"""PopulateAheadService (populate_ahead.py): the page cache filled after the CommitLog writer, in
steps (with a rest after each while half the window or more is filled), never before it begins
a file, resuming at the writer, on a thread at SCHED_IDLE."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.mapped_file import MappedFile, offset_to_file_name, py_populate
from data_plane.store.mapped_file_queue import MappedFileQueue
from data_plane.store.populate_ahead import PopulateAheadService
from tests.conftest import until
from tests.page_cache import resident_pages

FILE_SIZE = 256 * PAGE_SIZE_BYTES  # 1 MiB
AHEAD = 32 * PAGE_SIZE_BYTES
STEP = 8 * PAGE_SIZE_BYTES


class Populating(PopulateAheadService):
    """The service as it is, with each fill and each round written down; ``close`` stops it."""

    def __init__(self, mfq: MappedFileQueue, **kw: Any) -> None:
        self.filled: list[tuple[int, int]] = []
        self.rounds = 0
        self.events: list[tuple[str, float]] = []  # ("fill", start) and ("wait", seconds), in order
        super().__init__(mfq, ahead_bytes=AHEAD, populate=self._fill, step_bytes=STEP, **kw)

    def wait_for_running(self, interval_s: float) -> bool:
        self.rounds += 1
        self.events.append(("wait", interval_s))
        return super().wait_for_running(interval_s)

    def close(self) -> None:
        self.stop()

    def _fill(self, fd: int, start: int, length: int, call_bytes: int) -> int:
        self.filled.append((start, start + length))
        self.events.append(("fill", start))
        return py_populate(fd, start, length, call_bytes)


@pytest.fixture
def mfq(tmp_path: Path) -> Iterator[MappedFileQueue]:
    """A CommitLog queue of one file made as the CommitLog's are: every block reserved, none written."""
    q = MappedFileQueue(str(tmp_path / "commitlog"), FILE_SIZE)
    try:
        q.files.append(MappedFile(q.directory + "/" + offset_to_file_name(0), FILE_SIZE, keep_fd=True, zero_fill=False))
        yield q
    finally:
        q.close()


@pytest.fixture
def svc(mfq: MappedFileQueue) -> Iterator[Populating]:
    with contextlib.closing(Populating(mfq)) as service:
        service.start()
        yield service


def test_pages_after_the_writer_are_brought_into_the_page_cache_in_steps(mfq: MappedFileQueue, svc: Populating) -> None:
    mf = mfq.files[0]
    assert until(lambda: svc.rounds >= 3)
    assert svc.filled == []  # the writer has not begun the file: nothing is filled for nothing
    assert not any(resident_pages(mf.path, 0, FILE_SIZE))
    mf.wrote_position = 10 * PAGE_SIZE_BYTES + 100
    assert until(lambda: mf.populated_upto == 10 * PAGE_SIZE_BYTES + AHEAD), mf.populated_upto
    first = 10 * PAGE_SIZE_BYTES
    assert svc.filled == [(first + i * STEP, first + (i + 1) * STEP) for i in range(AHEAD // STEP)]
    cached = resident_pages(mf.path, 0, FILE_SIZE)
    assert all(cached[10 : 10 + AHEAD // PAGE_SIZE_BYTES])
    assert not any(cached[10 + AHEAD // PAGE_SIZE_BYTES :])  # a window, not the file
    # Less than a step more: not worth a call yet.
    mf.wrote_position += STEP - PAGE_SIZE_BYTES
    seen = svc.rounds
    assert until(lambda: svc.rounds >= seen + 3)
    assert len(svc.filled) == AHEAD // STEP
    # The writer runs past everything filled: filling resumes at the writer, not behind it.
    far = 240 * PAGE_SIZE_BYTES  # AHEAD after it is past the end of the file
    mf.wrote_position = far
    assert until(lambda: mf.populated_upto == FILE_SIZE), mf.populated_upto  # up to the end, no further
    assert all(start >= far for start, _end in svc.filled[AHEAD // STEP :])
    assert svc.filled[-1][1] == FILE_SIZE
    assert all(resident_pages(mf.path, far, FILE_SIZE))


def test_after_a_roll_over_the_new_file_is_filled_from_where_the_writer_is(
    mfq: MappedFileQueue, svc: Populating
) -> None:
    first = mfq.files[0]
    first.wrote_position = FILE_SIZE - AHEAD // 2
    assert until(lambda: first.populated_upto == FILE_SIZE)  # up to its end
    first.wrote_position = FILE_SIZE  # full: the writer moves on to the next file
    nxt = MappedFile(
        mfq.directory + "/" + offset_to_file_name(FILE_SIZE), FILE_SIZE, reserve=True, keep_fd=True, zero_fill=False
    )
    mfq.files.append(nxt)
    nxt.wrote_position = 3 * PAGE_SIZE_BYTES
    assert until(lambda: nxt.populated_upto == 3 * PAGE_SIZE_BYTES + AHEAD), nxt.populated_upto
    assert all(resident_pages(nxt.path, 3 * PAGE_SIZE_BYTES, 3 * PAGE_SIZE_BYTES + AHEAD))


def test_rounds_follow_at_once_until_half_the_window_is_filled_then_each_is_followed_by_a_rest(
    mfq: MappedFileQueue,
) -> None:
    rest_s = 0.02
    with contextlib.closing(Populating(mfq, rest_s=rest_s)) as svc:
        svc.start()
        mf = mfq.files[0]
        wrote = PAGE_SIZE_BYTES
        mf.wrote_position = wrote
        assert until(lambda: mf.populated_upto == wrote + AHEAD), mf.populated_upto
        last = ("fill", wrote + AHEAD - STEP)
        assert until(lambda: len(svc.events) > svc.events.index(last) + 1)
    fills = [i for i, (kind, _v) in enumerate(svc.events) if kind == "fill"]
    assert len(fills) == AHEAD // STEP
    after = [svc.events[i + 1] for i in fills]  # what the thread did right after each fill
    for (_kind, start), nxt in zip((svc.events[i] for i in fills), after, strict=True):
        filled_ahead = start + STEP - wrote
        if filled_ahead >= AHEAD // 2:
            assert nxt == ("wait", rest_s), (start, svc.events)
        else:  # behind: the next round at once
            assert nxt[0] == "fill", (start, svc.events)
    assert after.count(("wait", rest_s)) == AHEAD // STEP - (AHEAD // 2) // STEP + 1


def test_without_a_rest_the_rounds_follow_each_other(mfq: MappedFileQueue) -> None:
    with contextlib.closing(Populating(mfq, rest_s=0.0)) as svc:
        svc.start()
        mf = mfq.files[0]
        mf.wrote_position = PAGE_SIZE_BYTES
        assert until(lambda: mf.populated_upto == PAGE_SIZE_BYTES + AHEAD), mf.populated_upto
    fills = [i for i, (kind, _v) in enumerate(svc.events) if kind == "fill"]
    assert fills == list(range(fills[0], fills[0] + AHEAD // STEP))  # back to back


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_thread_runs_on_spare_cpu_only(mfq: MappedFileQueue) -> None:
    idle, normal = Populating(mfq), Populating(mfq, idle_priority=False)
    for s in (idle, normal):
        s.start()
    try:
        assert until(lambda: idle.rounds >= 1 and normal.rounds >= 1)
        tids = [s._thread.native_id if s._thread is not None else None for s in (idle, normal)]
        assert None not in tids
        assert os.sched_getscheduler(tids[0] or 0) == os.SCHED_IDLE
        assert os.sched_getscheduler(tids[1] or 0) == os.SCHED_OTHER
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is left as it was
    finally:
        for s in (idle, normal):
            s.stop()


def test_nothing_is_filled_when_populate_ahead_is_off(mfq: MappedFileQueue) -> None:
    svc = PopulateAheadService(mfq, ahead_bytes=0)
    assert not svc.populate_after(mfq.files[0], 10 * PAGE_SIZE_BYTES)
    assert mfq.files[0].populated_upto == 0
    assert not any(resident_pages(mfq.files[0].path, 0, FILE_SIZE))
