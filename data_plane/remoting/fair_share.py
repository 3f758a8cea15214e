"""Fair share of a server's event loop between tenants, when the loop is saturated.

A loop turn reads every readable connection and handles what each brought in, in the order the
sockets became readable: a tenant with many busy connections, or a burst on one, takes as much of
the turn as it sends, and another tenant's request read in the same turn waits behind all of it.

Here requests are handled as they are read while the turn is light: until the requests handled
in it have taken ``quantum_s`` of the loop. Past that, what connections read waits in a queue per
tenant, and a drain scheduled for the loop's next turn takes the waiting work tenant by tenant,
always from the tenant that has been served least (in seconds of the loop, divided by its
weight) since the loop last had nothing waiting, a few requests at a time, for at most
``slice_s`` before the loop polls its sockets again. A tenant sending little is therefore served
first, ahead of a tenant's burst, and tenants with equal weights get equal time while they all
have work. Once work is waiting, newly read requests wait too (in order, behind their
connection's and their tenant's), so the order is the drain's, not the sockets'.

What waits is bounded: a connection holding ``max_waiting_frames`` requests or
``max_waiting_bytes`` is not read until the drain has taken them (what its peer sends waits in the
socket buffers, as under a quota throttle), nor is any connection that adds to the wait while all
of them hold ``max_total_waiting_bytes``. A request that waits is copied out of the read it came
in, so what waits is what is counted. A tenant that starts waiting in a busy period starts from
the least any waiting tenant was served, not from nothing, and goes first among equals. A
connection whose peer ends it has its waiting requests handled at once (what was read is not
lost); one that is aborted drops them.

A turn whose requests take less than ``quantum_s``, which is every turn of a loop that is not
saturated, is unchanged: nothing waits. The cost is two clock reads per read of a connection and
one callback per turn that handled requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

DEFAULT_QUANTUM_S: Final = 0.0002  # requests handled as read in one turn, in seconds of the loop
DEFAULT_SLICE_S: Final = 0.0002  # waiting work a drain takes before the loop polls again
MAX_WAITING_FRAMES: Final = 512  # a connection holding this many is not read until they are taken
MAX_WAITING_BYTES: Final = 4 << 20  # ... or this many bytes
MAX_TOTAL_WAITING_BYTES: Final = 64 << 20  # all connections together: past it, each that adds is held
CHUNK: Final = 16  # requests a drain hands to a connection at a time


class Client(Protocol):
    """What a connection offers the scheduler (``Connection``)."""

    closed: bool
    waiting_frames: deque[Any]
    waiting_bytes: int

    def handle_frames(self, frames: list[Any], /) -> None: ...

    def hold_reading(self, held: bool, /) -> None: ...

    def abort(self) -> None: ...


class TenantShare:
    """One tenant's use of the loop: its weight, what it was served, its connections with work
    waiting."""

    __slots__ = ("connections", "fair", "name", "served", "weight")

    def __init__(self, fair: FairShare, name: str, weight: float) -> None:
        self.fair = fair
        self.name = name
        self.weight = weight
        self.served = 0.0  # seconds of the loop / weight, since the loop last had nothing waiting
        self.connections: deque[Client] = deque()

    def submit(self, conn: Client, frames: list[Any]) -> None:
        """``frames`` read from ``conn``: handled now if the turn is light and nothing waits,
        else queued for the drain."""
        fair = self.fair
        if not fair.waiting and fair.turn_spent < fair.quantum_s:
            clock = fair.clock
            began = clock()
            conn.handle_frames(frames)
            fair.turn_spent += clock() - began
            if not fair.armed:
                fair.arm()
            return
        queue = conn.waiting_frames
        if not queue:
            if not self.connections:
                # A busy period under way: start from the least served, not from nothing (or a
                # newcomer would have the loop until it caught up), and first among equals.
                if fair.waiting:
                    self.served = max(self.served, min(s.served for s in fair.waiting))
                fair.waiting.insert(0, self)
            self.connections.append(conn)
        added = 0
        for frame in frames:
            owned = bytes(frame)  # (not a view pinning the whole read it came in)
            queue.append(owned)
            added += len(owned)
        conn.waiting_bytes += added
        fair.waiting_bytes += added
        fair.queued += len(frames)
        if (
            len(queue) >= fair.max_waiting_frames
            or conn.waiting_bytes >= fair.max_waiting_bytes
            or fair.waiting_bytes >= fair.max_total_waiting_bytes
        ):
            conn.hold_reading(True)
        if not fair.armed:
            fair.arm()

    def flush(self, conn: Client) -> None:
        """``conn``'s peer ended it: its waiting requests are handled now, ahead of their turn."""
        queue = conn.waiting_frames
        if not queue:
            return
        frames = list(queue)
        self.fair.release(conn)
        self._leave(conn)
        conn.handle_frames(frames)

    def _leave(self, conn: Client) -> None:
        try:
            self.connections.remove(conn)
        except ValueError:
            return
        if not self.connections and self in self.fair.waiting:
            self.fair.waiting.remove(self)


