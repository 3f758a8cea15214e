"""The fair share's rules (data_plane/remoting/fair_share.py), on a real event loop with a clock the
test moves: requests are handled as read while a turn is light; past the quantum they wait and
are taken least-served tenant first, in order per connection; a connection holding too many is
not read until they are taken; a closed connection's requests are dropped. The broker under a
real burst: tests/integration/test_tenancy_e2e_quotas.py."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest

from data_plane.remoting.fair_share import CHUNK, FairShare

pytestmark = pytest.mark.asyncio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Peer:
    """A connection as the fair share sees it: each request it handles costs ``cost_s`` of the
    (test's) clock and is logged."""

    def __init__(self, name: str, clock: Clock, log: list[tuple[str, Any]], cost_s: float) -> None:
        self.name = name
        self.clock = clock
        self.log = log
        self.cost_s = cost_s
        self.closed = False
        self.waiting_frames: deque[Any] = deque()
        self.waiting_bytes = 0
        self.held: list[bool] = []
        self.fail_on: bytes | None = None

    def handle_frames(self, frames: list[Any]) -> None:
        for f in frames:
            if f == self.fail_on:
                raise RuntimeError("a handler failed")
            self.log.append((self.name, f))
            self.clock.now += self.cost_s

    def hold_reading(self, held: bool) -> None:
        self.held.append(held)

    def abort(self) -> None:
        self.closed = True


def frames(*ns: int) -> list[bytes]:
    return [n.to_bytes(4, "big") for n in ns]


def numbers(log: list[tuple[str, Any]], name: str) -> list[int]:
    return [int.from_bytes(f, "big") for n, f in log if n == name]


async def settle(fair: FairShare) -> None:
    for _ in range(10_000):
        if not fair.waiting and not fair.armed:
            return
        await asyncio.sleep(0)
    raise AssertionError("the drain did not finish")


async def test_a_light_turn_handles_requests_as_read_and_counts_nothing_against_the_tenant() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.001, slice_s=0.001, clock=clock)
    a = Peer("a", clock, log, cost_s=0.0001)
    fair.tenant("acme").submit(a, frames(1, 2, 3))
    assert numbers(log, "a") == [1, 2, 3]  # at once, not queued
    assert fair.queued == 0
    assert fair.tenant("acme").served == 0.0  # only a busy period's drains count


async def test_past_the_quantum_the_least_served_tenant_goes_first_and_each_connection_keeps_its_order() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.001, slice_s=0.01, clock=clock)
    acme, beta = fair.tenant("acme"), fair.tenant("beta")
    heavy = [Peer(f"a{i}", clock, log, cost_s=0.0005) for i in range(4)]
    light = Peer("b", clock, log, cost_s=0.0005)
    acme.submit(heavy[0], frames(0, 1, 2))  # 1.5 ms: past the quantum
    for p in heavy[1:]:
        acme.submit(p, frames(*range(40)))  # waits
    assert fair.queued == 120
    await asyncio.sleep(0)  # a drain: acme is served past beta, which then arrives
    beta.submit(light, frames(7, 8))  # waits too (behind nothing of its own)
    earlier = sum(len(numbers(log, p.name)) for p in heavy[1:])
    assert 0 < earlier < 120
    log.clear()
    await settle(fair)
    assert log[0][0] == "b"  # beta, served least, first
    assert numbers(log, "b") == [7, 8]
    for p in heavy[1:]:
        assert sorted(numbers(log, p.name)) == numbers(log, p.name)  # in order per connection
    assert earlier + sum(len(numbers(log, p.name)) for p in heavy[1:]) == 120  # all of them, once
    assert fair.waiting_bytes == 0


@pytest.mark.parametrize("weight", [1.0, 2.0])
async def test_tenants_share_the_drain_by_time_in_proportion_to_their_weights(weight: float) -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.005, clock=clock)
    cheap = Peer("cheap", clock, log, cost_s=0.0001)
    dear = Peer("dear", clock, log, cost_s=0.0004)
    fair.tenant("c").submit(cheap, frames(*range(4000)))
    fair.tenant("d", weight=weight).submit(dear, frames(*range(1000)))
    for _ in range(10_000):  # 0.2 s of the loop's time, both tenants with work all along
        if clock.now >= 0.2:
            break
        await asyncio.sleep(0)
    time_cheap = len(numbers(log, "cheap")) * 0.0001
    time_dear = len(numbers(log, "dear")) * 0.0004
    assert abs(time_dear - weight * time_cheap) <= weight * CHUNK * 0.0005  # within a chunk of each
    await settle(fair)
    assert len(log) == 5000  # nothing lost


