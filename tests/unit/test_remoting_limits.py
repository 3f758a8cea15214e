"""Inbound limits' accounting (data_plane/remoting/limits.py), without sockets: the guard's counts
and reservations, the decoder's ``pending``, and a Connection driven through a stand-in transport
(connections admitted by address, incomplete frames reserved at their length prefix and given
back when they complete or the connection goes, unproven connections' large frames, the frame
deadline, the rate-limited refusal log)."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest

from data_plane.refusal_log import LOG_BURST, LOG_WINDOW_S
from data_plane.remoting.command import FrameDecoder, RemotingCommand, encode_bytes
from data_plane.remoting.connection import Connection
from data_plane.remoting.limits import (
    FRAME_COMPLETE_TIMEOUT,
    MAX_CONNECTIONS_PER_ADDRESS,
    MAX_CONNECTIONS_TOTAL,
    MAX_FIRST_FRAME_BYTES,
    MAX_PARTIAL_FRAME_BYTES_TOTAL,
    InboundGuard,
    InboundLimits,
)
from tests.conftest import counter_points

pytestmark = [pytest.mark.unit, pytest.mark.timing]

KIB = 1024


def frame(body_bytes: int = 0, opaque: int = 1) -> bytes:
    return encode_bytes(RemotingCommand(9999, opaque=opaque, body=b"b" * body_bytes))


def frame_of_length(length: int, opaque: int = 1) -> bytes:
    data = frame(length - (len(frame(0, opaque)) - 4), opaque)
    assert struct.unpack_from(">I", data)[0] == length
    return data


# --- settings -------------------------------------------------------------------------------------
def test_the_defaults_are_valid_and_each_bad_value_is_named() -> None:
    assert InboundLimits().problems(16 * 1024 * KIB) == []
    bad = InboundLimits(
        max_partial_frame_bytes_total=1024,
        max_first_frame_bytes=0,
        max_large_first_frame_bytes_total=-1,
        frame_complete_timeout_ms=10,
        max_connections_per_address=0,
        max_connections_total=0,
    ).problems(4096)
    text = "; ".join(bad)
    for name in (
        "max_partial_frame_bytes_total",
        "max_first_frame_bytes",
        "max_large_first_frame_bytes_total",
        "frame_complete_timeout_ms",
        "max_connections_per_address",
        "max_connections_total",
    ):
        assert name in text
    assert len(bad) == 6


# --- the guard ------------------------------------------------------------------------------------
def test_connections_are_counted_by_address_and_in_all() -> None:
    g = InboundGuard(InboundLimits(max_connections_per_address=2, max_connections_total=3))
    assert g.admit("a") is None
    assert g.admit("a") is None
    assert g.admit("a") == MAX_CONNECTIONS_PER_ADDRESS
    assert g.admit("b") is None
    assert g.admit("c") == MAX_CONNECTIONS_TOTAL
    g.gone("a")
    assert g.admit("c") is None
    g.gone("b")
    g.gone("c")
    g.gone("a")
    assert (g.connections, g.per_address) == (0, {})  # addresses gone leave nothing behind


def test_reservations_stay_within_the_total_and_unproven_large_frames_within_their_allowance() -> None:
    g = InboundGuard(
        InboundLimits(
            max_partial_frame_bytes_total=100 * KIB, max_first_frame_bytes=10 * KIB,
            max_large_first_frame_bytes_total=30 * KIB,
        )
    )  # fmt: skip
    assert g.reserve(10 * KIB, True) is None  # at the unproven limit: not a large one
    assert g.reserve(20 * KIB, True) is None  # large: from the allowance
    assert g.reserve(11 * KIB, True) == MAX_FIRST_FRAME_BYTES  # the allowance has 10 KiB left
    assert g.reserve(11 * KIB, False) is None  # proven: the total alone
    assert (g.partial_bytes, g.large_first_bytes) == (41 * KIB, 20 * KIB)
    assert g.reserve(60 * KIB, False) == MAX_PARTIAL_FRAME_BYTES_TOTAL
    assert g.reserve(59 * KIB, False) is None  # exactly the total
    g.release(20 * KIB, True)
    assert g.large_first_bytes == 0
    assert g.reserve(30 * KIB, True) == MAX_PARTIAL_FRAME_BYTES_TOTAL  # the total is checked first
    for nbytes, unproven in ((10 * KIB, True), (11 * KIB, False), (59 * KIB, False)):
        g.release(nbytes, unproven)
    assert (g.partial_bytes, g.large_first_bytes) == (0, 0)


def test_an_allowance_of_zero_refuses_every_large_first_frame() -> None:
    g = InboundGuard(InboundLimits(max_first_frame_bytes=KIB, max_large_first_frame_bytes_total=0))
    assert g.reserve(KIB, True) is None
    assert g.reserve(KIB + 1, True) == MAX_FIRST_FRAME_BYTES


def test_refusals_are_counted_and_logged_at_most_a_burst_a_window(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    g = InboundGuard(InboundLimits(), clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="data_plane.remoting.limits")
    for i in range(LOG_BURST + 15):
        g.refuse(MAX_CONNECTIONS_TOTAL, f"10.0.0.1:{i}", "full")
    g.refuse(FRAME_COMPLETE_TIMEOUT, "10.0.0.2:1", "slow")  # its own budget
    assert g.refused == {MAX_CONNECTIONS_TOTAL: LOG_BURST + 15, FRAME_COMPLETE_TIMEOUT: 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == LOG_BURST + 1
    assert lines[0] == "closing connection from 10.0.0.1:0 (max_connections_total): full"
    caplog.clear()
    now[0] = LOG_WINDOW_S
    g.refuse(MAX_CONNECTIONS_TOTAL, "10.0.0.1:99", "full")
    assert [r.getMessage() for r in caplog.records] == [
        "… 15 more connections closed (max_connections_total) in the last 10 s",
        "closing connection from 10.0.0.1:99 (max_connections_total): full",
    ]


# --- the decoder's pending ------------------------------------------------------------------------
def test_pending_is_the_incomplete_frames_size_and_zero_between_frames() -> None:
    d = FrameDecoder()
    one = frame(100)
    assert len(d.feed(one)) == 1
    assert d.pending == 0
    d.feed(one[:2])
    assert d.pending == 4  # its length prefix is cut
    d.feed(one[2:10])
    assert d.pending == len(one)
    d.feed(one[10:20])
    assert d.pending == len(one)
    assert len(d.feed(one[20:] + one[:30])) == 1
    assert d.pending == len(one)  # the next frame, of the same size
    assert len(d.feed(one[30:])) == 1
    assert d.pending == 0
    d.feed(one[:50])
    d.reset()
    assert (d.pending, d.buffered) == (0, 0)


# --- a connection ---------------------------------------------------------------------------------
class StandInTransport:
    """What Connection calls of a transport; ``aborted`` records an abort."""

    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.aborted = False
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, data: list[bytes]) -> None:
        self.written.append(b"".join(bytes(d) for d in data))

    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_connection(
    guard: InboundGuard, address: str = "10.0.0.1", *, prove_on_frame: bool = True
) -> tuple[Connection, StandInTransport]:
    conn = Connection(None, guard=guard, idle_timeout_s=0, server_side=True, prove_on_frame=prove_on_frame)
    transport = StandInTransport((address, 40000 + guard.connections))
    conn.connection_made(transport)  # type: ignore[arg-type]  # the calls Connection makes
    return conn, transport


def aborted(t: StandInTransport) -> bool:
    return t.aborted


def drop(conn: Connection) -> None:
    conn.connection_lost(None)


@pytest.mark.asyncio
async def test_a_connection_past_the_address_cap_is_aborted_as_it_opens_and_not_counted() -> None:
    guard = InboundGuard(InboundLimits(max_connections_per_address=1))
    first, t1 = open_connection(guard)
    second, t2 = open_connection(guard)
    assert (t1.aborted, t2.aborted) == (False, True)
    assert guard.refused == {MAX_CONNECTIONS_PER_ADDRESS: 1}
    drop(second)
    assert guard.per_address == {"10.0.0.1": 1}
    drop(first)
    assert (guard.connections, guard.per_address) == (0, {})


@pytest.mark.asyncio
async def test_a_fresh_connection_announcing_a_frame_over_the_first_frame_limit_is_aborted_at_its_prefix() -> None:
    guard = InboundGuard(InboundLimits(max_first_frame_bytes=4 * KIB, max_large_first_frame_bytes_total=0))
    conn, t = open_connection(guard)
    conn.data_received(struct.pack(">I", 4 * KIB + 1))
    assert aborted(t)
    assert guard.refused == {MAX_FIRST_FRAME_BYTES: 1}
    assert guard.partial_bytes == 0
    drop(conn)
    assert guard.connections == 0


@pytest.mark.asyncio
async def test_a_proven_connection_reserves_a_large_frame_until_it_completes() -> None:
    guard = InboundGuard(InboundLimits(max_first_frame_bytes=4 * KIB, max_large_first_frame_bytes_total=0))
    conn, t = open_connection(guard)
    conn.data_received(frame(10))  # its first frame, whole: proven
    assert conn.proven
    big = frame_of_length(64 * KIB, opaque=2)
    conn.data_received(big[:1000])
    assert not aborted(t)
    assert (guard.partial_bytes, guard.partial) == (64 * KIB, {conn})
    conn.data_received(big[1000:])
    assert (guard.partial_bytes, guard.partial) == (0, set())
    assert len(t.written) == 2  # both answered (REQUEST_CODE_NOT_SUPPORTED)


@pytest.mark.asyncio
async def test_with_a_before_check_a_complete_frame_does_not_prove_the_connection() -> None:
    guard = InboundGuard(InboundLimits(max_first_frame_bytes=4 * KIB, max_large_first_frame_bytes_total=0))
    conn, t = open_connection(guard, prove_on_frame=False)
    conn.data_received(frame(10))  # not authenticated: still unproven
    assert not conn.proven
    conn.data_received(struct.pack(">I", 8 * KIB))
    assert aborted(t)
    assert guard.refused == {MAX_FIRST_FRAME_BYTES: 1}


@pytest.mark.asyncio
async def test_the_frames_deadline_starts_with_each_frame_not_each_read() -> None:
    guard = InboundGuard(InboundLimits())
    conn, t = open_connection(guard)
    one = frame(300)
    conn.data_received(one[:2])  # the length prefix cut: the frame has begun
    began = conn.partial_since
    conn.loop.time = lambda: began + 5  # type: ignore[method-assign]
    conn.data_received(one[2:100])  # its length: the same frame, the same start
    assert conn.partial_since == began
    assert guard.partial_bytes == len(one) - 4
    conn.data_received(one[100:] + one[:50])  # it completes, the next one (same size) begins
    assert conn.partial_since == began + 5
    assert guard.partial_bytes == len(one) - 4
    conn.expire_partial(began + 5 + 29, 30.0)
    assert not aborted(t)
    conn.expire_partial(began + 5 + 30, 30.0)
    assert aborted(t)
    assert guard.refused == {FRAME_COMPLETE_TIMEOUT: 1}
    drop(conn)
    assert (guard.partial_bytes, guard.partial, guard.connections) == (0, set(), 0)


@pytest.mark.asyncio
async def test_time_spent_not_reading_from_a_connection_does_not_count_toward_its_deadline() -> None:
    guard = InboundGuard(InboundLimits())
    conn, t = open_connection(guard)
    conn.data_received(frame(300)[:100])
    conn.pause_writing()  # the peer does not read our answers: we stop reading it
    began = conn.partial_since
    conn.expire_partial(began + 60, 30.0)
    assert not aborted(t)
    assert conn.partial_since == began + 60
    conn.resume_writing()
    conn.expire_partial(began + 89, 30.0)
    assert not aborted(t)
    conn.expire_partial(began + 90, 30.0)
    assert aborted(t)


@pytest.mark.asyncio
async def test_closing_mid_frame_gives_back_the_reservation_and_the_decoders_bytes() -> None:
    guard = InboundGuard(InboundLimits())
    conn, _ = open_connection(guard)
    conn.data_received(frame(10))
    conn.data_received(frame_of_length(512 * KIB)[: 100 * KIB])
    assert guard.partial_bytes == 512 * KIB
    drop(conn)
    assert (guard.partial_bytes, guard.large_first_bytes, guard.partial) == (0, 0, set())
    assert conn.decoder.buffered == 0


# --- the metric -----------------------------------------------------------------------------------
def test_the_refusal_counter_reports_each_reason_at_collection() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from data_plane.telemetry import register_remoting_refusals, setup_telemetry

    reader = InMemoryMetricReader()
    t = setup_telemetry("orbit-broker-test", exporter="none", metric_readers=[reader], set_global=False)
    guard = InboundGuard(InboundLimits())
    register_remoting_refusals(t, guard.refused, broker_name="broker-a")

    def counts() -> dict[str, int]:
        return counter_points(reader, "orbit.remoting.refused", "orbit.refusal.reason")

    assert counts() == {}
    guard.refuse(MAX_CONNECTIONS_PER_ADDRESS, "10.0.0.1:1", "full")
    guard.refuse(MAX_CONNECTIONS_PER_ADDRESS, "10.0.0.1:2", "full")
    guard.refuse(FRAME_COMPLETE_TIMEOUT, "10.0.0.1:3", "slow")
    assert counts() == {MAX_CONNECTIONS_PER_ADDRESS: 2, FRAME_COMPLETE_TIMEOUT: 1}
    t.shutdown()
