"""The console's consume rate: committed offsets between two looks, on an injected clock."""

from __future__ import annotations

import pytest

from control_plane.console.rates import MAX_AGE_S, MAX_ENTRIES, ConsumeRates, Rate

pytestmark = pytest.mark.unit
KEY = ("acme", "billing", "orders")


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_the_rate_is_the_committed_messages_between_two_looks_per_second() -> None:
    clock = Clock()
    rates = ConsumeRates(clock_s=clock)
    assert rates.observe(KEY, 100) is None  # a first look measures nothing
    clock.now_s += 4
    assert rates.observe(KEY, 300) == Rate(50.0, 4.0)
    clock.now_s += 2
    assert rates.observe(KEY, 300) == Rate(0.0, 2.0)


def test_a_stale_or_reset_reading_gives_no_rate() -> None:
    clock = Clock()
    rates = ConsumeRates(clock_s=clock)
    rates.observe(KEY, 100)
    clock.now_s += MAX_AGE_S + 1
    assert rates.observe(KEY, 200) is None
    clock.now_s += 1
    assert rates.observe(KEY, 50) is None  # offsets reset back


def test_it_keeps_at_most_max_entries_groups_dropping_the_oldest() -> None:
    clock = Clock()
    rates = ConsumeRates(clock_s=clock)
    for i in range(MAX_ENTRIES + 1):
        rates.observe(("t", f"g{i}", "topic"), 0)
    clock.now_s += 1
    assert rates.observe(("t", "g0", "topic"), 5) is None  # dropped
    assert rates.observe(("t", f"g{MAX_ENTRIES}", "topic"), 5) == Rate(5.0, 1.0)
