"""A gRPC server on Orbit's own HTTP/2 (``connection.H2Connection``): calls of one protobuf service,
dispatched to a servicer whose methods have grpcio's asyncio signatures, ``async def M(request,
context)`` for unary calls and async generators for streamed answers, so the same servicer class
runs here and under ``grpc.aio`` (the cluster proxy). A unary handler may also return its answer
serialized already (``bytes``), a streaming one yield several answers framed already (``Framed``),
and a unary method the servicer names in ``raw_requests`` is handed its request unparsed.

A call (RFC 9113 stream; gRPC over HTTP/2's framing):

    HEADERS  :method POST, :path /<service>/<method>, content-type application/grpc[+proto], ...
    DATA     [compressed flag (1)][length (4)][message] ...   (END_STREAM on the last)
    answer:  HEADERS :status 200  DATA (messages)  HEADERS grpc-status, grpc-message (END_STREAM)

Refusals are answered as gRPC statuses: an unknown method UNIMPLEMENTED, a compressed message
UNIMPLEMENTED (no encoding is offered), a message above ``max_message_bytes`` RESOURCE_EXHAUSTED
(refused from its length prefix, before it is buffered), metadata above the limit
RESOURCE_EXHAUSTED, a unary call with other than one message INTERNAL, a message protobuf cannot
parse INTERNAL, a call past its ``grpc-timeout`` DEADLINE_EXCEEDED, a servicer error UNKNOWN.
A client-streamed call buffers at most ``MAX_QUEUED_REQUESTS`` messages its handler has not read.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from data_plane.http2 import frames as f
from data_plane.http2.connection import H2Connection, Stream
from data_plane.http2.hpack import HeaderListTooLarge, encode_indexed, encode_literal, encode_literal_indexed_name

log = logging.getLogger(__name__)

# gRPC status codes.
OK: Final = 0
CANCELLED: Final = 1
UNKNOWN: Final = 2
DEADLINE_EXCEEDED: Final = 4
RESOURCE_EXHAUSTED: Final = 8
UNIMPLEMENTED: Final = 12
INTERNAL: Final = 13
UNAVAILABLE: Final = 14

MESSAGE_PREFIX: Final = struct.Struct(">BI")
assert MESSAGE_PREFIX.size == 5
MAX_QUEUED_REQUESTS: Final = 256
TIMEOUT_RE: Final = re.compile(r"([0-9]{1,8})([HMSmun])")
TIMEOUT_UNITS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}

RESPONSE_HEADERS: Final = encode_indexed(8) + encode_literal_indexed_name(31, b"application/grpc")
TRAILERS_OK: Final = encode_literal(b"grpc-status", b"0")


def trailers(code: int, message: str = "") -> bytes:
    block = encode_literal(b"grpc-status", str(code).encode())
    if message:
        block += encode_literal(b"grpc-message", percent_encode(message[:512]))
    return block


def percent_encode(text: str) -> bytes:
    """gRPC's grpc-message encoding: printable ASCII but '%' as is, other bytes as %XX."""
    out = bytearray()
    for b in text.encode():
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


class Framed(bytes):
    """gRPC messages serialized and framed already (each after its 5-byte prefix, ``framed``),
    which a streaming handler yields to send several answers as one write."""


def framed(payload: bytes) -> bytes:
    """``payload`` (a serialized message) after its gRPC prefix: uncompressed, its length."""
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload


