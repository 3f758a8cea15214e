"""Pacer: a client's sends to a broker that said its tenant is over quota, spaced to the quota.

A broker answers a send over its tenant's publish quota with FLOW_CONTROL (215), a retry-after
and the tenant's rate on that broker (``quota-msgs-per-s``, data_plane/tenancy/quota.py). Waiting
the retry-after per send is not enough: every concurrent send is refused once, waits, and comes
back with the others — the broker reads, checks and refuses most of a flood. The pacer instead
holds back what the client would send beyond the quota, in the client:

    refused (retry-after w, rate r) ─▶ the broker's pace: first slot now + w (+ jitter), then one
                                       slot every 1/(0.97 r) s per message (a little under the
                                       quota, so the tenant's bucket refills rather than hovers
                                       at empty, where any late wake-up is refused)
    every send to that broker       ─▶ takes the next slot and waits for it; a slot past the
                                       send's deadline fails it at once (FlowControlError), with
                                       nothing sent
    refused again while paced       ─▶ the pace drops by a quarter (another client of the tenant
                                       shares the quota) — once for the sends made before the last
                                       change, which were all on their way under the old pace;
                                       each send granted while paced wins back 1/32 of r
    a second with no send waiting   ─▶ the pace is dropped: sends go at once again

The jitter (up to a tenth of the retry-after) keeps the clients a broker refused together from
coming back together. The client instances of one process that use one credential share a pacer
(``shared_pacer``): a process holding many connections for a tenant paces them together, to the
tenant's rate, instead of each to the whole rate. Meant for one event loop at a time.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass
from typing import Final

IDLE_S: Final = 1.0  # a pace whose slots have fallen this far behind is dropped
HEADROOM: Final = 0.97  # of the broker's rate: the pace at most
DECREASE: Final = 0.75  # the pace, times this, when a send made under it is refused
MIN_SHARE: Final = 1 / 16  # the pace never goes below this share of the broker's rate
RECOVER: Final = 1 / 32  # of the broker's rate, won back by each send granted while paced
JITTER: Final = 0.1  # of the retry-after, at most, added to the first slot
DEFAULT_RATE: Final = 100.0  # msgs/s, when the broker's answer names no rate


@dataclass(slots=True)
class Pace:
    rate: float  # msgs/s this client sends to the broker now
    quota: float  # the tenant's rate on the broker, as it said
    next_slot: float  # loop time of the next free slot
    changed: float  # loop time the pace was set or last lowered


class Pacer:
    __slots__ = ("__weakref__", "_paces", "_rng", "refusals", "waits")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._paces: dict[str, Pace] = {}
        self._rng = rng or random.Random()
        self.refusals = 0  # FLOW_CONTROL answers seen
        self.waits = 0  # sends that waited for a slot

    def paced(self, addr: str) -> bool:
        return addr in self._paces

    def refused(
        self, addr: str, now: float, retry_after_ms: int, quota_msgs_per_s: float | None, sent: float | None = None
    ) -> None:
        """A send to ``addr``, made at loop time ``sent`` (None: now), was refused for the
        tenant's quota."""
        self.refusals += 1
        quota = quota_msgs_per_s if quota_msgs_per_s and quota_msgs_per_s > 0 else DEFAULT_RATE
        first = now + retry_after_ms / 1000 * (1 + JITTER * self._rng.random())
        pace = self._paces.get(addr)
        if pace is None:
            self._paces[addr] = Pace(quota * HEADROOM, quota, first, now)
            return
        pace.quota = quota
        if (now if sent is None else sent) > pace.changed:
            pace.rate = max(pace.rate * DECREASE, quota * MIN_SHARE)
            pace.changed = now
        pace.rate = min(pace.rate, quota * HEADROOM)
        pace.next_slot = max(pace.next_slot, first)

    def granted(self, addr: str) -> None:
        """A send to ``addr`` was taken while paced."""
        pace = self._paces.get(addr)
        if pace is not None and pace.rate < pace.quota * HEADROOM:
            pace.rate = min(pace.quota * HEADROOM, pace.rate + pace.quota * RECOVER)

    def slot(self, addr: str, now: float, deadline: float, msgs: int = 1) -> float | None:
        """Seconds until a send of ``msgs`` messages to ``addr`` may go (0.0: at once), the slot
        then taken; None, nothing taken, when that is after ``deadline``. Past ``IDLE_S``
        without a send waiting, the pace is dropped."""
        pace = self._paces.get(addr)
        if pace is None:
            return 0.0
        at = pace.next_slot
        if at < now - IDLE_S:
            del self._paces[addr]
            return 0.0
        at = max(at, now)
        if at > deadline:
            return None
        pace.next_slot = at + msgs / pace.rate
        if at > now:
            self.waits += 1
        return at - now


_SHARED: weakref.WeakValueDictionary[str, Pacer] = weakref.WeakValueDictionary()


def shared_pacer(credential: str | None) -> Pacer:
    """The pacer of the process's clients that use ``credential`` (an access key or OAuth client
    id); a pacer of its own when None (no credential: no tenant to pace)."""
    if credential is None:
        return Pacer()
    pacer = _SHARED.get(credential)
    if pacer is None:
        pacer = _SHARED[credential] = Pacer()
    return pacer
