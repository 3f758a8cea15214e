"""StallWatch: what the broker's event loop is doing while it is stalled.

The loop-stall gauge (``data_plane.loop_stall``) measures a stall once it is over; this tells
where the loop thread was during one. The loop marks a beat every ``period_s`` (a
``call_later`` chain; each beat carries the loop thread's CPU time); a daemon thread wakes as
often and, when the next beat is ``threshold_ms`` late, takes the loop thread's Python stack
(``sys._current_frames``) — at most ``MAX_STACKS`` times a stall, at the threshold and then
each time the stall has doubled. When the loop beats again the stall is logged once, with the
stacks and the loop thread's CPU time over it (its own thread clock):

* CPU ≈ the stall: the loop was working — Python code or a C call that kept the GIL (such a
  call shows at the line that made it, as the stack can only be taken when the GIL is free);
* CPU ≪ the stall: the loop was waiting — for the GIL (another thread of the broker held it),
  for a core, for the disk in a page fault, or the whole process (or the machine) was paused.

The watch costs a callback and a thread wake-up every ``period_s`` (``threshold_ms / 5``, at
least 2 ms). ``reports`` keeps the last ``MAX_REPORTS``; ``runtime_info`` gives the count and
the latest stall's length and innermost frame to GET_BROKER_RUNTIME_INFO.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAX_STACKS = 3  # stacks taken in one stall
MAX_REPORTS = 16  # stalls remembered
STACK_FRAMES = 12  # innermost frames kept of each stack


@dataclass(slots=True)
class StallReport:
    started: float  # time.monotonic() of the last beat before the stall
    duration_ms: float = 0.0  # how late the next beat came
    window_ms: float = 0.0  # from the beat before the stall to the one after it
    loop_cpu_ms: float = 0.0  # the loop thread's CPU time over that window
    stacks: list[tuple[float, list[str]]] = field(default_factory=list)  # (ms into the stall, frames)

    @property
    def innermost(self) -> str:
        """The first stack's innermost frame, ``file:line in function``."""
        if not self.stacks or not self.stacks[0][1]:
            return ""
        return self.stacks[0][1][-1].strip().splitlines()[0]

    def describe(self) -> str:
        what = "working" if self.loop_cpu_ms >= 0.5 * self.duration_ms else "waiting"
        parts = [
            f"event loop stalled for {self.duration_ms:.0f} ms, its thread mostly {what}"
            f" ({self.loop_cpu_ms:.0f} ms of CPU in the {self.window_ms:.0f} ms between its beats)"
        ]
        for at_ms, frames in self.stacks:
            parts.append(f"-- {at_ms:.0f} ms in, the loop thread was at:\n{''.join(frames).rstrip()}")
        return "\n".join(parts)


class StallWatch:
    def __init__(self, threshold_ms: float) -> None:
        if threshold_ms <= 0:
            raise ValueError("threshold_ms must be > 0")
        self.threshold_s = threshold_ms / 1000
        self.period_s = max(self.threshold_s / 5, 0.002)
        self.reports: deque[StallReport] = deque(maxlen=MAX_REPORTS)
        self.count = 0
        self.beat = (time.monotonic(), 0.0)  # the loop thread's last beat: (monotonic, its CPU time)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._ident = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin watching ``loop``; call on the loop's own thread."""
        if self._thread is not None:
            return
        self._loop = loop
        self._ident = threading.get_ident()
        self.beat = (time.monotonic(), time.thread_time())
        self._handle = loop.call_later(self.period_s, self._tick)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="orbit-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _tick(self) -> None:
        self.beat = (time.monotonic(), time.thread_time())  # (one object: the watch reads it whole)
        if self._loop is not None and not self._stop.is_set():
            self._handle = self._loop.call_later(self.period_s, self._tick)

    def _run(self) -> None:
        current: StallReport | None = None
        before: tuple[float, float] = self.beat
        next_stack_s = self.threshold_s
        while not self._stop.wait(self.period_s):
            beat = self.beat
            if current is not None and beat is not before:  # the loop beat again: it is over
                self._finish(current, before, beat)
                current = None
            before = beat
            late_s = time.monotonic() - beat[0] - self.period_s
            if late_s < self.threshold_s:
                continue
            if current is None:
                current = StallReport(started=beat[0])
                next_stack_s = self.threshold_s
            if late_s >= next_stack_s and len(current.stacks) < MAX_STACKS:
                current.stacks.append((late_s * 1000, self._loop_stack()))
                next_stack_s *= 2

    def _loop_stack(self) -> list[str]:
        """The loop thread's innermost frames, outermost first. Names and line numbers are taken
        first, with the GIL held throughout (the loop thread cannot move meanwhile); the source
        lines are read afterwards — reading them is file I/O, which lets the loop thread run
        and would otherwise mix frames of different moments."""
        frame = sys._current_frames().get(self._ident)
        if frame is None:
            return []
        summary = traceback.StackSummary.extract(traceback.walk_stack(frame), limit=STACK_FRAMES, lookup_lines=False)
        summary.reverse()
        return summary.format()

    def _finish(self, report: StallReport, before: tuple[float, float], after: tuple[float, float]) -> None:
        report.window_ms = (after[0] - before[0]) * 1000
        report.duration_ms = report.window_ms - self.period_s * 1000
        report.loop_cpu_ms = (after[1] - before[1]) * 1000
        self.reports.append(report)
        self.count += 1
        log.warning("%s", report.describe())

    def covers(self, stall_ms: float) -> bool:
        """Whether a stall this long is surely reported here (the watch sees a stall from the
        threshold plus up to two beat periods on): the broker's loop-stall gauge leaves those to it
        instead of logging them a second time."""
        return stall_ms >= (self.threshold_s + 2 * self.period_s) * 1000

    def runtime_info(self) -> dict[str, Any]:
        last = self.reports[-1] if self.reports else None
        return {
            "loopStalls": self.count,
            "lastLoopStallMs": round(last.duration_ms) if last else 0,
            "lastLoopStallAt": last.innermost if last else "",
        }
