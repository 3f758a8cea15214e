"""LoopStallGauge: how late an event loop runs what is due, measured from inside the loop.

A task sleeps ``period_ms`` (20 ms) at a time and takes how late each wake-up came as a stall of
the loop — whatever kept it from running its callbacks: Python work on the loop, a blocking call,
the GIL held by another thread, the process paused. It keeps the largest stall since it started
(``max_ms``) and the number of stalls over ``STALL_LIMIT_MS`` (100 ms, ``over_limit``), which a
broker reports as ``loopStallMaxMs`` and ``loopStallsOver100ms`` in GET_BROKER_RUNTIME_INFO, and
hands each stall over ``report_over_ms`` to ``on_stall`` (the broker logs them). A stall shorter
than the period may go unseen when it falls between two wake-ups; one longer than the period
never does. The cost is one timer every 20 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

STALL_LIMIT_MS = 100.0  # the stalls counted (``loopStallsOver100ms``): a loop that misses heartbeats
PERIOD_MS = 20.0


class LoopStallGauge:
    def __init__(
        self,
        *,
        period_ms: float = PERIOD_MS,
        report_over_ms: float = STALL_LIMIT_MS,
        on_stall: Callable[[float], object] | None = None,
    ) -> None:
        if period_ms <= 0:
            raise ValueError("period_ms must be > 0")
        self.period_ms = period_ms
        self.report_over_ms = report_over_ms
        self.on_stall = on_stall  # given each stall over report_over_ms (how late, in ms) once it is over
        self.max_ms = 0.0
        self.over_limit = 0
        # The loop thread's CPU time between the last two wake-ups: near the stall when the loop
        # was busy running something, near 0 when it waited (a blocking call, the GIL, no CPU).
        self.last_cpu_ms = 0.0

    async def run(self) -> None:
        """Measure until cancelled (a task on the loop measured)."""
        loop = asyncio.get_running_loop()
        period_s = self.period_ms / 1000
        while True:
            due, cpu = loop.time() + period_s, time.thread_time()
            await asyncio.sleep(period_s)
            self.last_cpu_ms = (time.thread_time() - cpu) * 1000
            self.record((loop.time() - due) * 1000)

    def record(self, late_ms: float) -> None:
        """One wake-up that came ``late_ms`` after it was due."""
        self.max_ms = max(self.max_ms, late_ms)
        if late_ms > STALL_LIMIT_MS:
            self.over_limit += 1
        if self.on_stall is not None and late_ms > self.report_over_ms:
            self.on_stall(late_ms)

    def runtime_info(self) -> dict[str, int]:
        return {"loopStallMaxMs": round(self.max_ms), "loopStallsOver100ms": self.over_limit}
