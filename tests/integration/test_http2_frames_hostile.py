"""A hostile HTTP/2 peer against GrpcServer (data_plane/http2/connection.py, grpc_server.py), over a
raw socket on 127.0.0.1 writing the preface and hand-built frames and parsing what comes back.

Connection errors end in GOAWAY with their code and the connection closed: a frame above the
advertised maximum or a PING of other than 8 bytes (FRAME_SIZE_ERROR), DATA on stream 0, a header
block interrupted by another frame or continued on another stream, even or decreasing stream ids
(PROTOCOL_ERROR), a header block past its bound in CONTINUATION frames, endless or one byte over
(ENHANCE_YOUR_CALM; at the bound it is read), more than 10,000 control frames without a stream
frame (ENHANCE_YOUR_CALM; 10,000 are answered), a connection WINDOW_UPDATE or an initial window
setting past 2^31-1 (FLOW_CONTROL_ERROR), a block HPACK cannot decode (COMPRESSION_ERROR). Garbage
instead of the preface, or a preface not finished in time, is closed with no answer (only the
server's own SETTINGS and window update). Stream errors end only their stream: one above
SETTINGS_MAX_CONCURRENT_STREAMS is refused (REFUSED_STREAM), DATA beyond a stream's window and a
stream WINDOW_UPDATE past 2^31-1 are FLOW_CONTROL_ERROR. PING is answered with its 8 bytes; a
server stream is written only as far as the client's windows allow. After each attack a fresh
connection is served."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import pytest_asyncio

from data_plane.http2 import connection
from data_plane.http2 import frames as f
from data_plane.http2.grpc_client import GrpcChannel
from data_plane.http2.grpc_server import MESSAGE_PREFIX, CallContext, GrpcServer
from data_plane.http2.hpack import encode_indexed, encode_literal, encode_literal_indexed_name
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc

pytestmark = [pytest.mark.asyncio]

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
PREFIX = "/apache.rocketmq.v2.MessagingService/"
DEADLINE_S = 10.0
MAX_MESSAGE = 4 << 20


class Servicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def QueryRoute(self, request: rpc.QueryRouteRequest, context: CallContext) -> rpc.QueryRouteResponse:
        name = request.topic.name
        return rpc.QueryRouteResponse(
            status=pb.Status(code=pb.Code.OK, message=name if len(name) < 100 else f"{len(name)}")
        )

    async def ReceiveMessage(
        self, request: rpc.ReceiveMessageRequest, context: CallContext
    ) -> AsyncIterator[rpc.ReceiveMessageResponse]:
        for body in self.bodies[: request.batch_size]:
            yield rpc.ReceiveMessageResponse(message=pb.Message(body=body))


@dataclass
class Served:
    server: GrpcServer
    port: int
    servicer: Servicer


async def serve(max_frame_size: int = 1 << 20) -> Served:
    servicer = Servicer()
    server = GrpcServer(servicer, SERVICE, max_message_bytes=MAX_MESSAGE, max_frame_size=max_frame_size)
    return Served(server, await server.listen("127.0.0.1", 0), servicer)


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    s = await serve()
    try:
        yield s
        await still_served(s.port)  # after each attack, a fresh connection is served
    finally:
        await s.server.close(grace=0)


async def still_served(port: int) -> None:
    channel = await GrpcChannel.connect("127.0.0.1", port)
    try:
        answer = await channel.unary("QueryRoute", route("still served"), rpc.QueryRouteResponse)
        assert answer.status.message == "still served"
    finally:
        channel.close()


# --- the raw peer ---------------------------------------------------------------------------------
class Frame(NamedTuple):
    kind: int
    flags: int
    sid: int
    payload: bytes


class Peer(asyncio.Protocol):
    """A client socket keeping all it reads; EOF and resets are noted, never lose what came first."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.data = bytearray()
        self.pos = 0
        self.eof = False
        self.changed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.changed.set()

    def eof_received(self) -> bool:
        self.eof = True
        self.changed.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.changed.set()

    def send(self, *chunks: bytes) -> None:
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(b"".join(chunks))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self, check: Callable[[], bool], what: str) -> None:
        end = asyncio.get_running_loop().time() + DEADLINE_S
        while not check():
            self.changed.clear()
            timeout = end - asyncio.get_running_loop().time()
            if timeout <= 0:
                raise AssertionError(f"no {what} within {DEADLINE_S} s")
            try:
                await asyncio.wait_for(self.changed.wait(), timeout)
            except TimeoutError:
                raise AssertionError(f"no {what} within {DEADLINE_S} s") from None

    def kinds(self) -> list[int]:
        """The types of the whole frames arrived and not yet read (without reading them)."""
        out, pos = [], self.pos
        while len(self.data) - pos >= f.FRAME_HEADER_SIZE:
            word, _, _ = f.FRAME_HEADER.unpack_from(self.data, pos)
            pos += f.FRAME_HEADER_SIZE + (word >> 8)
            if pos > len(self.data):
                break
            out.append(word & 0xFF)
        return out

    def _complete(self) -> bool:
        if len(self.data) - self.pos < f.FRAME_HEADER_SIZE:
            return False
        word: int = f.FRAME_HEADER.unpack_from(self.data, self.pos)[0]
        return len(self.data) - self.pos >= f.FRAME_HEADER_SIZE + (word >> 8)

    async def frame(self) -> Frame | None:
        """The next frame the server sent, or None when the connection ended before one."""
        await self._wait(lambda: self._complete() or self.eof, "frame")
        if not self._complete():
            assert len(self.data) == self.pos, "the connection ended inside a frame"
            return None
        word, flags, sid = f.FRAME_HEADER.unpack_from(self.data, self.pos)
        start = self.pos + f.FRAME_HEADER_SIZE
        self.pos = start + (word >> 8)
        return Frame(word & 0xFF, flags, sid & 0x7FFFFFFF, bytes(self.data[start : self.pos]))

    async def until(self, kind: int, skip: tuple[int, ...] = (f.SETTINGS, f.WINDOW_UPDATE, f.PING)) -> Frame:
        """The next frame of ``kind``, past frames of the kinds in ``skip`` (any other fails)."""
        while True:
            got = await self.frame()
            assert got is not None, f"the connection ended before a frame of type {kind}"
            if got.kind == kind:
                return got
            assert got.kind in skip, f"a frame of type {got.kind} came before one of type {kind}: {got}"

    async def goaway(self) -> tuple[int, int]:
        """The GOAWAY the server ends with, as (last stream id, error code); then the connection closes."""
        got = await self.until(f.GOAWAY, skip=(f.SETTINGS, f.WINDOW_UPDATE, f.PING, f.HEADERS, f.DATA, f.RST_STREAM))
        last, code = f.GOAWAY_HEAD.unpack_from(got.payload)
        await self.closed()
        return last, code

    async def closed(self) -> list[Frame]:
        """The frames left until the server closes the connection."""
        rest = []
        while (got := await self.frame()) is not None:
            rest.append(got)
        return rest

    async def ping(self, data: bytes = b"roundtrp") -> list[Frame]:
        """A PING round trip: the frames the server wrote before answering it (all it had to say
        about the frames sent before the PING)."""
        self.send(f.frame(f.PING, 0, 0, data))
        before: list[Frame] = []
        while True:
            got = await self.frame()
            assert got is not None, "the connection ended before the PING was answered"
            if got.kind == f.PING and got.flags & f.ACK and got.payload == data:
                return before
            before.append(got)


