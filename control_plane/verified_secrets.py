"""VerifiedSecrets: logins whose secret was already checked, so a burst of them costs one scrypt.

A credential's secret is stored as a slow scrypt hash (``secret_hash``): tens of milliseconds of
CPU a check, on purpose. A client that opens many connections, or many clients sharing one
credential, log in with the same secret many times at once — 500 logins are 25 s of CPU taken
from every other tenant's logins and from the API. So the token endpoint remembers, for
``ttl_s``, that a secret matched a stored hash, and concurrent checks of the same pair share
one computation:

    fingerprint = HMAC-SHA256(a key made at start and never stored, stored hash ‖ 0 ‖ secret)
    check(secret, stored) ─▶ fingerprint remembered and fresh ─▶ True, no scrypt
                          └▶ a check of the same pair running ─▶ its answer
                          └▶ scrypt (in a thread); a match is remembered

Only matches are remembered: every wrong secret still costs a full check (and the login limiter
slows its source). The fingerprint covers the stored hash, so a rotated secret never matches an
old entry; a revoked credential is refused by its row before any check. What is kept is a keyed
hash, useless without the process's key, at most ``max_entries`` of them (oldest dropped first).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Callable

from control_plane import secret_hash


class VerifiedSecrets:
    def __init__(
        self, *, ttl_s: float = 300.0, max_entries: int = 10_000, clock_s: Callable[[], float] = time.monotonic
    ) -> None:
        self._key = os.urandom(32)
        self._ttl_s = ttl_s
        self._max = max_entries
        self._clock = clock_s
        self._matched: OrderedDict[bytes, float] = OrderedDict()  # fingerprint -> when it expires
        self._running: dict[bytes, asyncio.Future[bool]] = {}
        self.computed = 0  # scrypt checks made

    def _fingerprint(self, secret: str, stored: str) -> bytes:
        return hmac.new(self._key, stored.encode() + b"\0" + secret.encode(), hashlib.sha256).digest()

    async def check(self, secret: str, stored: str) -> bool:
        """Whether ``secret`` matches the ``stored`` hash."""
        fp = self._fingerprint(secret, stored)
        expires = self._matched.get(fp)
        if expires is not None:
            if expires > self._clock():
                return True
            del self._matched[fp]
        running = self._running.get(fp)
        if running is None:
            running = asyncio.ensure_future(self._compute(fp, secret, stored))
            self._running[fp] = running
        return await asyncio.shield(running)

    async def _compute(self, fp: bytes, secret: str, stored: str) -> bool:
        try:
            self.computed += 1
            ok = await asyncio.to_thread(secret_hash.verify_secret, secret, stored)
            if ok:
                self._matched[fp] = self._clock() + self._ttl_s
                while len(self._matched) > self._max:
                    self._matched.popitem(last=False)
            return ok
        finally:
            self._running.pop(fp, None)
