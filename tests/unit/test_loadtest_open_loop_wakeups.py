"""The open-loop generator, on the event loop the load generators run (uvloop): a fast one (sends
less than 1 ms apart) wakes once a millisecond and sends what is due — uvloop's timers count whole
milliseconds, so a shorter sleep would come back at once and spin the loop — and a slow one wakes
for each send; neither skips or shifts an intended time."""

from __future__ import annotations

import itertools
import time
from typing import Any

from loadtest.workers import ProducerJob, _open_loop, _run


def _job(sends_per_s: float, seconds: float) -> ProducerJob:
    return ProducerJob(
        index=0, tenant=None, spec={}, topics=["t"], message_bytes=(16, 16), batch=1, connections=1, in_flight=1,
        ordered=False, keys=1, segments=((0.0, seconds, sends_per_s),), warmup_s=0.0, duration_s=seconds, seed=1,
    )  # fmt: skip


def _generate(sends_per_s: float, seconds: float) -> tuple[list[tuple[float, float]], float]:
    """(intended, started) of every send, in the order they started, and the CPU share used."""
    started: list[tuple[float, float]] = []

    async def send_one(client: Any, intended: float) -> None:
        started.append((intended, time.time()))

    async def go() -> None:
        totals = {"sends": 0, "dropped": 0}
        await _open_loop(_job(sends_per_s, seconds), time.time() + 0.05, [object()], send_one, totals)
        assert totals["dropped"] == 0

    cpu, wall = time.process_time(), time.perf_counter()
    _run(go())
    return started, (time.process_time() - cpu) / (time.perf_counter() - wall)


def _wakeups(started: list[tuple[float, float]]) -> int:
    """Runs of sends that started together (within 0.2 ms of the previous one)."""
    times = sorted(t for _, t in started)
    return 1 + sum(1 for a, b in itertools.pairwise(times) if b - a > 0.0002)


def test_a_fast_generator_wakes_once_a_millisecond_and_hands_out_every_intended_time() -> None:
    started, cpu_share = _generate(4000.0, 0.5)
    intended = [i for i, _ in started]
    assert len(intended) == 2000
    assert intended == sorted(intended)
    assert all(b - a > 0.0002 for a, b in itertools.pairwise(intended))  # evenly spaced, unshifted
    assert all(s >= i for i, s in started)  # none before its time
    assert _wakeups(started) <= 1000  # ~500 a wake-up a millisecond; 2,000 woken one by one
    assert cpu_share < 0.3, f"the generator used {cpu_share:.0%} of a core"  # a spinning loop: ~100 %


def test_a_slow_generator_still_wakes_for_each_send() -> None:
    started, _ = _generate(500.0, 0.4)
    assert len(started) == 200
    assert _wakeups(started) >= 150  # 2 ms apart: each send on its own wake-up (a few may bunch on a slow machine)
