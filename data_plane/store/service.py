"""ServiceThread: the store's background loops (flush, reserve-ahead) share this shape.

A service whose work may wait (``background = True``: the asynchronous CommitLog flush, the
ConsumeQueue and IndexFile flush, reserve-ahead) runs at nice ``BACKGROUND_NICE`` — on Linux a
thread's own nice value — so that the broker's event loop, woken by a request, gets the core
from them sooner. Their slices are long: an ``fdatasync`` of half a second's writes spends 2-3
ms of CPU queueing the pages for the disk, and `perf sched` showed the event loop runnable and
waiting that long behind them a few times a 10 s phase. At nice 10 it still does, 0-3 times a
phase (kernel work with no preemption point keeps the core whatever the nice value): the gain
measured is small (docs/broker.md, "Background threads at a lower priority"). The group commit
(SYNC_FLUSH, whose ``fdatasync`` an acknowledgement waits for) keeps the normal priority.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

log = logging.getLogger(__name__)

BACKGROUND_NICE = 10


def lower_thread_priority(nice: int) -> bool:
    """Give the calling thread the nice value ``nice`` (Linux keeps one per thread); False
    where that is not possible."""
    if not hasattr(os, "setpriority"):
        return False
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # 0: the calling thread on Linux
        return True
    return False


def lower_to_idle_priority() -> bool:
    """Run the calling thread at ``SCHED_IDLE`` (Linux); False where that is not possible."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
        return True
    return False


class ServiceThread:
    """A named daemon thread with a stop flag and a wake-up event."""

    name = "orbit-service"
    background = False  # runs at BACKGROUND_NICE (the module docstring)

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_safely, name=self.name, daemon=True)
        self._thread.start()

    def wait_for_running(self, interval_s: float) -> bool:
        """Sleep up to ``interval_s`` or until woken; False once stopping."""
        self._wakeup.wait(interval_s)
        self._wakeup.clear()
        return not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run_safely(self) -> None:
        if self.background and not lower_thread_priority(BACKGROUND_NICE):
            log.info("%s runs at normal priority (no per-thread nice here)", self.name)
        try:
            self.run()
        except Exception:  # a service thread must say why it died
            log.exception("%s stopped on an error", self.name)

    def run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
