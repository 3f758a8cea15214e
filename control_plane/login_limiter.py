"""LoginLimiter: failed logins at ``POST /oauth/token`` slow the caller down, before any secret
is hashed.

Checking a secret costs a scrypt hash (tens of milliseconds of CPU, on purpose), so an endpoint
that hashes every guess is both a password-guessing oracle and a cheap way to burn the control
plane's CPU. Failures are counted per remote address and per client id over a sliding window;
past the limit the endpoint answers 429 with ``Retry-After`` at once, without hashing. A
successful login does not reset the count (a guesser who also holds one valid secret gains
nothing). Memory is bounded: at most ``max_keys`` addresses and ids are tracked, the oldest
dropped first.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable


class LoginLimiter:
    def __init__(
        self,
        *,
        max_failures_per_address: int = 10,
        max_failures_per_client: int = 20,
        window_s: float = 60.0,
        max_keys: int = 100_000,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = {"addr": max_failures_per_address, "client": max_failures_per_client}
        self.window_s = window_s
        self.max_keys = max_keys
        self._clock = clock_s
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()

    def _recent(self, key: tuple[str, str], now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def retry_after_s(self, address: str, client_id: str) -> int:
        """0 when a login attempt may go ahead, else the seconds to wait."""
        now = self._clock()
        wait = 0.0
        for kind, value in (("addr", address), ("client", client_id)):
            times = self._recent((kind, value), now)
            if times is not None and len(times) >= self.limits[kind]:
                wait = max(wait, times[0] + self.window_s - now)
        return math.ceil(wait) if wait > 0 else 0

    def failed(self, address: str, client_id: str) -> None:
        now = self._clock()
        for key in (("addr", address), ("client", client_id)):
            times = self._failures.get(key)
            if times is None:
                times = self._failures[key] = deque(maxlen=max(self.limits.values()))
            else:
                self._failures.move_to_end(key)
            times.append(now)
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)
