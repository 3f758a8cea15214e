"""Connection: one TCP connection speaking remoting frames, both ways.

The connection owns the transport, the frame decoder, the table of requests waiting for an
answer (by ``opaque``) and the outgoing buffer; the codec (``command``) never touches a socket.

* Incoming requests go to ``dispatch(connection, command)``, which returns the response, an
  awaitable of it, or None (no answer: oneway requests, or a handler that answers later
  through ``send``). At most ``max_inflight`` awaitable requests per connection; past that the
  answer is SYSTEM_BUSY, so one client cannot pile up unbounded work. A request ``park``ed
  (a long-polling pull held until a message arrives: a wait, not work) does not count while it
  waits; what holds it bounds those (the broker's PullRequestHoldService, per connection and
  in all). A consumer holds one pull a queue, so thousands of queues means thousands parked.
* Responses written while handling one read are gathered and written together, in slices of at
  most ``answer_slice`` frames (0: one write for the whole read): a client that pipelines many
  requests on one connection gets the first answers while the rest are still being handled, so
  both ends work at once instead of taking turns. ``before_write`` (when set) runs before each
  write — the broker writes the records its store gathered from those requests there, so no
  answer leaves before what it acknowledges is in the file.
* A frame over ``max_frame_bytes`` or bytes that are not a frame close the connection; a handler
  error answers SYSTEM_ERROR (or the header error's remark) and keeps the connection.
* A connection with no traffic for ``idle_timeout_s`` is closed.
* ``invoke_frame`` writes a request its caller laid out (head and body, the opaque from
  ``next_opaque``) and gives the answer to a waiter — anything with a future's ``done``,
  ``set_result`` and ``set_exception`` — inline, in the read that brought it: the SDK's send
  path, which resolves its own future there without a callback scheduled in between.
* Our requests' timeouts share one timer: requests wait in a queue per timeout value (so in
  deadline order), and the timer is set for the earliest deadline still waiting; answered
  requests leave the front of their queue as new ones arrive. No timer is made per request.
* Back-pressure (server side): while the peer does not read what we write (the transport's buffer is over its
  high-water mark), we stop reading from it, so a stalled client cannot make us buffer without end.
* Inbound limits (server side, ``guard``: ``limits.py``): the connection is counted by source
  address as it opens (or closed at once), and an incomplete frame reserves its size when its
  length prefix is in (or the connection is closed). The check runs once a read, on the decoder's
  ``pending`` (a few integer comparisons); the guard is asked only when a frame starts, learns
  its length or ends. ``proven`` (see limits.py) is set by the first complete frame when
  ``prove_on_frame``, else by the server's ``before`` check letting a request through.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from data_plane.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from data_plane.remoting.command import (
    BODY_VIEW_BYTES,
    FRAME_LENGTH,
    MAX_FRAME_BYTES,
    Body,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    RemotingCommand,
    compiled_decode_frame,
    compiled_frame_head,
    decode_frame,
    encode,
)
from data_plane.remoting.errors import (
    HeaderError,
    RemotingConnectError,
    RemotingTimeoutError,
    RemotingTooMuchRequestError,
)
from data_plane.remoting.limits import FRAME_COMPLETE_TIMEOUT, MALFORMED_FRAME, InboundGuard
from data_plane.remoting.limits import MAX_FRAME_BYTES as REFUSED_FRAME_BYTES

if TYPE_CHECKING:  # (the fair share is the broker's: clients do not load it)
    from data_plane.remoting.fair_share import TenantShare

log = logging.getLogger(__name__)


class Waiter(Protocol):
    """What waits for a request's answer: a future, or an object answering the same three
    calls (``invoke_frame``'s), whose ``set_result`` runs inline in the read."""

    def done(self) -> bool: ...

    def set_result(self, result: RemotingCommand, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


Dispatch = Callable[["Connection", RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"]
# Handles a request straight from its frame's bytes and returns its answer's whole frame, or
# None (nothing done) to leave the frame to the command path: decode, then dispatch.
FrameHandler = Callable[["Connection", Body], "bytes | None"]

IDLE_TIMEOUT_S = 120.0
MAX_INFLIGHT = 4096  # awaitable requests being handled per connection
MAX_PENDING = 65536  # our own requests waiting for answers per connection
WRITE_HIGH_WATER = 8 * 1024 * 1024
_JOIN_BELOW_BYTES = 16 * 1024
_compiled_decode = compiled_decode_frame
_frame_head = compiled_frame_head
# Frames one read's answers gather before they are written (docs/broker.md, "Answers in slices"):
# fewer means more writes, more means the client waits longer for the first answers.
ANSWER_SLICE = 4


TLS_READ_BUFFER_BYTES = 256 * 1024  # what TlsReader decrypts into at most, a read
TLS_FRAME_DIRECT_BYTES = 64 * 1024  # a frame this large is decrypted into its own buffer (TlsReader)


class Connection(asyncio.Protocol):
    def __init__(
        self,
        dispatch: Dispatch | None = None,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_inflight: int = MAX_INFLIGHT,
        on_close: Callable[[Connection], None] | None = None,
        server_side: bool = False,
        before_write: Callable[[], object] | None = None,
        answer_slice: int = ANSWER_SLICE,
        frame_handler: FrameHandler | None = None,
        guard: InboundGuard | None = None,
        prove_on_frame: bool = True,
        on_flow_control: Callable[[Connection, RemotingCommand], None] | None = None,
    ) -> None:
        self.dispatch = dispatch
        # Called with each FLOW_CONTROL answer this connection writes (the broker throttles a
        # client over its quota: ``throttle``).
        self.on_flow_control = on_flow_control
        self._throttled_until = 0.0  # loop time reading resumes, past a throttle
        self._throttle_timer: asyncio.TimerHandle | None = None
        self.throttles = 0
        self.frame_handler = frame_handler
        self.answer_slice = answer_slice if answer_slice > 0 else 1 << 62
        self.before_write = before_write
        # Only a server stops reading while its peer does not read: a client that stopped
        # reading answers because its own requests queue up would deadlock with the server.
        self.server_side = server_side
        self.decoder = FrameDecoder(max_frame_bytes)
        self.idle_timeout_s = idle_timeout_s
        self.max_inflight = max_inflight
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.peer = ""
        self.closed = False
        self.closed_event = asyncio.Event()
        self.inflight = 0  # awaitable requests being handled, ``parked`` ones included
        self.parked = 0  # of those, the ones waiting for an event (``park``)
        # [requests in flight, their limit (0: none)]: a cell the connections of one
        # tenant share (set by the layer above once the connection is known to be the tenant's).
        self.tenant_load: list[int] | None = None
        # Called when this connection refuses a request over its tenant's requests in flight (the
        # layer above counts it for the tenant); set with ``tenant_load``.
        self.on_tenant_busy: Callable[[], None] | None = None
        # The tenant's share of the loop (fair_share.py), set with ``tenant_load`` when the server
        # shares its loop between tenants; None: requests are handled as they are read.
        self.share: TenantShare | None = None
        self.waiting_frames: deque[Body] = deque()  # read, waiting for the fair share's drain
        self.waiting_bytes = 0  # ... and their size
        self._held = False  # not read until the drain takes what it holds (fair_share.py)
        self.attrs: dict[str, Any] = {}  # per-connection state of the layer above (client id, auth)
        self._pending: dict[int, tuple[Waiter, int]] = {}  # opaque -> (its future or waiter, code)
        # Per timeout (ms): (deadline, opaque) in the order sent, i.e. by deadline. Never the
        # future: an answered request's future holds its answer (a pull's frame, and with it the
        # whole read it came in), and entries behind a long-polling pull wait their turn here.
        self._deadlines: dict[int, deque[tuple[float, int]]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0.0
        self._opaque = itertools.count(1)
        self._out: list[Body] = []
        self._out_frames = 0  # frames in _out
        self._flush_scheduled = False
        self._join_all = False  # TLS: one buffer a flush (connection_made)
        self._in_read = False
        self._write_paused = False
        self._last_active = self.loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        # Inbound limits (server side): see limits.py.
        self.guard = guard
        self.proven = False  # authenticated, or (prove_on_frame) sent one complete frame
        self.prove_on_frame = prove_on_frame
        self.address = ""  # the peer's host, as the guard counts it
        self._admitted = False  # counted by the guard (closing uncounts it)
        self.partial_since = 0.0  # loop time the incomplete frame held began (its deadline's start)
        self._partial_need = 0  # decoder.pending when last accounted (0: no incomplete frame)
        self._partial_bytes = 0  # bytes reserved for it
        self._partial_unproven = False  # reserved while not proven

    # --- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        # Over the event loop's TLS every piece written becomes a TLS record of its own (a header,
        # a MAC and a pass through the SSL object each): what one flush writes goes as one buffer
        # instead. (TlsChannel joins small pieces itself and encrypts large ones where they are.)
        self._join_all = isinstance(transport.get_extra_info("ssl_object"), ssl.SSLObject)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        guard = self.guard
        if guard is not None:
            address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            refused = guard.admit(address)
            if refused is not None:
                guard.refuse(refused, self.peer, f"{guard.per_address.get(address, 0)} connections from {address}, "
                             f"{guard.connections} in all")  # fmt: skip
                self.abort()
                return
            self.address = address
            self._admitted = True
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        if self.idle_timeout_s > 0:
            self._idle_timer = self.loop.call_later(self.idle_timeout_s, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_active = self.loop.time()
        try:
            frames = self.decoder.feed(data)
        except FrameError as e:
            self._refuse_frame(e)
            return
        if self.guard is not None:
            if frames and not self.proven and self.prove_on_frame:
                self.proven = True
            pending = self.decoder.pending
            # Only when an incomplete frame starts, learns its length or ends (a frame completed
            # in this read and another one began: a new frame, even of the same size).
            if (pending != self._partial_need or (frames and pending)) and not self._partial_changed(
                pending, bool(frames)
            ):
                return
        if self.share is not None:
            if frames:
                self.share.submit(self, frames)
            return
        self._handle_frames(frames)

    def whole_frame_received(self, frame: Body) -> None:
        """One whole frame (without its length prefix) a reader assembled itself (``TlsReader``,
        on a connection with no guard), as ``data_received`` would have split it off."""
        self._last_active = self.loop.time()
        if self.share is not None:
            self.share.submit(self, [frame])
            return
        self._handle_frames([frame])

    def handle_frames(self, frames: list[Body]) -> None:
        """Requests the fair share's drain hands over (``fair_share.py``)."""
        if not self.closed:
            self._handle_frames(frames)

    def hold_reading(self, held: bool) -> None:
        """Stop reading the peer while the fair share holds this connection's requests, or read
        again (unless something else keeps it stopped)."""
        self._held = held
        if self.transport is None or not self.server_side or self.closed:
            return
        if held:
            self.transport.pause_reading()
        elif self._may_read():
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        """The peer ended the connection: what it sent before, still waiting for its tenant's
        share of the loop, is handled now (nothing read is lost)."""
        if self.share is not None and self.waiting_frames:
            self.share.flush(self)
        return None

    def _may_read(self) -> bool:
        return not (self._write_paused or self._held or self._throttle_timer is not None)

    def _handle_frames(self, frames: list[Body]) -> None:
        self._in_read = True
        slice_at = self.answer_slice
        fast = self.frame_handler
        try:
            for frame in frames:
                if fast is not None and self.inflight - self.parked < self.max_inflight:
                    try:
                        answer = fast(self, frame)
                    except Exception:
                        log.exception("closing %s: a request's frame handler failed", self.peer)
                        self.abort()
                        return
                    if answer is not None:
                        if not self.closed:
                            self._out.append(answer)
                            self._out_frames += 1
                            if self._out_frames >= slice_at:
                                self._flush()
                        continue
                try:
                    # decode_frame, without its call for the common header the compiled codec takes
                    cmd = _compiled_decode(frame, RemotingCommand, BODY_VIEW_BYTES) if _compiled_decode else None
                    if cmd is None:
                        cmd = decode_frame(frame)
                except FrameError as e:
                    self._refuse_frame(e)
                    return
                if cmd.flag & FLAG_RESPONSE:  # (is_response): the answer to one of our requests
                    entry = self._pending.pop(cmd.opaque, None)
                    if entry is not None and not entry[0].done():  # (else answered after its timeout)
                        entry[0].set_result(cmd)
                else:
                    self._on_request(cmd)
                    if self._out_frames >= slice_at:
                        self._flush()
        finally:
            self._in_read = False
        if self._out:
            self._flush()

    def _refuse_frame(self, e: FrameError) -> None:
        """Close the connection over a frame the decoder refused (too large, malformed)."""
        if self.guard is None:
            log.warning("closing %s: %s", self.peer, e)
        else:
            too_large = isinstance(e, FrameTooLarge)
            self.guard.refuse(REFUSED_FRAME_BYTES if too_large else MALFORMED_FRAME, self.peer,
                              str(e) if too_large else f"malformed frame: {e}")  # fmt: skip
        self.abort()

    def _partial_changed(self, pending: int, frames_done: bool) -> bool:
        """Account the incomplete frame held now (``pending``: the decoder's) in place of the
        one accounted before; False when the guard refuses it (the connection is then closed)."""
        guard = self.guard
        assert guard is not None
        same_frame = self._partial_need != 0 and not frames_done  # its cut length prefix came in
        if self._partial_need:
            guard.release(self._partial_bytes, self._partial_unproven)
            self._partial_need = self._partial_bytes = 0
            if not same_frame:
                guard.partial.discard(self)
        if not pending:
            return True
        nbytes = pending - 4  # the frame's length field (0 while it is cut)
        unproven = not self.proven
        refused = guard.reserve(nbytes, unproven)
        if refused is not None:
            guard.partial.discard(self)
            detail = (
                f"a frame of {nbytes} bytes; {guard.partial_bytes} bytes of incomplete frames held, "
                f"{guard.large_first_bytes} of them large first frames"
            )
            guard.refuse(refused, self.peer, detail)
            self.abort()
            return False
        self._partial_need = pending
        self._partial_bytes = nbytes
        self._partial_unproven = unproven
        if not same_frame:
            self.partial_since = self._last_active
            guard.partial.add(self)
        return True

    def expire_partial(self, now: float, timeout_s: float) -> None:
        """The deadline sweep's check (server side): close the connection when its incomplete
        frame began more than ``timeout_s`` ago. While we do not read from it (back-pressure)
        the clock starts again: the peer cannot complete a frame we do not read."""
        if not self._may_read():  # (back-pressure, a quota throttle or the fair share's hold)
            self.partial_since = now
            return
        guard = self.guard
        if now - self.partial_since >= timeout_s and guard is not None and not self.closed:
            guard.partial.discard(self)  # refused once (its reservation goes with the connection)
            guard.refuse(
                FRAME_COMPLETE_TIMEOUT,
                self.peer,
                f"a frame of {self._partial_bytes} bytes incomplete after {now - self.partial_since:.1f} s "
                f"({self.decoder.buffered} bytes in)",
            )
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.closed_event.set()
        guard = self.guard
        if guard is not None:
            if self._partial_need:
                guard.release(self._partial_bytes, self._partial_unproven)
                self._partial_need = self._partial_bytes = 0
            guard.partial.discard(self)
            if self._admitted:
                self._admitted = False
                guard.gone(self.address)
        self.decoder.reset()
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._deadlines.clear()
        pending, self._pending = self._pending, {}
        for fut, _code in pending.values():
            if not fut.done():
                fut.set_exception(RemotingConnectError(self.peer, f"connection closed ({exc or 'by peer'})"))
        self._out.clear()
        self._out_frames = 0
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.transport is not None and self.server_side:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.transport is not None and self.server_side and not self.closed and self._may_read():
            self.transport.resume_reading()

    # --- throttling (a client over its quota) ------------------------------------------------
    def throttle(self, delay_s: float) -> None:
        """Stop reading the peer for ``delay_s``: what it sends meanwhile waits in the socket
        buffers and costs this side nothing (Kafka's quota throttling). Reading resumes on time,
        or once the peer reads our answers again if it stopped. A longer throttle extends a
        shorter one; a shorter one changes nothing."""
        if self.closed or self.transport is None or delay_s <= 0:
            return
        until = self.loop.time() + delay_s
        if until <= self._throttled_until:
            return
        self._throttled_until = until
        self.throttles += 1
        self.transport.pause_reading()
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
        self._throttle_timer = self.loop.call_at(until, self._end_throttle)

    def _end_throttle(self) -> None:
        self._throttle_timer = None
        if self.transport is not None and not self.closed and self._may_read():
            self.transport.resume_reading()

    @property
    def throttled(self) -> bool:
        return self._throttle_timer is not None

    # --- requests from the peer -------------------------------------------------------------
    def _on_request(self, cmd: RemotingCommand) -> None:
        dispatch = self.dispatch
        if dispatch is None:
            self._answer(
                cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported")
            )
            return
        if self.inflight - self.parked >= self.max_inflight:
            self._answer(cmd, cmd.response(ResponseCode.SYSTEM_BUSY, "too many requests in flight on this connection"))
            return
        load = self.tenant_load
        if load is not None and load[1] and load[0] >= load[1]:
            if self.on_tenant_busy is not None:
                self.on_tenant_busy()
            self._answer(cmd, cmd.response(
                ResponseCode.SYSTEM_BUSY,
                f"this tenant has {load[0]} requests in flight on this broker, the most its plan allows "
                "(max_inflight_requests): wait for answers before sending more",
            ))  # fmt: skip
            return
        try:
            r = dispatch(self, cmd)
        except HeaderError as e:
            self._answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, str(e)))
            return
        except Exception as e:
            log.exception("request code %s from %s failed", cmd.code, self.peer)
            self._answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}"))
            return
        if r is None:
            return
        if r.__class__ is RemotingCommand:
            # _answer → send → encode, inline for the common answer (no body; called only while
            # handling a read, so the read's end writes it)
            if cmd.flag & FLAG_ONEWAY or self.closed:
                return
            r.opaque = cmd.opaque
            head = _frame_head(r, 0) if r.body is None and _frame_head is not None else None
            if head is None:
                self.send(r)
            else:
                self._out.append(head)
                self._out_frames += 1
            if r.code == ResponseCode.FLOW_CONTROL and self.on_flow_control is not None:
                self.on_flow_control(self, r)
            return
        if isinstance(r, RemotingCommand):
            self._answer(cmd, r)
            return
        self.inflight += 1
        if self.tenant_load is not None:
            self.tenant_load[0] += 1
        task: asyncio.Future[RemotingCommand | None] = asyncio.ensure_future(r)
        task.add_done_callback(functools.partial(self._finish, cmd))

    def park(self) -> None:
        """The request being handled now waits for an event, not for work (a pull held until a
        message arrives): it does not count against ``max_inflight`` until ``unpark``."""
        self.parked += 1

    def unpark(self) -> None:
        self.parked -= 1

    def _finish(self, cmd: RemotingCommand, task: asyncio.Future[RemotingCommand | None]) -> None:
        self.inflight -= 1
        if self.tenant_load is not None:
            self.tenant_load[0] -= 1
        if task.cancelled():
            return
        e = task.exception()
        if e is None:
            r = task.result()
            if r is not None:
                self._answer(cmd, r)
        elif isinstance(e, HeaderError):
            self._answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, str(e)))
        else:
            log.error("request code %s from %s failed", cmd.code, self.peer, exc_info=e)
            self._answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}"))

    def _answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        if request.flag & FLAG_ONEWAY:
            return
        response.opaque = request.opaque
        self.send(response)
        if response.code == ResponseCode.FLOW_CONTROL and self.on_flow_control is not None:
            self.on_flow_control(self, response)

    # --- writing ----------------------------------------------------------------------------
    def send(self, cmd: RemotingCommand) -> None:
        """Queue ``cmd`` for writing (gathered with others written in the same loop turn)."""
        if self.closed:
            return
        self._out.extend(encode(cmd))
        self._out_frames += 1
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._out_frames = 0
        out = self._out
        if not out or self.closed or self.transport is None:
            out.clear()
            return
        self._out = []
        self._last_active = self.loop.time()
        if self.before_write is not None:
            self.before_write()
        if len(out) == 1:
            self.transport.write(out[0])  # the network write
            return
        total = 0
        for b in out:
            total += len(b)
        if total <= _JOIN_BELOW_BYTES or self._join_all:
            self.transport.write(b"".join(out))  # the network write: one copy beats one syscall per piece
        else:
            self.transport.writelines(out)  # the network write: large bodies (pulls) go uncopied

    @property
    def write_buffer_bytes(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    # --- our requests to the peer -------------------------------------------------------------
    def invoke(self, cmd: RemotingCommand, timeout_ms: int) -> asyncio.Future[RemotingCommand]:
        """Send a request; the future gets its response, RemotingTimeoutError after
        ``timeout_ms``, or RemotingConnectError when the connection closes first."""
        opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.opaque = opaque
        fut: asyncio.Future[RemotingCommand] = self.loop.create_future()
        if self._expect(opaque, cmd.code, timeout_ms, fut) is None:
            return fut
        body = cmd.body
        head = _frame_head(cmd, len(body)) if body.__class__ is bytes and _frame_head is not None else None
        if head is None:
            self.send(cmd)
            return fut
        # send → encode, inline for a request with one bytes body (a send's): the header and
        # the body, uncopied, gathered with the turn's other writes
        self._queue_frame(head, body)  # type: ignore[arg-type]  # bytes, checked above
        return fut

    def next_opaque(self) -> int:
        """The opaque of the next request (``invoke_frame``'s, whose head carries it)."""
        return next(self._opaque) & 0x7FFFFFFF

    def invoke_frame(self, opaque: int, code: int, head: bytes, body: bytes, timeout_ms: int, waiter: Waiter) -> None:
        """``invoke`` for a request already laid out — ``head`` (the frame's lengths and its
        header, carrying ``opaque`` from ``next_opaque``) and ``body`` — whose outcome goes to
        ``waiter`` instead of a future: its ``set_result`` gets the answer inline, in the read
        that brought it (no callback scheduled in between), or its ``set_exception`` the
        failure (timeout, closed connection), at once when the request cannot be sent."""
        if self._expect(opaque, code, timeout_ms, waiter) is not None:
            self._queue_frame(head, body)

    def _queue_frame(self, head: bytes, body: bytes) -> None:
        out = self._out
        out.append(head)
        out.append(body)
        self._out_frames += 1
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _expect(self, opaque: int, code: int, timeout_ms: int, fut: Waiter) -> Waiter | None:
        """``fut`` registered for request ``opaque``'s answer, with its deadline — or failed
        (the connection closed, too many requests awaiting answers) and None."""
        if self.closed:
            fut.set_exception(RemotingConnectError(self.peer, "connection closed"))
            return None
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            fut.set_exception(RemotingTooMuchRequestError(f"{MAX_PENDING} requests to {self.peer} await answers"))
            return None
        pending[opaque] = (fut, code)
        deadline = self.loop.time() + timeout_ms / 1000
        waiting = self._deadlines.get(timeout_ms)
        if waiting is None:
            waiting = self._deadlines[timeout_ms] = deque()
        waiting.append((deadline, opaque))
        while True:  # answered or given up on, at the front: gone (_waited_for, inline)
            entry = pending.get(waiting[0][1])
            if entry is not None:
                if not entry[0].done():
                    break
                del pending[waiting[0][1]]
            waiting.popleft()
        if len(waiting) > 2 * len(pending) + 64:
            # Answered requests pile up behind one that is not (a pull the broker holds for
            # seconds): keep only the live ones. Amortized O(1) a request; the deque stays
            # within twice the requests awaiting answers.
            waiting = self._deadlines[timeout_ms] = deque(e for e in waiting if self._waited_for(e[1]))
        if self._expiry is None or deadline < self._expiry_at:
            self._arm_expiry(deadline)
        return fut

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= FLAG_ONEWAY
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        self.send(cmd)

    def _waited_for(self, opaque: int) -> bool:
        """Whether request ``opaque`` still awaits its answer. One whose future the caller
        cancelled is forgotten here (its answer, if it ever comes, is dropped)."""
        entry = self._pending.get(opaque)
        if entry is None:
            return False  # answered, or failed
        if entry[0].done():
            del self._pending[opaque]
            return False
        return True

    def _arm_expiry(self, at: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = at
        self._expiry = self.loop.call_at(at, self._expire_due)

    def _expire_due(self) -> None:
        """Fail the requests whose deadline has passed; set the timer for the next deadline."""
        self._expiry = None
        now = self.loop.time()
        pending = self._pending
        earliest = None
        for timeout_ms, waiting in list(self._deadlines.items()):
            while waiting:
                deadline, opaque = waiting[0]
                if not self._waited_for(opaque):
                    waiting.popleft()
                    continue
                if deadline > now:
                    break
                waiting.popleft()
                fut, code = pending.pop(opaque)
                fut.set_exception(RemotingTimeoutError(self.peer, code, timeout_ms))
            if waiting:
                if earliest is None or waiting[0][0] < earliest:
                    earliest = waiting[0][0]
            else:
                del self._deadlines[timeout_ms]
        if earliest is not None and not self.closed:
            self._arm_expiry(earliest)

    # --- closing ----------------------------------------------------------------------------
    def _check_idle(self) -> None:
        if self.closed:
            return
        idle = self.loop.time() - self._last_active
        if idle >= self.idle_timeout_s and not self._pending and self.inflight == 0:
            log.info("closing %s: idle for %.0f s", self.peer, idle)
            if self.write_buffer_bytes:
                self.abort()  # the peer reads nothing: close() would wait for it forever
            else:
                self.close()
            return
        self._idle_timer = self.loop.call_later(max(1.0, self.idle_timeout_s - idle), self._check_idle)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            if self._out:
                self._flush()
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()


class TlsReader(asyncio.BufferedProtocol):
    """A connection's protocol over TLS: the SSL transport decrypts into a buffer this keeps
    (``TLS_READ_BUFFER_BYTES``) instead of a new bytes object of its read size each time, and
    the decrypted bytes go to the ``Connection`` as ``data_received`` would hand them.

    On a connection with no guard (a client's: it trusts what it asked its server for) a large
    frame (``TLS_FRAME_DIRECT_BYTES`` or more, a pull's answer) is decrypted straight into a
    buffer of its own once its length is known, and handed over whole when complete: no copy
    out of the read buffer, no pieces joined, no call for each piece. Its length is checked
    against the connection's frame limit first; a frame over it goes the usual way, which
    refuses it."""

    __slots__ = ("_buffer", "_direct", "_filled", "_frame", "_view", "conn")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._buffer = bytearray(TLS_READ_BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self._frame: memoryview | None = None  # the large frame being filled, length prefix included
        self._filled = 0
        self._direct = conn.guard is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._frame = None
        self.conn.connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()

    def eof_received(self) -> bool | None:
        return self.conn.eof_received()

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            return frame[self._filled :]
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        frame = self._frame
        if frame is not None:
            self._filled += nbytes
            if self._filled == len(frame):
                self._frame = None
                self.conn.whole_frame_received(frame[4:])
            return
        view = self._view
        if not self._direct or self.conn.decoder.pending:  # (the decoder holds the start of a frame)
            self.conn.data_received(view[:nbytes].tobytes())
            return
        # Whole frames go on as they are; a large frame cut at the end of the read gets its own buffer.
        pos = 0
        length = 0
        limit = self.conn.decoder.max_frame_bytes
        unpack = FRAME_LENGTH.unpack_from
        while nbytes - pos >= 4:
            length = unpack(view, pos)[0]
            if not 4 <= length <= limit:  # the decoder refuses it
                break
            end = pos + 4 + length
            if end > nbytes:
                break
            pos = end
            length = 0
        if not TLS_FRAME_DIRECT_BYTES <= length <= limit:
            self.conn.data_received(view[:nbytes].tobytes())
            return
        if pos:
            self.conn.data_received(view[:pos].tobytes())
            if self.conn.closed:
                return
        have = nbytes - pos
        frame = memoryview(bytearray(4 + length))
        frame[:have] = view[pos:nbytes]
        self._frame = frame
        self._filled = have
