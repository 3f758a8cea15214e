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
        self.held: list[bool] = []

    def handle_frames(self, frames: list[Any]) -> None:
        for f in frames:
            self.log.append((self.name, f))
            self.clock.now += self.cost_s

    def hold_reading(self, held: bool) -> None:
        self.held.append(held)


async def settle(fair: FairShare) -> None:
    for _ in range(10_000):
        if not fair.waiting and not fair.armed:
            return
        await asyncio.sleep(0)
    raise AssertionError("the drain did not finish")


async def test_a_light_turn_handles_requests_as_read() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.001, slice_s=0.001, clock=clock)
    a = Peer("a", clock, log, cost_s=0.0001)
    fair.tenant("acme").submit(a, [1, 2, 3])
    assert log == [("a", 1), ("a", 2), ("a", 3)]  # at once, not queued
    assert fair.queued == 0


async def test_past_the_quantum_the_least_served_tenant_goes_first_and_each_connection_keeps_its_order() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.001, slice_s=0.01, clock=clock)
    acme, beta = fair.tenant("acme"), fair.tenant("beta")
    heavy = [Peer(f"a{i}", clock, log, cost_s=0.0005) for i in range(4)]
    light = Peer("b", clock, log, cost_s=0.0005)
    acme.submit(heavy[0], list(range(3)))  # 1.5 ms: past the quantum
    for p in heavy[1:]:
        acme.submit(p, list(range(40)))  # waits
    beta.submit(light, ["x", "y"])  # waits too (behind nothing of its own)
    assert fair.queued == 122
    log.clear()
    await settle(fair)
    assert log[0][0] == "b"  # beta, served least, first
    assert [f for n, f in log if n == "b"] == ["x", "y"]
    for p in heavy[1:]:
        assert [f for n, f in log if n == p.name] == list(range(40))  # in order per connection
    # acme's connections take turns a chunk at a time.
    names = [n for n, _ in log if n != "b"]
    assert names[:CHUNK] == ["a1"] * CHUNK
    assert names[CHUNK : 2 * CHUNK] == ["a2"] * CHUNK


@pytest.mark.parametrize("weight", [1.0, 2.0])
async def test_tenants_share_the_drain_by_time_in_proportion_to_their_weights(weight: float) -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.005, clock=clock)
    cheap = Peer("cheap", clock, log, cost_s=0.0001)
    dear = Peer("dear", clock, log, cost_s=0.0004)
    fair.tenant("c").submit(cheap, list(range(4000)))
    fair.tenant("d", weight=weight).submit(dear, list(range(1000)))
    for _ in range(10_000):  # 0.2 s of the loop's time, both tenants with work all along
        if clock.now >= 0.2:
            break
        await asyncio.sleep(0)
    time_cheap = sum(1 for n, _ in log if n == "cheap") * 0.0001
    time_dear = sum(1 for n, _ in log if n == "dear") * 0.0004
    assert abs(time_dear - weight * time_cheap) <= weight * CHUNK * 0.0005  # within a chunk of each
    await settle(fair)
    assert len(log) == 5000  # nothing lost


async def test_a_connection_holding_too_many_is_not_read_until_they_are_taken() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.001, max_waiting_frames=64, clock=clock)
    p = Peer("a", clock, log, cost_s=0.0001)
    tenant = fair.tenant("acme")
    tenant.submit(p, list(range(40)))
    assert p.held == []
    tenant.submit(p, list(range(40, 80)))
    assert p.held == [True]  # 80 waiting >= 64: reading stops
    await settle(fair)
    assert p.held == [True, False]  # and starts again once they are taken
    assert [f for _, f in log] == list(range(80))


async def test_a_closed_connections_requests_are_dropped_and_the_others_go_on() -> None:
    clock = Clock()
    log: list[tuple[str, Any]] = []
    fair = FairShare(asyncio.get_running_loop(), quantum_s=0.0, slice_s=0.001, clock=clock)
    gone = Peer("gone", clock, log, cost_s=0.0001)
    kept = Peer("kept", clock, log, cost_s=0.0001)
    fair.tenant("acme").submit(gone, list(range(100)))
    fair.tenant("acme").submit(kept, list(range(100)))
    gone.closed = True
    await settle(fair)
    assert [f for n, f in log if n == "kept"] == list(range(100))
    assert all(n == "kept" for n, _ in log)
    assert gone.held == []  # a closed connection is not read again


async def test_bad_settings_are_refused() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(ValueError, match="slice_s"):
        FairShare(loop, slice_s=0)
    with pytest.raises(ValueError, match="weight"):
        FairShare(loop).tenant("t", weight=0)
