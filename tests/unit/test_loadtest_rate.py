"""Open-loop rate control: the schedule of intended send times, bursts, and how the walker hands
out due times after a stall (every one of them, unshifted — no coordinated omission)."""

from __future__ import annotations

import itertools
import random

import pytest

from loadtest.rate import OpenLoop, RateProfile

pytestmark = pytest.mark.unit


def test_a_steady_schedule_is_evenly_spaced_at_the_rate() -> None:
    p = RateProfile.steady(msgs_per_s=200, duration_s=3)
    offsets = list(p.offsets_s())
    assert len(offsets) == p.count() == 600
    assert offsets[0] == 0.0
    gaps = {round(b - a, 9) for a, b in itertools.pairwise(offsets)}
    assert gaps == {0.005}
    assert offsets[-1] < 3.0


def test_a_burst_sends_factor_times_the_rate_for_its_duration() -> None:
    p = RateProfile.steady(msgs_per_s=100, duration_s=30, burst_at_s=10, burst_duration_s=10, burst_factor=10)
    offsets = list(p.offsets_s())
    per_window = [sum(1 for t in offsets if lo <= t < lo + 10) for lo in (0, 10, 20)]
    assert per_window == [1000, 10_000, 1000]
    assert p.rate_at(15) == 1000
    assert p.rate_at(5) == p.rate_at(25) == 100
    assert p.count() == len(offsets) == 12_000
    assert offsets == sorted(offsets)


def test_a_burst_past_the_end_is_clipped() -> None:
    p = RateProfile.steady(msgs_per_s=10, duration_s=5, burst_at_s=4, burst_duration_s=10, burst_factor=2)
    assert [(s.start_s, s.end_s, s.msgs_per_s) for s in p.segments] == [(0.0, 4.0, 10.0), (4.0, 5.0, 20.0)]
    assert p.count() == 60


def test_shares_of_a_profile_add_up_to_it() -> None:
    whole = RateProfile.steady(msgs_per_s=900, duration_s=2)
    parts = [whole.scaled(1 / 3) for _ in range(3)]
    assert sum(p.count() for p in parts) == whole.count()


@pytest.mark.parametrize("bad", [{"msgs_per_s": 0, "duration_s": 1}, {"msgs_per_s": 5, "duration_s": 0}])
def test_a_profile_needs_a_rate_and_a_duration(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        RateProfile.steady(**bad)


def test_the_walker_hands_out_each_intended_time_once_when_due() -> None:
    loop = OpenLoop(RateProfile.steady(msgs_per_s=10, duration_s=1), start_s=100.0)
    assert loop.next_at() == 100.0
    assert loop.due(99.99) == []
    assert loop.due(100.0) == [100.0]
    assert loop.next_at() == pytest.approx(100.1)
    assert loop.due(100.25) == pytest.approx([100.1, 100.2])
    assert loop.handed_out == 3


def test_after_a_stall_every_overdue_send_comes_out_with_its_original_time(seed: int) -> None:
    """The generator was held up (a GC pause, a stalled broker): when it wakes, all the sends that
    were due are handed out at once, each with the time it was *meant* to go — so their latency
    includes the stall instead of it vanishing from the measurements."""
    rng = random.Random(seed)
    rate, duration = 1000, 2.0
    loop = OpenLoop(RateProfile.steady(msgs_per_s=rate, duration_s=duration), start_s=0.0)
    now, got = 0.0, []
    while (nxt := loop.next_at()) is not None:
        now = max(now, nxt) + (rng.uniform(0.05, 0.3) if rng.random() < 0.01 else 0.0)  # occasional stalls
        got.extend(loop.due(now))
    assert got == pytest.approx([i / rate for i in range(int(rate * duration))])
    assert loop.handed_out == len(got) == 2000
    assert loop.due(1e9) == []
    assert loop.next_at() is None


def test_the_walker_honours_a_limit_and_keeps_the_rest_due() -> None:
    loop = OpenLoop(RateProfile.steady(msgs_per_s=100, duration_s=1), start_s=0.0)
    first = loop.due(0.5, limit=10)
    assert len(first) == 10
    rest = loop.due(0.5)
    assert first + rest == pytest.approx([i / 100 for i in range(51)])
