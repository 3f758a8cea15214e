"""A small gRPC client on Orbit's HTTP/2: unary and server-streamed calls over one connection,
many in flight at once. ``orbit bench e2e`` drives the gRPC endpoint with it (grpcio's client
costs more CPU per call than the endpoint does to answer it); the official RocketMQ 5 clients
and grpcio's own client are the suite's test of compatibility.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Final, TypeVar
from urllib.parse import unquote

from google.protobuf.message import Message

from data_plane.http2 import frames as f
from data_plane.http2.connection import H2Connection, Stream
from data_plane.http2.grpc_server import MESSAGE_PREFIX, OK, UNAVAILABLE, CallError
from data_plane.http2.hpack import encode_indexed, encode_literal, encode_literal_indexed_name

M = TypeVar("M", bound=Message)
MAX_IN_FLIGHT: Final = 100  # RFC 9113 section 6.5.2's least recommended SETTINGS_MAX_CONCURRENT_STREAMS

# :method POST and :scheme http / https, from the static table.
_POST: Final = encode_indexed(3)
_SCHEMES: Final = {False: encode_indexed(6), True: encode_indexed(7)}
_FIXED: Final = encode_literal_indexed_name(31, b"application/grpc") + encode_literal(b"te", b"trailers")
SETTINGS_TIMEOUT_S: Final = 10.0


class ClientCall(Stream):
    __slots__ = ("buf", "future", "messages", "status")

    def __init__(self, stream_id: int, send_window: int, recv_window: int, future: asyncio.Future[list[bytes]]) -> None:
        super().__init__(stream_id, send_window, recv_window)
        self.future = future
        self.messages: list[bytes] = []
        self.buf = bytearray()
        self.status: dict[str, str] = {}


class ClientConnection(H2Connection):
    client_side = True

    def __init__(self, authority: str, tls: bool, max_message_bytes: int) -> None:
        super().__init__(stream_window=4 << 20, connection_window=64 << 20, max_frame_size=1 << 20)
        self.next_id = 1
        self.max_message_bytes = max_message_bytes
        self._prefix = _POST + _SCHEMES[tls] + encode_literal_indexed_name(1, authority.encode())
        self._paths: dict[str, bytes] = {}
        # The server's first SETTINGS (its preface): until then its stream limit is not known.
        self.settled: asyncio.Future[None] = self.loop.create_future()

    def _settings(self, flags: int, sid: int, payload: memoryview) -> None:
        super()._settings(flags, sid, payload)
        if not self.settled.done():
            self.settled.set_result(None)

    def known_stream(self, sid: int) -> bool:
        return sid < self.next_id

    def call(self, path: str, payload: bytes, metadata: bytes) -> asyncio.Future[list[bytes]]:
        """Starts a call; its future holds the answer's messages, or raises ``CallError``."""
        future: asyncio.Future[list[bytes]] = self.loop.create_future()
        if self.closed:
            future.set_exception(CallError(UNAVAILABLE, "the connection is closed"))
            return future
        if len(self.streams) >= self.peer_max_streams:
            future.set_exception(CallError(UNAVAILABLE, "the server's concurrent stream limit is reached"))
            return future
        sid = self.next_id
        self.next_id += 2
        call = ClientCall(sid, self.peer_initial_window, self.stream_window, future)
        self.streams[sid] = call
        block = self._paths.get(path)
        if block is None:
            block = self._paths[path] = self._prefix + encode_literal_indexed_name(4, path.encode()) + _FIXED
        self.send_headers(call, block + metadata)
        self.send_data(call, MESSAGE_PREFIX.pack(0, len(payload)) + payload, end_stream=True)
        return future

    def stream_headers(self, sid: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        call = self.streams.get(sid)
        if call is None:
            if not self.known_stream(sid):
                raise f.ConnectionError_(f.PROTOCOL_ERROR, f"HEADERS on stream {sid}, which this side never opened")
            return
        assert isinstance(call, ClientCall)
        if end_stream:
            call.remote_closed = True
            call.status = dict(headers)
            self._done(call)
            self._maybe_forget(call)

    def stream_data(self, stream: Stream, data: memoryview, end_stream: bool) -> None:
        assert isinstance(stream, ClientCall)
        call = stream
        buf = call.buf
        buf += data
        while len(buf) >= 5:
            _flag, length = MESSAGE_PREFIX.unpack_from(buf)
            if length > self.max_message_bytes:
                self._fail(call, CallError(8, f"an answer of {length} bytes"))  # (before reset's UNAVAILABLE)
                self.reset(call, f.CANCEL)
                return
            if len(buf) < 5 + length:
                break
            call.messages.append(bytes(buf[5 : 5 + length]))
            del buf[: 5 + length]
        if end_stream:
            self._done(call)

    def _done(self, call: ClientCall) -> None:
        if call.future.done():
            return
        code = int(call.status.get("grpc-status", "2") or 2)
        if code != OK:
            call.future.set_exception(CallError(code, unquote(call.status.get("grpc-message", ""))))
        else:
            call.future.set_result(call.messages)

    def _fail(self, call: ClientCall, error: Exception) -> None:
        if not call.future.done():
            call.future.set_exception(error)

    def stream_reset(self, stream: Stream, code: int) -> None:
        assert isinstance(stream, ClientCall)
        self._fail(stream, CallError(UNAVAILABLE, f"the server reset the call ({code})"))

    def goaway(self, last_stream_id: int, code: int) -> None:
        for sid, call in list(self.streams.items()):
            if sid > last_stream_id:
                assert isinstance(call, ClientCall)
                self.streams.pop(sid, None)
                self._fail(call, CallError(UNAVAILABLE, "the server went away before taking the call"))

    def lost(self) -> None:
        if not self.settled.done():
            self.settled.set_exception(CallError(UNAVAILABLE, "the connection was lost before the server's SETTINGS"))
        for call in list(self.streams.values()):
            assert isinstance(call, ClientCall)
            self._fail(call, CallError(UNAVAILABLE, "the connection was lost"))
        self.streams.clear()


class GrpcChannel:
    """One HTTP/2 connection to a gRPC server, and calls of ``/<service>/<method>`` on it."""

    def __init__(self, conn: ClientConnection, service: str) -> None:
        self.conn = conn
        self.service = service
        # Calls beyond the server's concurrent streams wait their turn (100 until its SETTINGS say).
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        service: str = "apache.rocketmq.v2.MessagingService",
        ssl_context: ssl.SSLContext | None = None,
        max_message_bytes: int = 64 << 20,
    ) -> GrpcChannel:
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        _transport, conn = await loop.create_connection(
            lambda: ClientConnection(f"{host}:{port}", ssl_context is not None, max_message_bytes),
            host,
            port,
            ssl=ssl_context,
        )
        # Calls wait for the server's SETTINGS: before them, its limit on concurrent streams is
        # not known, and calls above a guess of it would fail for nothing.
        try:
            await asyncio.wait_for(conn.settled, SETTINGS_TIMEOUT_S)
        except BaseException:
            conn.close()
            raise
        return cls(conn, service)

    @staticmethod
    def metadata(pairs: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> bytes:
        """A header block fragment for ``pairs`` (computed once by a caller that repeats them)."""
        return b"".join(encode_literal(k.encode(), v.encode()) for k, v in pairs)

    async def unary(self, method: str, request: Message | bytes, answer: type[M], metadata: bytes = b"") -> M:
        """One call; ``request`` may be given serialized already."""
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        async with self._slots:
            messages = await self.conn.call(f"/{self.service}/{method}", payload, metadata)
        if len(messages) != 1:
            raise CallError(13, f"a unary answer of {len(messages)} messages")
        return answer.FromString(messages[0])

    async def server_stream(self, method: str, request: Message, answer: type[M], metadata: bytes = b"") -> list[M]:
        async with self._slots:
            messages = await self.conn.call(f"/{self.service}/{method}", request.SerializeToString(), metadata)
        return [answer.FromString(m) for m in messages]

    def close(self) -> None:
        self.conn.close()
