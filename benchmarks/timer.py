"""Per-tick cost of the timer wheel with few and with many pending timers.

    python -m benchmarks.timer [--pending 1000 100000] [--due-per-second 100] [--seconds 50]

For each pending count: a real MessageStore and Schedule in a temporary directory, a manual
clock; ``pending`` timed messages due over the next 7 days (never during the measurement) and
``due-per-second`` messages due in each of the measured seconds are stored and indexed; then
one tick per second is timed (each fires one slot: ``due-per-second`` re-puts), and as many
ticks between seconds (nothing due). Prints JSON: median and p99 microseconds per tick, and per
delivered message. A timing wheel's figures do not move with ``pending``; a scan's would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from typing import Any

from data_plane.broker.config import BrokerConfig
from data_plane.broker.schedule import Schedule
from data_plane.store import Message, MessageStore, StoreConfig

T0 = 1_700_000_000_000


class _Clock:
    def __init__(self) -> None:
        self.now_ms = T0

    def __call__(self) -> int:
        return self.now_ms


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _run_one(pending: int, due_per_second: int, seconds: int, seed: int) -> dict[str, Any]:
    rnd = random.Random(seed)
    clock = _Clock()
    with tempfile.TemporaryDirectory(prefix="orbit-timer-bench-") as d:
        store = MessageStore(
            StoreConfig(
                store_path=f"{d}/store",
                commit_log_file_size_bytes=256 << 20,
                preallocate_next_file=False,
                reserve_ahead_bytes=0,
                index_hash_slots=1 << 16,
                index_max_entries=1 << 20,
            ),
            clock_ms=clock,
        )
        store.start()
        cfg = BrokerConfig(store_dir=d, schedule_tick_ms=3_600_000, schedule_checkpoint_interval_ms=3_600_000)
        schedule = Schedule(cfg, clock_ms=clock)
        await schedule.start(store, None)
        body = b"x" * 256
        start_s = T0 // 1000 + 10
        week_ms = 7 * 86_400_000 - 60_000
        for i in range(pending):  # due after the measured seconds
            at = T0 + (seconds + 20) * 1000 + rnd.randrange(week_ms - (seconds + 20) * 1000)
            msgs = [Message(f"Bench{i % 8}", body, i % 4, properties={"TIMER_DELIVER_MS": str(at)})]
            schedule.redirect(msgs)
            store.entry.append(msgs)
        for s in range(seconds):
            for k in range(due_per_second):
                at = (start_s + s) * 1000 - rnd.randrange(1000)
                msgs = [Message("BenchDue", body, k % 4, properties={"TIMER_DELIVER_MS": str(at)})]
                schedule.redirect(msgs)
                store.entry.append(msgs)
        while schedule.tick() > 0:  # index everything before measuring
            pass
        assert schedule.timers is not None
        assert schedule.timers.pending() == pending + seconds * due_per_second
        firing: list[float] = []
        idle: list[float] = []
        for s in range(seconds):
            clock.now_ms = (start_s + s) * 1000
            t = time.perf_counter()
            n = schedule.tick()
            firing.append(time.perf_counter() - t)
            assert n == due_per_second, n
            clock.now_ms += 500
            t = time.perf_counter()
            schedule.tick()
            idle.append(time.perf_counter() - t)
        left = schedule.timers.pending()
        await schedule.stop()
        store.shutdown()
    return {
        "pending_timers": pending,
        "pending_after": left,
        "due_per_tick": due_per_second,
        "ticks": seconds,
        "firing_tick_us_median": round(statistics.median(firing) * 1e6, 1),
        "firing_tick_us_p99": round(_percentile(firing, 0.99) * 1e6, 1),
        "us_per_delivered_message": round(statistics.median(firing) * 1e6 / max(1, due_per_second), 2),
        "idle_tick_us_median": round(statistics.median(idle) * 1e6, 1),
        "idle_tick_us_p99": round(_percentile(idle, 0.99) * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.timer", description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, nargs="+", default=[1_000, 100_000])
    ap.add_argument("--due-per-second", type=int, default=100)
    ap.add_argument("--seconds", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    out = [
        asyncio.run(_run_one(p, args.due_per_second, args.seconds, args.seed + i)) for i, p in enumerate(args.pending)
    ]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
