"""LoopStallGauge (data_plane/loop_stall.py): how late the loop wakes its timer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from data_plane.loop_stall import STALL_LIMIT_MS, LoopStallGauge
from data_plane.tasks import cancel_all


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.005)


def block_the_loop(seconds: float) -> None:
    """What a stall is: the loop's thread busy with something else."""
    time.sleep(seconds)


@pytest.mark.asyncio
async def test_a_blocked_loop_is_a_stall_as_long_as_the_block_and_one_over_the_limit() -> None:
    reported: list[float] = []
    cpu: list[float] = []

    def stalled(ms: float) -> None:
        reported.append(ms)
        cpu.append(gauge.last_cpu_ms)

    gauge = LoopStallGauge(period_ms=5, report_over_ms=50, on_stall=stalled)
    task = asyncio.create_task(gauge.run())
    try:
        await asyncio.sleep(0.05)
        assert gauge.over_limit == 0
        block_the_loop(0.15)
        await _until(lambda: gauge.max_ms >= 140)
        assert gauge.max_ms < 1000
        assert gauge.over_limit == 1
        assert len(reported) == 1
        assert reported[0] >= 140
        assert cpu[0] < 100  # it slept: the loop's thread was not on the CPU
        block_the_loop(0.06)  # over report_over_ms, under the limit
        await _until(lambda: len(reported) == 2)
        assert gauge.over_limit == 1
        info = gauge.runtime_info()
        assert info == {"loopStallMaxMs": round(gauge.max_ms), "loopStallsOver100ms": 1}
    finally:
        await cancel_all([task])


def test_record_counts_only_stalls_over_the_limit() -> None:
    gauge = LoopStallGauge()
    for ms in (0.3, 99.0, STALL_LIMIT_MS, 100.5, 2500.0, 7.0):
        gauge.record(ms)
    assert gauge.over_limit == 2
    assert gauge.max_ms == 2500.0
    with pytest.raises(ValueError, match="period_ms"):
        LoopStallGauge(period_ms=0)


@pytest.mark.asyncio
async def test_a_stall_says_whether_the_loop_was_busy_or_waiting() -> None:
    cpu_at_stall: list[float] = []
    gauge = LoopStallGauge(period_ms=5, report_over_ms=50, on_stall=lambda _ms: cpu_at_stall.append(gauge.last_cpu_ms))
    task = asyncio.create_task(gauge.run())
    try:
        await asyncio.sleep(0.02)
        spin_until = time.thread_time() + 0.15
        while time.thread_time() < spin_until:  # busy on the loop's thread
            pass
        await _until(lambda: bool(cpu_at_stall))
        assert cpu_at_stall[0] >= 100
    finally:
        await cancel_all([task])