class CallError(Exception):
    """A call that ends with a gRPC status other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    handler: Callable[..., Any]
    request: type[Message]
    client_streaming: bool
    server_streaming: bool
    raw: bool = False  # the handler takes the request's bytes and parses them itself


def method_table(servicer: object, service: ServiceDescriptor) -> dict[str, Method]:
    """``/<package>.<Service>/<Method>`` -> the servicer's handler and the request's class. A
    unary method the servicer names in ``raw_requests`` is handed the request's bytes, unparsed
    (the handler may read them faster than a parse, and parses them when it cannot)."""
    table = {}
    raw = frozenset(getattr(servicer, "raw_requests", ()))
    for m in service.methods:
        table[f"/{service.full_name}/{m.name}"] = Method(
            m.name,
            getattr(servicer, m.name),
            message_factory.GetMessageClass(m.input_type),
            bool(m.client_streaming),
            bool(m.server_streaming),
            m.name in raw and not m.client_streaming,
        )
    return table


class CallContext:
    """What a handler may ask about its call (the part of ``grpc.aio.ServicerContext`` used)."""

    __slots__ = ("_deadline", "_metadata", "_peer")

    def __init__(self, metadata: tuple[tuple[str, str], ...], peer: str, deadline: float | None) -> None:
        self._metadata = metadata
        self._peer = peer
        self._deadline = deadline

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())


class Call(Stream):
    __slots__ = ("buf", "context", "method", "queue", "request", "started", "task", "timer")

    def __init__(self, stream_id: int, send_window: int, recv_window: int, method: Method) -> None:
        super().__init__(stream_id, send_window, recv_window)
        self.method = method
        self.buf = bytearray()
        self.request: Message | bytes | None = None
        self.queue: asyncio.Queue[Message | None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.context: CallContext | None = None
        self.started = False  # response headers sent


class ServerConnection(H2Connection):
    def __init__(self, server: GrpcServer) -> None:
        super().__init__(
            max_header_list=server.max_metadata_bytes,
            max_concurrent_streams=server.max_concurrent_streams,
            max_frame_size=server.max_frame_size,
        )
        self.server = server
        self.before_write = server.before_write
        self.last_id = 0
        self.going_away = False
        self.peer_label = "unknown"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(self.server.connections) >= self.server.max_connections:
            log.warning(
                "refused a gRPC connection from %s: %d connections open", self.peer, len(self.server.connections)
            )
            self.close()
            return
        self.server.connections.add(self)
        host, _, port = self.peer.rpartition(":")
        self.peer_label = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def lost(self) -> None:
        self.server.connections.discard(self)
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()

    def known_stream(self, sid: int) -> bool:
        return sid <= self.last_id

    def last_stream_id(self) -> int:
        return self.last_id

    # --- a call arrives -------------------------------------------------------------------------
    def stream_headers(self, sid: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from a client: only END_STREAM means something
            if not end_stream:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "a second header block without END_STREAM")
            stream.remote_closed = True
            assert isinstance(stream, Call)
            self._ended(stream)
            self._maybe_forget(stream)
            return
        if not sid & 1 or sid <= self.last_id:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, f"stream {sid} is not a new client stream")
        self.last_id = sid
        if self.going_away or len(self.streams) >= self.max_concurrent_streams:
            self.emit(f.rst_stream(sid, f.REFUSED_STREAM))
            return
        path, method, content_type, timeout, metadata = _request_headers(headers)
        m = self.server.methods.get(path)
        call = Call(sid, self.peer_initial_window, self.stream_window, m or _NO_METHOD)
        call.remote_closed = end_stream
        self.streams[sid] = call
        if method != "POST" or not content_type.startswith("application/grpc"):
            self._finish(call, UNIMPLEMENTED, "not a gRPC request (POST, content-type application/grpc)")
            return
        if m is None:
            self._finish(call, UNIMPLEMENTED, f"method {path[:128]!r} is not served here")
            return
        self._start(call, m, timeout, metadata, end_stream)

    def _start(self, call: Call, m: Method, timeout: str, metadata: tuple[tuple[str, str], ...], end: bool) -> None:
        deadline = None
        if timeout:
            match = TIMEOUT_RE.fullmatch(timeout)
            if match is None:
                self._finish(call, INTERNAL, "a malformed grpc-timeout")
                return
            seconds = int(match.group(1)) * TIMEOUT_UNITS[match.group(2)]
            deadline = self.loop.time() + seconds
            call.timer = self.loop.call_later(seconds, self._deadline, call)
        call.context = CallContext(metadata, self.peer_label, deadline)
        if m.client_streaming:
            call.queue = asyncio.Queue()
            call.task = self.loop.create_task(self._streaming_in(call))
            if end:
                call.queue.put_nowait(None)
        elif end:
            self._finish(call, INTERNAL, "a unary call carries exactly one message; this one has none")

    def stream_too_large(self, sid: int, end_stream: bool, error: HeaderListTooLarge) -> None:
        if not sid & 1 or sid <= self.last_id:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, f"stream {sid} is not a new client stream")
        self.last_id = sid
        call = Call(sid, self.peer_initial_window, self.stream_window, _NO_METHOD)
        call.remote_closed = end_stream
        self.streams[sid] = call
        self._finish(call, RESOURCE_EXHAUSTED, f"metadata of {error.size} bytes; at most {error.limit} are taken")

    def stream_data(self, stream: Stream, data: memoryview, end_stream: bool) -> None:
        assert isinstance(stream, Call)
        call = stream
        if call.local_closed:  # answered already (refused): what follows is dropped
            return
        buf = call.buf
        if data:
            if not buf and len(data) >= 5:
                self._messages(call, data)  # (the common case: whole messages in one frame)
            else:
                buf += data
                if len(buf) >= 5:
                    self._messages(call, memoryview(buf))
        if end_stream and not call.local_closed:
            self._ended(call)

    def _messages(self, call: Call, data: memoryview) -> None:
        """Takes the whole messages at the front of ``data``; keeps the rest in ``call.buf``."""
        pos = 0
        n = len(data)
        limit = self.server.max_message_bytes
        m = call.method
        try:
            while n - pos >= 5:
                compressed, length = MESSAGE_PREFIX.unpack_from(data, pos)
                if compressed:
                    self._finish(call, UNIMPLEMENTED, "compressed messages are not accepted (no grpc-encoding)")
                    return
                if length > limit:
                    self._finish(call, RESOURCE_EXHAUSTED, f"a message of {length} bytes; at most {limit} are taken")
                    return
                if n - pos - 5 < length:
                    break
                request: Message | bytes
                try:
                    if m.raw:
                        request = data[pos + 5 : pos + 5 + length].tobytes()
                    else:
                        request = m.request.FromString(data[pos + 5 : pos + 5 + length])  # type: ignore[arg-type]
                except DecodeError:
                    self._finish(call, INTERNAL, f"the request is not a valid {m.request.__name__}")
                    return
                pos += 5 + length
                if call.queue is not None:
                    if call.queue.qsize() >= MAX_QUEUED_REQUESTS:
                        self._finish(call, RESOURCE_EXHAUSTED, "too many messages not yet read")
                        return
                    call.queue.put_nowait(cast(Message, request))  # (raw: unary methods only)
                elif call.request is not None:
                    self._finish(call, INTERNAL, "a unary call carries exactly one message; this one has more")
                    return
                else:
                    call.request = request
        finally:
            rest = data[pos:].tobytes() if pos < n else b""
            data.release()
            call.buf[:] = rest

    def _ended(self, call: Call) -> None:
        """The client has sent all it will: a unary call starts, a streamed one's input ends."""
        if call.local_closed:
            return
        if call.buf:
            self._finish(call, INTERNAL, "the request ends inside a message")
            return
        if call.queue is not None:
            call.queue.put_nowait(None)
            return
        if call.request is None:
            self._finish(call, INTERNAL, "a unary call carries exactly one message; this one has none")
            return
        runner = self._streaming_out if call.method.server_streaming else self._unary
        call.task = self.loop.create_task(runner(call, call.request))
        call.request = None

    # --- answering ------------------------------------------------------------------------------
    async def _unary(self, call: Call, request: Message | bytes) -> None:
        try:
            response = await call.method.handler(request, call.context)
        except asyncio.CancelledError:
            return
        except CallError as e:
            self._finish(call, e.code, e.message)
            return
        except Exception:
            log.exception("gRPC %s failed", call.method.name)
            self._finish(call, UNKNOWN, "the server failed to answer")
            return
        if call.local_closed:
            return
        self._answer(call, response if type(response) is bytes else response.SerializeToString())

    def _answer(self, call: Call, payload: bytes) -> None:
        self._end_timer(call)
        self.send_whole(call, RESPONSE_HEADERS, MESSAGE_PREFIX.pack(0, len(payload)) + payload, TRAILERS_OK)
        self._after_answer(call)

    async def _streaming_out(self, call: Call, request: Message | bytes) -> None:
        await self._stream(call, call.method.handler(request, call.context))

    async def _streaming_in(self, call: Call) -> None:
        queue = call.queue
        assert queue is not None

        async def requests() -> AsyncIterator[Message]:
            while (item := await queue.get()) is not None:
                yield item

        if call.method.server_streaming:
            await self._stream(call, call.method.handler(requests(), call.context))
            return
        try:
            response = await call.method.handler(requests(), call.context)
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("gRPC %s failed", call.method.name)
            self._finish(call, UNKNOWN, "the server failed to answer")
            return
        if not call.local_closed:
            self._answer(call, response if type(response) is bytes else response.SerializeToString())

    async def _stream(self, call: Call, responses: AsyncIterator[Message | Framed]) -> None:
        code, text = OK, ""
        try:
            async for response in responses:
                if call.local_closed:
                    break
                if not call.started:
                    call.started = True
                    self.send_headers(call, RESPONSE_HEADERS)
                if isinstance(response, Framed):
                    self.send_data(call, response)
                else:
                    payload = response.SerializeToString()
                    self.send_data(call, MESSAGE_PREFIX.pack(0, len(payload)) + payload)
        except asyncio.CancelledError:
            return
        except CallError as e:
            code, text = e.code, e.message
        except Exception:
            log.exception("gRPC %s failed", call.method.name)
            code, text = UNKNOWN, "the server failed to answer"
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()
        if not call.local_closed:
            self._finish(call, code, text)

    def _finish(self, call: Call, code: int, message: str) -> None:
        """Ends ``call`` with a status: trailers after what was sent, or a trailers-only answer."""
        if call.local_closed:
            return
        self._end_timer(call)
        if call.started:
            self.send_headers(call, trailers(code, message), end_stream=True)
        else:
            call.started = True
            self.send_headers(call, RESPONSE_HEADERS + trailers(code, message), end_stream=True)
        if code != OK and call.task is not None and call.task is not asyncio.current_task():
            call.task.cancel()
        self._after_answer(call)

    def _after_answer(self, call: Call) -> None:
        if not call.remote_closed:
            # The client is still sending (a refused call, or a streamed one ended early): tell it
            # to stop once what is queued for it has left.
            if call.pending:
                return
            self.emit(f.rst_stream(call.id, f.NO_ERROR))
            call.remote_closed = True
            self._maybe_forget(call)

    def _deadline(self, call: Call) -> None:
        call.timer = None
        if not call.local_closed:
            self._finish(call, DEADLINE_EXCEEDED, "the call's deadline passed")
            if call.task is not None:
                call.task.cancel()

    @staticmethod
    def _end_timer(call: Call) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None

    def stream_reset(self, stream: Stream, code: int) -> None:
        assert isinstance(stream, Call)
        self._cancel(stream)

    def _cancel(self, call: Stream) -> None:
        assert isinstance(call, Call)
        self._end_timer(call)
        call.local_closed = True
        if call.task is not None and not call.task.done():
            call.task.cancel()
        if call.queue is not None:
            call.queue.put_nowait(None)

    def goaway(self, last_stream_id: int, code: int) -> None:
        self.going_away = True

    def shut(self) -> None:
        """Stops taking calls: GOAWAY naming the last stream taken."""
        if not self.going_away and not self.closed:
            self.going_away = True
            self.emit(f.goaway(self.last_id, f.NO_ERROR))


