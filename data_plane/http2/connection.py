"""One HTTP/2 connection over an ``asyncio.Protocol``: frame parsing, settings, PING, GOAWAY,
HPACK decoding of header blocks, and flow control in both directions. What streams carry (gRPC
calls) belongs to the subclasses (``grpc_server.ServerConnection``, ``grpc_client.ClientConnection``).

Everything this side writes goes through ``emit``, which gathers the frames of one turn of the
event loop into a single ``transport.write``. Data waits for the peer's windows; a stream's
trailers wait behind its data. A peer that stops reading stops being read
(``pause_writing`` pauses reading), so a connection buffers at most one partial frame in and the
transport's high-water mark out.

Bounds a hostile peer meets: frames above the advertised SETTINGS_MAX_FRAME_SIZE, header blocks
above ``max_header_block`` bytes on the wire (CONTINUATION included), data beyond the windows
this side granted, more than ``MAX_CONTROL_FRAMES`` PING and SETTINGS frames without a stream
frame between them, and a connection that has not sent its preface within
``PREFACE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Callable
from typing import Final

from data_plane.http2 import frames as f
from data_plane.http2.hpack import Decoder, HeaderListTooLarge, HpackError

log = logging.getLogger(__name__)

PREFACE_TIMEOUT_S: Final = 10.0
MAX_CONTROL_FRAMES: Final = 10_000
WRITE_HIGH_WATER: Final = 1 << 20


class Stream:
    """One stream's flow-control state and what it has yet to write."""

    __slots__ = ("id", "local_closed", "pending", "recv_unacked", "recv_window", "remote_closed", "send_window")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_unacked = 0
        # (True, header block, end stream) or (False, data, end stream), in the order written.
        self.pending: deque[tuple[bool, bytes, bool]] = deque()
        self.remote_closed = False
        self.local_closed = False


