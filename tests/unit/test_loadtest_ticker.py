"""loadtest/ticker.py: a timerfd beat the event loop sleeps on (Linux)."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time

import pytest

from loadtest.ticker import Ticker

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="timerfd is Linux's")


@pytest.mark.asyncio
async def test_ticks_come_at_the_interval_and_the_loop_sleeps_in_between() -> None:
    loop = asyncio.get_running_loop()
    reached = asyncio.Event()
    stamps: list[float] = []

    def on_tick() -> None:
        stamps.append(time.perf_counter())
        if len(stamps) == 50:
            reached.set()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    ticker = Ticker.create(loop, 0.002, on_tick)
    assert ticker is not None
    try:
        await asyncio.wait_for(reached.wait(), 10)
    finally:
        ticker.close()
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    assert ticker.ticks == 50
    assert wall >= 49 * 0.002, "a timerfd never fires early"
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
    assert gaps[len(gaps) // 2] >= 0.0015, f"the median gap is the interval, got {gaps[len(gaps) // 2]:.4f} s"
    # A spinning wait would use the whole wall time; the ticker's loop sleeps in epoll_wait.
    assert cpu < 0.5 * wall, f"{cpu:.3f} s of CPU in {wall:.3f} s: the loop spun"


@pytest.mark.asyncio
async def test_close_stops_the_ticks_and_is_idempotent() -> None:
    loop = asyncio.get_running_loop()
    ticker = Ticker.create(loop, 0.001, lambda: None)
    assert ticker is not None
    fd = ticker._fd
    ticker.close()
    ticker.close()
    assert not loop.remove_reader(fd), "the loop no longer watches the timer"
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


def test_a_non_positive_interval_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="interval_s"):
            Ticker.create(loop, 0, lambda: None)
    finally:
        loop.close()