def _request_headers(headers: list[tuple[str, str]]) -> tuple[str, str, str, str, tuple[tuple[str, str], ...]]:
    """(:path, :method, content-type, grpc-timeout, the rest: the call's metadata)."""
    path = method = content_type = timeout = ""
    metadata = []
    for name, value in headers:
        if name[0] == ":":
            if name == ":path":
                path = value
            elif name == ":method":
                method = value
        elif name == "content-type":
            content_type = value
        elif name == "grpc-timeout":
            timeout = value
        elif name != "te":
            metadata.append((name, value))
    return path, method, content_type, timeout, tuple(metadata)


async def _no_method(request: Message, context: CallContext) -> Message:
    raise CallError(UNIMPLEMENTED, "no such method")


_NO_METHOD: Final = Method("", _no_method, Message, False, False)


class GrpcServer:
    """Serves one protobuf service's calls on a TCP port, with TLS (ALPN ``h2``) when given;
    ``before_write`` runs before any answer leaves (the broker makes its appends durable there)."""

    def __init__(
        self,
        servicer: object,
        service: ServiceDescriptor,
        *,
        max_message_bytes: int,
        max_metadata_bytes: int = 16 * 1024,
        max_concurrent_streams: int = 256,
        max_connections: int = 10_000,
        max_frame_size: int = 1 << 20,
        ssl_context: ssl.SSLContext | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self.methods = method_table(servicer, service)
        self.max_message_bytes = max_message_bytes
        self.max_metadata_bytes = max_metadata_bytes
        self.max_concurrent_streams = max_concurrent_streams
        self.max_connections = max_connections
        self.max_frame_size = max_frame_size
        self.ssl_context = ssl_context
        self.before_write = before_write
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        self.connections: set[ServerConnection] = set()
        self._server: asyncio.Server | None = None

    async def listen(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), host, port, ssl=self.ssl_context, backlog=1024
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, grace: float = 0.5) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shut()
        deadline = asyncio.get_running_loop().time() + grace
        while any(c.streams for c in self.connections) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 - a grace period, not an event
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