async def test_a_tenant_that_joins_a_busy_period_starts_from_the_least_served_not_from_nothing() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.002, clock=clock)
    a, c = Peer("a", clock, log, cost_s=0.0001), Peer("c", clock, log, cost_s=0.0001)
    fair.tenant("a").submit(a, frames(*range(2000)))
    fair.tenant("c").submit(c, frames(*range(2000)))
    for _ in range(20):
        await asyncio.sleep(0)
    least = min(fair.tenant("a").served, fair.tenant("c").served)
    assert least > 0
    newcomer = fair.tenant("n")
    newcomer.submit(Peer("n", clock, log, cost_s=0.0001), frames(1))
    assert newcomer.served == least  # (from 0 it would take the loop until it caught up)
    await settle(fair)


async def test_a_connection_holding_too_many_requests_or_bytes_is_not_read_until_they_are_taken() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    loop = asyncio.get_running_loop()
    fair = FairShare(loop, quantum_s=0.0, slice_s=0.001, max_waiting_frames=64, clock=clock)
    p = Peer("a", clock, log, cost_s=0.0001)
    tenant = fair.tenant("acme")
    tenant.submit(p, frames(*range(40)))
    assert p.held == []
    tenant.submit(p, frames(*range(40, 80)))
    assert p.held == [True]  # 80 waiting >= 64: reading stops
    await settle(fair)
    assert p.held == [True, False]  # and starts again once they are taken
    assert numbers(log, "a") == list(range(80))
    by_bytes = FairShare(loop, quantum_s=0.0, slice_s=0.001, max_waiting_bytes=10_000, clock=clock)
    q = Peer("q", clock, log, cost_s=0.0001)
    by_bytes.tenant("acme").submit(q, [b"x" * 6_000])
    assert q.held == []
    assert (q.waiting_bytes, by_bytes.waiting_bytes) == (6_000, 6_000)
    by_bytes.tenant("acme").submit(q, [b"y" * 6_000])
    assert q.held == [True]
    total = FairShare(loop, quantum_s=0.0, slice_s=0.001, max_total_waiting_bytes=10_000, clock=clock)
    r1, r2 = Peer("r1", clock, log, cost_s=0.0001), Peer("r2", clock, log, cost_s=0.0001)
    total.tenant("t1").submit(r1, [b"x" * 6_000])
    total.tenant("t2").submit(r2, [b"y" * 6_000])
    assert (r1.held, r2.held) == ([], [True])  # the one that took all of them past the total
    await settle(by_bytes)
    await settle(total)
    assert by_bytes.waiting_bytes == total.waiting_bytes == 0


async def test_a_waiting_view_is_copied_out_of_the_read_it_came_in() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.001, clock=clock)
    read = bytearray(b"abcdefgh" * 1000)
    view = memoryview(read)[:8]
    p = Peer("a", clock, log, cost_s=0.0001)
    fair.tenant("acme").submit(p, [view])
    assert p.waiting_bytes == 8  # what waits is the frame, not the read
    read[:8] = b"XXXXXXXX"  # the reader reuses its buffer
    await settle(fair)
    assert log == [("a", b"abcdefgh")]


async def test_a_closed_connections_requests_are_dropped_and_the_others_go_on() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.001, clock=clock)
    gone = Peer("gone", clock, log, cost_s=0.0001)
    kept = Peer("kept", clock, log, cost_s=0.0001)
    fair.tenant("acme").submit(gone, frames(*range(100)))
    fair.tenant("acme").submit(kept, frames(*range(100)))
    gone.closed = True
    await settle(fair)
    assert numbers(log, "kept") == list(range(100))
    assert numbers(log, "gone") == []
    assert gone.held == []  # a closed connection is not read again
    assert fair.waiting_bytes == 0


async def test_a_connection_its_peer_ended_has_its_waiting_requests_handled_at_once() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.001, clock=clock)
    p = Peer("a", clock, log, cost_s=0.0001)
    tenant = fair.tenant("acme")
    tenant.submit(p, frames(*range(50)))
    tenant.flush(p)  # (Connection.eof_received)
    assert numbers(log, "a") == list(range(50))
    assert fair.waiting == []
    assert fair.waiting_bytes == 0
    await settle(fair)
    assert len(log) == 50  # not handled twice


async def test_a_failing_handler_closes_its_connection_and_the_drain_goes_on() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.001, clock=clock)
    bad, good = Peer("bad", clock, log, cost_s=0.0001), Peer("good", clock, log, cost_s=0.0001)
    bad.fail_on = frames(3)[0]
    fair.tenant("t1").submit(bad, frames(*range(40)))
    fair.tenant("t2").submit(good, frames(*range(40)))
    await settle(fair)
    assert bad.closed
    assert numbers(log, "good") == list(range(40))
    assert fair.waiting_bytes == 0


async def test_bad_settings_are_refused() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(ValueError, match="slice_s"):
        FairShare(loop, slice_s=0)
    with pytest.raises(ValueError, match="waiting limits"):
        FairShare(loop, max_waiting_bytes=0)
    with pytest.raises(ValueError, match="weight"):
        FairShare(loop).tenant("t", weight=0)
