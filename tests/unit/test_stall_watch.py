"""StallWatch: a stalled event loop is reported with where its thread was and whether it worked."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from data_plane.broker.config import BrokerConfig, ConfigError
from data_plane.broker.stall_watch import StallWatch


def spin_in_python(seconds: float) -> int:
    """Python code that keeps the loop thread busy (and hands the GIL over as it runs)."""
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
    return n


def busy_callback(seconds: float) -> None:
    spin_in_python(seconds)


def sleep_off_cpu(seconds: float) -> None:
    """A loop thread that blocks without using CPU (the GIL released)."""
    time.sleep(seconds)


async def run_with(watch: StallWatch, stall: object, seconds: float) -> None:
    """Run the loop 0.2 s, call ``stall(seconds)`` from a callback, run 0.2 s more (the watch
    thread, waking every few ms, reports a stall at its first wake-up after the next beat)."""
    watch.start(asyncio.get_running_loop())
    try:
        await asyncio.sleep(0.2)
        if stall is not None:
            asyncio.get_running_loop().call_soon(stall, seconds)  # type: ignore[arg-type]
        await asyncio.sleep(0.2 + seconds)
    finally:
        watch.stop()


@pytest.mark.timing  # the loop's CPU share of the stall: a busy machine starves it
def test_a_busy_loop_is_reported_with_its_stack_and_as_working(caplog: pytest.LogCaptureFixture) -> None:
    watch = StallWatch(threshold_ms=50)
    with caplog.at_level(logging.WARNING, logger="data_plane.broker.stall_watch"):
        asyncio.run(run_with(watch, busy_callback, 0.4))
    assert watch.count == 1, [r.describe() for r in watch.reports]
    (report,) = watch.reports
    assert 300 <= report.duration_ms <= 1000
    assert report.loop_cpu_ms >= 0.5 * report.duration_ms  # its own CPU: it was working
    assert 1 <= len(report.stacks) <= 3
    for _at, frames in report.stacks:  # outermost first: the callback, then what it called
        names = [f.strip().split(", in ")[-1].split()[0] for f in frames]
        assert names[-2:] == ["busy_callback", "spin_in_python"], frames
    assert "spin_in_python" in report.innermost
    assert [at for at, _ in report.stacks] == sorted(at for at, _ in report.stacks)
    assert report.stacks[0][0] >= 50
    text = caplog.text
    assert "event loop stalled for" in text
    assert "mostly working" in text
    assert "spin_in_python" in text
    # the broker's lag watcher leaves a stall this long to the watch's report, not a shorter one
    assert watch.covers(report.duration_ms)
    assert not watch.covers(30)
    info = watch.runtime_info()
    assert info["loopStalls"] == 1
    assert info["lastLoopStallMs"] == round(report.duration_ms)
    assert "spin_in_python" in info["lastLoopStallAt"]


def test_a_loop_blocked_off_cpu_is_reported_as_waiting() -> None:
    watch = StallWatch(threshold_ms=50)
    asyncio.run(run_with(watch, sleep_off_cpu, 0.4))
    assert watch.count == 1, [r.describe() for r in watch.reports]
    (report,) = watch.reports
    assert 300 <= report.duration_ms <= 1000
    assert report.loop_cpu_ms < 0.25 * report.duration_ms
    assert "sleep_off_cpu" in report.innermost
    assert "mostly waiting" in report.describe()


def test_a_loop_that_keeps_beating_reports_nothing() -> None:
    watch = StallWatch(threshold_ms=100)
    asyncio.run(run_with(watch, spin_in_python, 0.02))  # a 20 ms callback: under the threshold
    assert watch.count == 0, [r.describe() for r in watch.reports]
    assert watch.runtime_info() == {"loopStalls": 0, "lastLoopStallMs": 0, "lastLoopStallAt": ""}


def test_stop_ends_the_watch_thread_and_the_beats() -> None:
    watch = StallWatch(threshold_ms=50)

    async def main() -> None:
        watch.start(asyncio.get_running_loop())
        thread = watch._thread
        assert thread is not None
        assert thread.is_alive()
        await asyncio.sleep(0.05)
        watch.stop()
        assert not thread.is_alive()
        beat = watch.beat
        await asyncio.sleep(0.05)
        assert watch.beat is beat  # no more beats after stop

    asyncio.run(main())


def test_threshold_is_checked() -> None:
    with pytest.raises(ValueError, match="threshold_ms"):
        StallWatch(threshold_ms=0)
    assert BrokerConfig(loop_stall_watch_ms=0).validate().loop_stall_watch_ms == 0
    with pytest.raises(ConfigError, match="loop_stall_watch_ms"):
        BrokerConfig(loop_stall_watch_ms=5).validate()
