"""The console's consume rate and recent lag: looks at a group's lag, on injected clocks."""

from __future__ import annotations

import datetime as dt

import pytest

from control_plane.console.lag_history import MAX_AGE_S, MAX_ENTRIES, MAX_SAMPLES, LagHistory, Rate

pytestmark = pytest.mark.unit
KEY = ("acme", "billing", "orders")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def wall(self) -> dt.datetime:
        return T0 + dt.timedelta(seconds=self.now_s)


def history(clock: Clock) -> LagHistory:
    return LagHistory(clock_s=clock, wall=clock.wall)


def test_the_rate_is_the_committed_messages_between_two_looks_per_second() -> None:
    clock = Clock()
    h = history(clock)
    rate, samples = h.observe(KEY, committed=100, lag=50)
    assert rate is None  # a first look measures nothing
    assert [s.lag for s in samples] == [50]
    clock.now_s += 4
    rate, samples = h.observe(KEY, committed=300, lag=10)
    assert rate == Rate(50.0, 4.0)
    assert [(s.wall, s.lag) for s in samples] == [(T0 + dt.timedelta(seconds=1000), 50),
                                                  (T0 + dt.timedelta(seconds=1004), 10)]  # fmt: skip
    clock.now_s += 2
    assert h.observe(KEY, committed=300, lag=0)[0] == Rate(0.0, 2.0)


def test_old_looks_and_reset_offsets_give_no_rate_and_leave_the_chart() -> None:
    clock = Clock()
    h = history(clock)
    h.observe(KEY, committed=100, lag=5)
    clock.now_s += MAX_AGE_S + 1
    rate, samples = h.observe(KEY, committed=200, lag=4)
    assert rate is None
    assert [s.lag for s in samples] == [4]
    clock.now_s += 1
    assert h.observe(KEY, committed=50, lag=9)[0] is None  # offsets reset back


def test_it_keeps_at_most_max_samples_looks_and_max_entries_groups() -> None:
    clock = Clock()
    h = history(clock)
    for i in range(MAX_SAMPLES + 5):
        clock.now_s += 0.5
        _rate, samples = h.observe(KEY, committed=i, lag=0)
    assert len(samples) == MAX_SAMPLES
    for i in range(MAX_ENTRIES + 1):
        h.observe(("t", f"g{i}", "topic"), committed=0, lag=0)
    clock.now_s += 1
    assert h.observe(KEY, committed=10_000, lag=0)[0] is None  # the least recently looked at went
    assert h.observe(("t", f"g{MAX_ENTRIES}", "topic"), committed=5, lag=0)[0] == Rate(5.0, 1.0)
