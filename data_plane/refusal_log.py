"""RefusalLog: what a listener refused, counted by reason and logged without letting a flood
flood the log.

Every refusal adds one to ``counts[reason]`` and is logged as one warning line (the caller's
message: the source address and why — never a token, signature or secret), at most ``burst``
lines a reason every ``window_s``; the first refusal of a reason after a window with more prints
one line counting the ones left out. Name servers, remoting listeners, the HA link and the
broker's authorization share it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Final

LOG_WINDOW_S: Final = 10.0
LOG_BURST: Final = 20


class RefusalLog:
    __slots__ = ("_clock", "_windows", "burst", "counts", "logger", "what", "window_s")

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        counts: Counter[str] | None = None,
        window_s: float = LOG_WINDOW_S,
        burst: int = LOG_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``what``: the refused thing in the summary line ("connections closed", "requests
        refused"); ``counts``: a counter to add to (a new one when None)."""
        self.logger = logger
        self.what = what
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self.window_s = window_s
        self.burst = burst
        self._clock = clock
        self._windows: dict[str, tuple[float, int]] = {}

    def __call__(self, reason: str, message: str, *args: object) -> None:
        """Count one refusal of ``reason`` and log ``message % args`` unless over the burst."""
        self.counts[reason] += 1
        now = self._clock()
        start, lines = self._windows.get(reason, (now, 0))
        if now - start >= self.window_s:
            if lines > self.burst:
                self.logger.warning(
                    "… %d more %s (%s) in the last %.0f s", lines - self.burst, self.what, reason, now - start
                )
            start, lines = now, 0
        lines += 1
        self._windows[reason] = (start, lines)
        if lines <= self.burst:
            self.logger.warning(message, *args)