async def open_peer(port: int, *, preface: bool = True, settings: dict[int, int] | None = None) -> Peer:
    _transport, peer = await asyncio.get_running_loop().create_connection(Peer, "127.0.0.1", port)
    if preface:
        peer.send(f.PREFACE + f.settings(settings or {}))
        # The server's preface (its SETTINGS, and the connection window's update), then the ACK of
        # this side's SETTINGS: after these, all that comes is an answer.
        got = [await peer.frame() for _ in range(3)]
        assert [(g.kind, g.flags, g.sid) if g else None for g in got] == [
            (f.SETTINGS, 0, 0),
            (f.WINDOW_UPDATE, 0, 0),
            (f.SETTINGS, f.ACK, 0),
        ]
    return peer


@pytest_asyncio.fixture
async def peer(served: Served) -> AsyncIterator[Peer]:
    p = await open_peer(served.port)
    try:
        yield p
    finally:
        p.close()


def route(topic: str) -> rpc.QueryRouteRequest:
    return rpc.QueryRouteRequest(topic=pb.Resource(name=topic))


def route_of_size(size: int) -> rpc.QueryRouteRequest:
    """A QueryRouteRequest of exactly ``size`` bytes serialized."""
    n = size
    while len(route("x" * n).SerializeToString()) > size:
        n -= 1
    request = route("x" * n)
    assert len(request.SerializeToString()) == size
    return request