class FairShare:
    """The tenants of one event loop and the work they have waiting."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        quantum_s: float = DEFAULT_QUANTUM_S,
        slice_s: float = DEFAULT_SLICE_S,
        max_waiting_frames: int = MAX_WAITING_FRAMES,
        max_waiting_bytes: int = MAX_WAITING_BYTES,
        max_total_waiting_bytes: int = MAX_TOTAL_WAITING_BYTES,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if quantum_s < 0 or slice_s <= 0 or min(max_waiting_frames, max_waiting_bytes, max_total_waiting_bytes) < 1:
            raise ValueError("fair share: quantum_s >= 0, slice_s > 0 and the waiting limits >= 1")
        self.loop = loop
        self.quantum_s = quantum_s
        self.slice_s = slice_s
        self.max_waiting_frames = max_waiting_frames
        self.max_waiting_bytes = max_waiting_bytes
        self.max_total_waiting_bytes = max_total_waiting_bytes
        self.waiting_bytes = 0  # of all connections' waiting requests
        self.clock = clock
        self.tenants: dict[str, TenantShare] = {}
        self.waiting: list[TenantShare] = []  # tenants with work waiting
        self.turn_spent = 0.0  # seconds of requests handled as read in this turn
        self.armed = False  # the next turn's callback is scheduled
        self.queued = 0  # requests that waited for a drain, since start (a metric)

    def tenant(self, name: str, weight: float = 1.0) -> TenantShare:
        got = self.tenants.get(name)
        if got is None:
            if weight <= 0:
                raise ValueError(f"a tenant's weight must be above 0, not {weight}")
            got = self.tenants[name] = TenantShare(self, name, weight)
        return got

    def forget(self, name: str) -> None:
        """The tenant has no connection left here (work it has waiting is still drained)."""
        share = self.tenants.get(name)
        if share is not None and not share.connections:
            del self.tenants[name]

    def arm(self) -> None:
        self.armed = True
        self.loop.call_soon(self._next_turn)

    def release(self, conn: Client) -> None:
        """``conn``'s waiting requests leave the wait (taken or dropped)."""
        self.waiting_bytes -= conn.waiting_bytes
        conn.waiting_bytes = 0
        conn.waiting_frames.clear()

    def _next_turn(self) -> None:
        """A new turn: the budget for requests handled as read starts again, and waiting work is
        drained for at most ``slice_s``, least-served tenant first."""
        self.armed = False
        self.turn_spent = 0.0
        waiting = self.waiting
        if not waiting:
            return
        clock = self.clock
        now = clock()
        until = now + self.slice_s
        try:
            while waiting and now < until:
                share = min(waiting, key=_served)
                conns = share.connections
                conn = conns[0]
                queue = conn.waiting_frames
                if conn.closed:
                    self.release(conn)
                else:
                    frames = [queue.popleft() for _ in range(min(CHUNK, len(queue)))]
                    taken = sum(len(f) for f in frames)
                    conn.waiting_bytes -= taken
                    self.waiting_bytes -= taken
                    try:
                        conn.handle_frames(frames)
                    except Exception:
                        log.exception("closing a connection: handling its requests failed")
                        self.release(conn)
                        conn.abort()
                    later = clock()
                    share.served += (later - now) / share.weight
                    now = later
                if conn.closed:
                    self.release(conn)
                if queue:
                    conns.rotate(-1)  # the tenant's connections in turn
                else:
                    conns.popleft()
                    if not conn.closed:
                        conn.hold_reading(False)
                if not conns:
                    waiting.remove(share)
        finally:
            if waiting:
                self.arm()
            else:  # the loop caught up: a new busy period starts from equal shares
                for share in self.tenants.values():
                    share.served = 0.0


def _served(share: TenantShare) -> float:
    return share.served