class H2Connection(asyncio.Protocol):
    """The protocol half both ends share. Subclasses implement ``stream_headers``,
    ``stream_data``, ``stream_reset`` and ``stream_too_large`` and may react to ``goaway``."""

    client_side = False

    def __init__(
        self,
        *,
        stream_window: int = 1 << 20,
        connection_window: int = 16 << 20,
        max_frame_size: int = f.DEFAULT_MAX_FRAME_SIZE,
        max_header_list: int = 16 * 1024,
        max_concurrent_streams: int = 256,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.decoder = Decoder(max_list_size=max_header_list)
        # What this side grants and takes.
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.max_frame_in = max_frame_size
        self.max_header_block = max_header_list * 2 + 1024
        self.max_concurrent_streams = max_concurrent_streams
        self.recv_window = connection_window
        self.recv_unacked = 0
        # What the peer grants and takes.
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME_SIZE
        self.peer_max_streams = 100
        self.send_window = f.DEFAULT_WINDOW
        self.blocked: dict[int, Stream] = {}
        self._buf = bytearray()
        self._preface_pending = not self.client_side
        self._headers_for = 0  # a header block is being continued on this stream
        self._headers_flags = 0
        self._headers_buf = bytearray()
        self._control_frames = 0
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._reading_paused = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.peer = "unknown"
        # Called before each write to the socket: a server makes what its answers acknowledge
        # durable here, once for every answer that leaves together.
        self.before_write: Callable[[], None] | None = None

    # --- transport events ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is not an asyncio.Transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.peer = f"{peername[0]}:{peername[1]}"
        if self.client_side:
            self.emit(f.PREFACE)
        else:
            self._preface_timer = self.loop.call_later(PREFACE_TIMEOUT_S, self._preface_late)
        self.emit(
            f.settings(
                {
                    f.SETTINGS_ENABLE_PUSH: 0,
                    f.SETTINGS_MAX_CONCURRENT_STREAMS: self.max_concurrent_streams,
                    f.SETTINGS_INITIAL_WINDOW_SIZE: self.stream_window,
                    f.SETTINGS_MAX_FRAME_SIZE: self.max_frame_in,
                    f.SETTINGS_MAX_HEADER_LIST_SIZE: self.decoder.max_list_size,
                }
            )
        )
        if self.connection_window > f.DEFAULT_WINDOW:
            self.emit(f.window_update(0, self.connection_window - f.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        self.lost()

    def pause_writing(self) -> None:
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def _preface_late(self) -> None:
        if self._preface_pending:
            self.close()

    # --- reading --------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        buf = self._buf
        buf += data
        if self._preface_pending:
            n = min(len(buf), len(f.PREFACE))
            if buf[:n] != f.PREFACE[:n]:
                self.close()  # not HTTP/2 with prior knowledge: nothing to answer
                return
            if n < len(f.PREFACE):
                return
            del buf[: len(f.PREFACE)]
            self._preface_pending = False
            if self._preface_timer is not None:
                self._preface_timer.cancel()
                self._preface_timer = None
        try:
            self._frames(buf)
        except f.ConnectionError_ as e:
            self.fail(e.code, e.reason)

    def _frames(self, buf: bytearray) -> None:
        pos = 0
        end = len(buf)
        unpack = f.FRAME_HEADER.unpack_from
        view = memoryview(buf)
        try:
            while end - pos >= f.FRAME_HEADER_SIZE:
                word, flags, sid = unpack(buf, pos)
                length = word >> 8
                if length > self.max_frame_in:
                    raise f.ConnectionError_(f.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                start = pos + f.FRAME_HEADER_SIZE
                if end - start < length:
                    break
                pos = start + length
                self._frame(word & 0xFF, flags, sid & 0x7FFFFFFF, view[start:pos])
                if self.closed:
                    break
        finally:
            view.release()
        # Not in the finally: a connection error's traceback still holds the frame's payload (a view
        # of ``buf``), and a bytearray with a view alive cannot be resized. The connection fails and
        # reads nothing more then, so what is left in ``buf`` does not matter.
        if pos:
            del buf[:pos]

    def _frame(self, kind: int, flags: int, sid: int, payload: memoryview) -> None:
        if self._headers_for and kind != f.CONTINUATION:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == f.DATA:
            self._control_frames = 0
            self._data(flags, sid, payload)
        elif kind == f.HEADERS:
            self._control_frames = 0
            self._headers(flags, sid, payload)
        elif kind == f.CONTINUATION:
            if sid != self._headers_for or not sid:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
            self._headers_buf += payload
            if len(self._headers_buf) > self.max_header_block:
                raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, "a header block above the limit")
            if flags & f.END_HEADERS:
                block = bytes(self._headers_buf)
                self._headers_buf.clear()
                self._headers_for = 0
                self._header_block(sid, self._headers_flags, block)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, payload)
        else:
            self._control_frame(kind, flags, sid, payload)

    def _control_frame(self, kind: int, flags: int, sid: int, payload: memoryview) -> None:
        if kind == f.SETTINGS:
            self._control()
            self._settings(flags, sid, payload)
        elif kind == f.PING:
            self._control()
            if sid or len(payload) != 8:
                raise f.ConnectionError_(f.PROTOCOL_ERROR if sid else f.FRAME_SIZE_ERROR, "a malformed PING")
            if not flags & f.ACK:
                self.emit(f.frame(f.PING, f.ACK, 0, bytes(payload)))
        elif kind == f.RST_STREAM:
            if not sid or len(payload) != 4:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "a malformed RST_STREAM")
            stream = self.streams.pop(sid, None)
            self.blocked.pop(sid, None)
            if stream is not None:
                self.stream_reset(stream, f.U32.unpack(payload)[0])
        elif kind == f.GOAWAY:
            if sid or len(payload) < 8:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "a malformed GOAWAY")
            last, code = f.GOAWAY_HEAD.unpack_from(payload)
            self.goaway(last & 0x7FFFFFFF, code)
        elif kind == f.PRIORITY:
            if not sid or len(payload) != f.PRIORITY_FIELDS_SIZE:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "a malformed PRIORITY")
        elif kind == f.PUSH_PROMISE:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "PUSH_PROMISE, with push disabled")
        # Frames of other types are ignored (RFC 9113 section 4.1).

    def _control(self) -> None:
        self._control_frames += 1
        if self._control_frames > MAX_CONTROL_FRAMES:
            raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, "too many control frames without a stream frame")

    def _data(self, flags: int, sid: int, payload: memoryview) -> None:
        if not sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
        n = len(payload)
        self.recv_window -= n
        if self.recv_window < 0:
            raise f.ConnectionError_(f.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self.recv_unacked += n
        if self.recv_unacked >= self.connection_window >> 2:
            self.emit(f.window_update(0, self.recv_unacked))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        stream = self.streams.get(sid)
        if stream is None:
            if not self.known_stream(sid):
                raise f.ConnectionError_(f.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            return  # a stream this side closed: the peer had not heard yet
        if stream.remote_closed:
            self.reset(stream, f.STREAM_CLOSED)
            return
        stream.recv_window -= n
        if stream.recv_window < 0:
            self.reset(stream, f.FLOW_CONTROL_ERROR)
            return
        end = bool(flags & f.END_STREAM)
        if end:
            stream.remote_closed = True
        elif n:
            stream.recv_unacked += n
            if stream.recv_unacked >= self.stream_window >> 2:
                self.emit(f.window_update(sid, stream.recv_unacked))
                stream.recv_window += stream.recv_unacked
                stream.recv_unacked = 0
        self.stream_data(stream, f.strip_padding(flags, payload), end)
        self._maybe_forget(stream)

    def _headers(self, flags: int, sid: int, payload: memoryview) -> None:
        if not sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        body = f.strip_padding(flags, payload)
        if flags & f.PRIORITY_FLAG:
            if len(body) < f.PRIORITY_FIELDS_SIZE:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "HEADERS too short for its priority")
            body = body[f.PRIORITY_FIELDS_SIZE :]
        if len(body) > self.max_header_block:
            raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, "a header block above the limit")
        if flags & f.END_HEADERS:
            self._header_block(sid, flags, bytes(body))
        else:
            self._headers_for = sid
            self._headers_flags = flags
            self._headers_buf[:] = body

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        end = bool(flags & f.END_STREAM)
        try:
            headers = self.decoder.decode(block)
        except HpackError as e:
            raise f.ConnectionError_(f.COMPRESSION_ERROR, str(e)) from None
        except HeaderListTooLarge as e:
            self.stream_too_large(sid, end, e)
            return
        self.stream_headers(sid, headers, end)

    def _window_update(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise f.ConnectionError_(f.FRAME_SIZE_ERROR, "a WINDOW_UPDATE of other than 4 bytes")
        inc = f.U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if not inc:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
            self.send_window += inc
            if self.send_window > f.MAX_WINDOW:
                raise f.ConnectionError_(f.FLOW_CONTROL_ERROR, "the connection's window above 2^31-1")
            for waiting in list(self.blocked.values()):
                self._drain(waiting)
                if self.send_window <= 0:
                    break
            return
        stream = self.streams.get(sid)
        if stream is None:
            return
        if not inc:
            self.reset(stream, f.PROTOCOL_ERROR)
            return
        stream.send_window += inc
        if stream.send_window > f.MAX_WINDOW:
            self.reset(stream, f.FLOW_CONTROL_ERROR)
            return
        if stream.pending:
            self._drain(stream)

    def _settings(self, flags: int, sid: int, payload: memoryview) -> None:
        if sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise f.ConnectionError_(f.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        grew = False
        for key, value in f.parse_settings(payload):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > f.MAX_WINDOW:
                        raise f.ConnectionError_(f.FLOW_CONTROL_ERROR, "a stream's window above 2^31-1")
                grew = grew or delta > 0
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self.emit(f.SETTINGS_ACK)
        if grew:
            for stream in list(self.blocked.values()):
                self._drain(stream)

    # --- writing --------------------------------------------------------------------------------
    def emit(self, data: bytes) -> None:
        """Queue bytes for the wire; they leave together at the end of this turn of the loop."""
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        self._out = []
        if self.transport is not None and not self.transport.is_closing():
            if self.before_write is not None:
                self.before_write()
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # (the only write to the socket)

    def send_headers(self, stream: Stream, block: bytes, end_stream: bool = False) -> None:
        if stream.pending:
            stream.pending.append((True, block, end_stream))
            return
        self._headers_out(stream, block, end_stream)

    def _headers_out(self, stream: Stream, block: bytes, end_stream: bool) -> None:
        flags = f.END_STREAM if end_stream else 0
        limit = self.peer_max_frame
        if len(block) <= limit:
            self.emit(f.frame_head(f.HEADERS, flags | f.END_HEADERS, stream.id, len(block)) + block)
        else:
            chunks = [block[i : i + limit] for i in range(0, len(block), limit)]
            self.emit(f.frame_head(f.HEADERS, flags, stream.id, len(chunks[0])) + chunks[0])
            for i, chunk in enumerate(chunks[1:], 2):
                last = f.END_HEADERS if i == len(chunks) else 0
                self.emit(f.frame_head(f.CONTINUATION, last, stream.id, len(chunk)) + chunk)
        if end_stream:
            self._closed_local(stream)

    def send_whole(self, stream: Stream, headers: bytes, data: bytes, trailers: bytes) -> None:
        """A whole answer: header block, data, trailer block (END_STREAM). When the windows take
        the data at once (the common case) it leaves as one piece of three frames."""
        n = len(data)
        limit = self.peer_max_frame
        if (
            stream.pending
            or not n <= stream.send_window
            or not n <= self.send_window
            or not (n <= limit and len(headers) <= limit and len(trailers) <= limit)
        ):
            self.send_headers(stream, headers)
            self.send_data(stream, data)
            self.send_headers(stream, trailers, end_stream=True)
            return
        sid = stream.id
        self.emit(
            b"".join(
                (
                    f.frame_head(f.HEADERS, f.END_HEADERS, sid, len(headers)),
                    headers,
                    f.frame_head(f.DATA, 0, sid, n),
                    data,
                    f.frame_head(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, len(trailers)),
                    trailers,
                )
            )
        )
        stream.send_window -= n
        self.send_window -= n
        self._closed_local(stream)

    def send_data(self, stream: Stream, data: bytes, end_stream: bool = False) -> None:
        """Data for ``stream``, written as far as the windows allow now and the rest later."""
        if stream.pending:
            stream.pending.append((False, data, end_stream))
            self.blocked[stream.id] = stream
        elif not self._data_out(stream, data, end_stream):
            self.blocked[stream.id] = stream

    def _data_out(self, stream: Stream, data: bytes, end_stream: bool) -> bool:
        """Writes what the windows allow; True when all of ``data`` went, else the rest waits."""
        n = len(data)
        if n <= stream.send_window and n <= self.send_window and n <= self.peer_max_frame:
            self.emit(f.frame_head(f.DATA, f.END_STREAM if end_stream else 0, stream.id, n) + data)
            stream.send_window -= n
            self.send_window -= n
            if end_stream:
                self._closed_local(stream)
            return True
        view = memoryview(data)
        pos = 0
        while pos < n:
            room = min(stream.send_window, self.send_window, self.peer_max_frame, n - pos)
            if room <= 0:
                stream.pending.append((False, bytes(view[pos:]), end_stream))
                return False
            last = pos + room == n
            flags = f.END_STREAM if last and end_stream else 0
            self.emit(f.frame_head(f.DATA, flags, stream.id, room) + view[pos : pos + room].tobytes())
            stream.send_window -= room
            self.send_window -= room
            pos += room
        if end_stream:
            self._closed_local(stream)
        return True

    def _drain(self, stream: Stream) -> None:
        pending = stream.pending
        while pending:
            is_headers, payload, end = pending.popleft()
            if is_headers:
                self._headers_out(stream, payload, end)
            elif not self._data_out(stream, payload, end):
                # _data_out queued the rest at the end; it belongs at the front.
                pending.appendleft(pending.pop())
                return
        self.blocked.pop(stream.id, None)

    def _closed_local(self, stream: Stream) -> None:
        stream.local_closed = True
        self._maybe_forget(stream)

    def _maybe_forget(self, stream: Stream) -> None:
        if stream.local_closed and stream.remote_closed and not stream.pending:
            self.streams.pop(stream.id, None)
            self.blocked.pop(stream.id, None)

    def reset(self, stream: Stream, code: int) -> None:
        """Ends ``stream`` with RST_STREAM ``code``; what it had yet to write is dropped."""
        stream.pending.clear()
        stream.local_closed = stream.remote_closed = True
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        self.emit(f.rst_stream(stream.id, code))
        self.stream_reset(stream, code)

    def fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY with ``code`` and close."""
        log.debug("HTTP/2 connection from %s failed: %s", self.peer, reason)
        self.emit(f.goaway(self.last_stream_id(), code, reason.encode()[:128]))
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._flush()
        if self.transport is not None:
            self.transport.close()

    # --- what subclasses define ---------------------------------------------------------------
    def known_stream(self, sid: int) -> bool:
        """Whether ``sid`` was opened before (so frames for it after it closed are ignored)."""
        raise NotImplementedError

    def last_stream_id(self) -> int:
        return 0

    def stream_headers(self, sid: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        raise NotImplementedError

    def stream_data(self, stream: Stream, data: memoryview, end_stream: bool) -> None:
        raise NotImplementedError

    def stream_reset(self, stream: Stream, code: int) -> None:
        """The stream ended early (the peer's RST_STREAM, or this side's)."""

    def stream_too_large(self, sid: int, end_stream: bool, error: HeaderListTooLarge) -> None:
        raise f.ConnectionError_(f.PROTOCOL_ERROR, str(error))

    def goaway(self, last_stream_id: int, code: int) -> None:
        """The peer is going away: streams above ``last_stream_id`` were not processed."""

    def lost(self) -> None:
        """The connection is gone."""