def server_side(served: Served) -> connection.H2Connection:
    """The server's end of the one connection open on it."""
    (conn,) = served.server.connections
    return conn


def request_block(method: str = "QueryRoute", extra: bytes = b"") -> bytes:
    return (
        encode_indexed(3)  # :method POST
        + encode_indexed(6)  # :scheme http
        + encode_literal_indexed_name(4, (PREFIX + method).encode())
        + encode_literal_indexed_name(1, b"localhost")
        + encode_literal_indexed_name(31, b"application/grpc")
        + encode_literal(b"te", b"trailers")
        + extra
    )


def message(request: rpc.QueryRouteRequest | rpc.ReceiveMessageRequest) -> bytes:
    payload = request.SerializeToString()
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload


def call(sid: int, topic: str = "t") -> bytes:
    """A whole unary QueryRoute call on stream ``sid``."""
    return f.frame(f.HEADERS, f.END_HEADERS, sid, request_block()) + f.frame(
        f.DATA, f.END_STREAM, sid, message(route(topic))
    )


async def answer(peer: Peer, sid: int) -> tuple[rpc.QueryRouteResponse, Frame]:
    """A unary call's answer on stream ``sid``: its message and its trailers."""
    headers = await peer.until(f.HEADERS)
    assert headers.sid == sid
    assert not headers.flags & f.END_STREAM
    data = await peer.until(f.DATA)
    assert data.sid == sid
    compressed, length = MESSAGE_PREFIX.unpack_from(data.payload)
    assert (compressed, length) == (0, len(data.payload) - 5)
    trailers = await peer.until(f.HEADERS)
    assert trailers.sid == sid
    assert trailers.flags & f.END_STREAM
    return rpc.QueryRouteResponse.FromString(data.payload[5:]), trailers


# --- the preface and frame sizes --------------------------------------------------------------------
async def test_garbage_instead_of_the_preface_is_closed_without_an_answer(served: Served) -> None:
    peer = await open_peer(served.port, preface=False)
    peer.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    frames = await peer.closed()
    # Only what the server writes as soon as a connection opens (its SETTINGS and the connection
    # window's update): no GOAWAY, nothing about the garbage.
    assert [(g.kind, g.sid) for g in frames] == [(f.SETTINGS, 0), (f.WINDOW_UPDATE, 0)]


async def test_a_connection_silent_past_the_preface_timeout_is_closed(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "PREFACE_TIMEOUT_S", 0.05)
    peer = await open_peer(served.port, preface=False)
    peer.send(f.PREFACE[:10])  # a start, never finished
    assert [(g.kind, g.sid) for g in await peer.closed()] == [(f.SETTINGS, 0), (f.WINDOW_UPDATE, 0)]
    assert not served.server.connections


async def test_a_preface_arriving_a_byte_at_a_time_is_taken(served: Served) -> None:
    peer = await open_peer(served.port, preface=False)
    try:
        for byte in f.PREFACE + f.settings({}):
            peer.send(bytes((byte,)))
            await asyncio.sleep(0)  # (a turn of the loop: the bytes leave one by one)
        assert (await peer.until(f.SETTINGS)).flags == 0
        peer.send(call(1, "slowly"))
        response, _ = await answer(peer, 1)
        assert response.status.message == "slowly"
    finally:
        peer.close()


async def test_a_frame_above_the_advertised_maximum_is_frame_size_error(served: Served, peer: Peer) -> None:
    limit = served.server.max_frame_size
    peer.send(f.frame_head(f.DATA, 0, 1, limit + 1))  # the header is enough: the payload never comes
    assert await peer.goaway() == (0, f.FRAME_SIZE_ERROR)


async def test_a_frame_at_the_advertised_maximum_is_taken(served: Served, peer: Peer) -> None:
    limit = served.server.max_frame_size
    assert server_side(served).stream_window >= limit  # (a frame of this size is within the window)
    peer.send(f.frame(f.HEADERS, f.END_HEADERS, 1, request_block()))
    request = route_of_size(limit - 5)  # and its 5-byte message prefix
    body = message(request)
    assert len(body) == limit
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, body))
    response, _ = await answer(peer, 1)
    assert response.status.message == str(len(request.topic.name))


# --- protocol errors --------------------------------------------------------------------------------
async def test_data_on_stream_0_is_protocol_error(peer: Peer) -> None:
    peer.send(f.frame(f.DATA, 0, 0, b"abc"))
    assert await peer.goaway() == (0, f.PROTOCOL_ERROR)


async def test_a_header_block_interrupted_by_a_ping_is_protocol_error(peer: Peer) -> None:
    peer.send(f.frame(f.HEADERS, 0, 1, request_block()), f.frame(f.PING, 0, 0, b"12345678"))
    assert await peer.goaway() == (0, f.PROTOCOL_ERROR)


async def test_a_continuation_on_another_stream_is_protocol_error(peer: Peer) -> None:
    block = request_block()
    peer.send(f.frame(f.HEADERS, 0, 1, block[:10]), f.frame(f.CONTINUATION, f.END_HEADERS, 3, block[10:]))
    assert await peer.goaway() == (0, f.PROTOCOL_ERROR)


async def test_a_header_block_in_continuation_frames_is_taken(peer: Peer) -> None:
    block = request_block()
    peer.send(
        f.frame(f.HEADERS, 0, 1, block[:5]),
        f.frame(f.CONTINUATION, 0, 1, block[5:20]),
        f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[20:]),
        f.frame(f.DATA, f.END_STREAM, 1, message(route("continued"))),
    )
    response, _ = await answer(peer, 1)
    assert response.status.message == "continued"


async def test_an_even_stream_id_is_protocol_error(peer: Peer) -> None:
    peer.send(call(2))
    assert await peer.goaway() == (0, f.PROTOCOL_ERROR)


async def test_a_decreasing_stream_id_is_protocol_error(peer: Peer) -> None:
    peer.send(call(5))
    await answer(peer, 5)
    peer.send(call(3))
    assert await peer.goaway() == (5, f.PROTOCOL_ERROR)


async def test_an_invalid_hpack_block_is_compression_error(peer: Peer) -> None:
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, b"\x80"))  # index 0
    assert await peer.goaway() == (0, f.COMPRESSION_ERROR)


async def test_a_ping_is_answered_with_its_own_8_bytes(peer: Peer, seed: int) -> None:
    data = random.Random(seed).randbytes(8)
    peer.send(f.frame(f.PING, 0, 0, data))
    pong = await peer.until(f.PING)
    assert pong == Frame(f.PING, f.ACK, 0, data)
    peer.send(f.frame(f.PING, f.ACK, 0, b"unasked!"))  # an ACK nobody asked for: ignored
    assert await peer.ping() == []


async def test_a_ping_of_other_than_8_bytes_is_frame_size_error(peer: Peer) -> None:
    peer.send(f.frame(f.PING, 0, 0, b"1234567"))
    assert await peer.goaway() == (0, f.FRAME_SIZE_ERROR)


# --- floods -----------------------------------------------------------------------------------------
async def test_an_endless_continuation_flood_is_enhance_your_calm(served: Served, peer: Peer) -> None:
    peer.send(f.frame(f.HEADERS, 0, 1, request_block()))
    chunk = f.frame(f.CONTINUATION, 0, 1, encode_literal(b"x-flood", b"v" * 1000))
    sent = 0
    while f.GOAWAY not in peer.kinds() and not peer.eof:  # until the server answers
        assert sent < 64 << 20, "64 MiB of CONTINUATION frames and no answer"
        peer.send(chunk)
        sent += len(chunk)
        await asyncio.sleep(0)  # (a turn of the loop: the frames leave, the answer can arrive)
    assert await peer.goaway() == (0, f.ENHANCE_YOUR_CALM)
    assert sent < 16 * served.server.max_metadata_bytes


def padded_block(size: int) -> bytes:
    """A request's header block of exactly ``size`` bytes (padded with one x-pad field)."""
    base = request_block()
    n = size - len(base)
    while len(pad := encode_literal(b"x-pad", b"p" * n)) + len(base) > size:
        n -= 1
    block = base + pad
    assert len(block) == size
    return block


@pytest.mark.parametrize(("over", "code"), [(0, None), (1, f.ENHANCE_YOUR_CALM)])
async def test_a_header_block_is_bounded_on_the_wire(served: Served, peer: Peer, over: int, code: int | None) -> None:
    limit = server_side(served).max_header_block
    assert limit == 2 * served.server.max_metadata_bytes + 1024
    block = padded_block(limit + over)
    frames = [f.frame(f.HEADERS, 0, 1, block[:16_000])]
    frames += [f.frame(f.CONTINUATION, 0, 1, block[i : i + 16_000]) for i in range(16_000, len(block), 16_000)]
    frames[-1] = f.frame(f.CONTINUATION, f.END_HEADERS, 1, frames[-1][f.FRAME_HEADER_SIZE :])
    peer.send(*frames)
    if code is not None:
        assert await peer.goaway() == (0, code)
        return
    # At the bound the block is read (and its list refused as metadata: too large for a call).
    headers = await peer.until(f.HEADERS)
    assert headers.sid == 1
    assert headers.flags & f.END_STREAM
    assert b"grpc-status" in headers.payload
    assert b"\x018" in headers.payload  # grpc-status 8: RESOURCE_EXHAUSTED
    assert await peer.ping() == [Frame(f.RST_STREAM, 0, 1, f.U32.pack(f.NO_ERROR))]


async def test_10001_pings_without_a_stream_frame_are_enhance_your_calm(peer: Peer) -> None:
    limit = connection.MAX_CONTROL_FRAMES
    assert limit == 10_000
    # The preface's SETTINGS counted one; a stream frame starts the count again.
    peer.send(call(1), b"".join(f.frame(f.PING, 0, 0, i.to_bytes(8, "big")) for i in range(limit)))
    acks: list[bytes] = []
    answered = False
    while len(acks) < limit or not answered:
        got = await peer.frame()
        assert got is not None
        if got.kind == f.PING:
            assert got.flags == f.ACK
            acks.append(got.payload)
        else:
            assert got.kind in (f.HEADERS, f.DATA)
            assert got.sid == 1
            answered = bool(got.flags & f.END_STREAM)
    assert acks == [i.to_bytes(8, "big") for i in range(limit)]
    peer.send(f.frame(f.PING, 0, 0, b"one more"))  # the 10,001st
    assert await peer.goaway() == (1, f.ENHANCE_YOUR_CALM)


async def test_the_prefaces_settings_and_10000_pings_are_enhance_your_calm(peer: Peer) -> None:
    peer.send(b"".join(f.frame(f.PING, 0, 0, b"pingpong") for _ in range(connection.MAX_CONTROL_FRAMES)))
    assert await peer.goaway() == (0, f.ENHANCE_YOUR_CALM)


# --- flow control -----------------------------------------------------------------------------------
async def test_a_window_update_past_2_31_minus_1_is_flow_control_error(peer: Peer) -> None:
    peer.send(f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW))  # exactly 2^31-1: taken
    assert await peer.ping() == []
    peer.send(f.window_update(0, 1))
    assert await peer.goaway() == (0, f.FLOW_CONTROL_ERROR)


async def test_a_stream_window_update_past_2_31_minus_1_resets_the_stream(peer: Peer) -> None:
    peer.send(f.frame(f.HEADERS, f.END_HEADERS, 1, request_block()), f.window_update(1, f.MAX_WINDOW))
    assert await peer.ping() == [Frame(f.RST_STREAM, 0, 1, f.U32.pack(f.FLOW_CONTROL_ERROR))]
    peer.send(call(3, "next"))
    response, _ = await answer(peer, 3)
    assert response.status.message == "next"


async def test_an_initial_window_setting_past_2_31_minus_1_is_flow_control_error(peer: Peer) -> None:
    peer.send(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: f.MAX_WINDOW + 1}))
    assert await peer.goaway() == (0, f.FLOW_CONTROL_ERROR)


async def test_data_beyond_the_streams_window_is_flow_control_error() -> None:
    # Frames larger than the stream's window (1 MiB) let one frame overrun it.
    served = await serve(max_frame_size=4 << 20)
    try:
        peer = await open_peer(served.port)
        window = server_side(served).stream_window
        assert window == 1 << 20
        peer.send(f.frame(f.HEADERS, f.END_HEADERS, 1, request_block()), f.frame(f.DATA, 0, 1, bytes(window + 1)))
        assert await peer.ping() == [Frame(f.RST_STREAM, 0, 1, f.U32.pack(f.FLOW_CONTROL_ERROR))]
        peer.send(call(3, "next"))  # a stream error: the connection goes on
        response, _ = await answer(peer, 3)
        assert response.status.message == "next"
        peer.close()
        await still_served(served.port)
    finally:
        await served.server.close(grace=0)


async def test_a_server_stream_is_written_only_as_far_as_the_windows_allow(
    served: Served, peer: Peer, seed: int
) -> None:
    rng = random.Random(seed)
    served.servicer.bodies = [rng.randbytes(100 * 1024) for _ in range(10)]
    peer.send(
        f.frame(f.HEADERS, f.END_HEADERS, 1, request_block("ReceiveMessage")),
        f.frame(f.DATA, f.END_STREAM, 1, message(rpc.ReceiveMessageRequest(batch_size=10))),
    )
    granted = f.DEFAULT_WINDOW  # both windows: the connection's and the stream's
    received = bytearray()
    trailers = None
    headers = await peer.until(f.HEADERS)
    assert (headers.sid, headers.flags) == (1, f.END_HEADERS)
    # The handler has run once the first DATA is here: what the windows allowed left in that turn.
    arrived = [await peer.until(f.DATA)]
    while trailers is None:
        for got in arrived + await peer.ping():
            assert got.sid in (0, 1)
            if got.kind == f.DATA:
                assert len(got.payload) <= f.DEFAULT_MAX_FRAME_SIZE
                received += got.payload
            elif got.kind == f.HEADERS and got.flags & f.END_STREAM:
                trailers = got
        assert len(received) <= granted
        if trailers is None:
            assert len(received) == granted, "the server stopped short of the windows"
            step = rng.randrange(1, 300_000)
            peer.send(f.window_update(0, step), f.window_update(1, step))
            granted += step
        arrived = []
    pos, bodies = 0, []
    while pos < len(received):
        _, length = MESSAGE_PREFIX.unpack_from(received, pos)
        bodies.append(rpc.ReceiveMessageResponse.FromString(bytes(received[pos + 5 : pos + 5 + length])).message.body)
        pos += 5 + length
    assert bodies == served.servicer.bodies


# --- streams ----------------------------------------------------------------------------------------
async def test_a_stream_above_the_concurrent_limit_is_refused(served: Served, peer: Peer) -> None:
    limit = served.server.max_concurrent_streams
    assert limit == 256
    headers = f.frame(f.HEADERS, f.END_HEADERS, 1, request_block())  # no END_STREAM: the call stays open
    peer.send(*(headers[:5] + (2 * i + 1).to_bytes(4, "big") + headers[9:] for i in range(limit + 1)))
    extra = 2 * limit + 1
    assert await peer.ping() == [Frame(f.RST_STREAM, 0, extra, f.U32.pack(f.REFUSED_STREAM))]
    # The streams taken are served; once one ends, a new stream is taken again.
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, message(route("first"))))
    response, _ = await answer(peer, 1)
    assert response.status.message == "first"
    peer.send(call(extra + 2, "again"))
    response, _ = await answer(peer, extra + 2)
    assert response.status.message == "again"
