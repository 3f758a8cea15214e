"""RemotingServer: accepts connections and hands their requests to a ``Processors`` table.

Every server enforces ``InboundLimits`` (``limits.py``; the defaults unless given): connections
per source address and in all, the bytes incomplete frames may hold, what a connection not yet
proven may send, and the deadline for a frame to complete, swept by one timer per server. What it
refused is counted by reason in ``refused``. A request ``Processors.before`` lets through proves
its connection (authenticated); without a ``before`` check a connection is proven by its first
complete frame.

TLS (``data_plane/tls.py``): ``enforcing`` serves TLS only; ``permissive`` serves TLS and plain
TCP on one port, telling them apart by each connection's first byte (read with MSG_PEEK before
the connection is handed to asyncio, so nothing is consumed): 0x16 opens a TLS handshake record.
A peer has ``TLS_SNIFF_TIMEOUT_S`` to send that byte and ``TLS_HANDSHAKE_TIMEOUT_S`` to finish the
handshake; connections waiting for their first byte or in their handshake count against
``max_connections_total`` (past it a connection is closed as it is accepted), and handshakes under
way end with the server.
TLS runs on ``tls_channel.TlsChannel`` (cryptography's OpenSSL) where it is available, else on
the event loop's own TLS transport; either way a connection reaches the processors only once its
handshake is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import MAX_FRAME_BYTES, RemotingCommand
from data_plane.remoting.connection import (
    ANSWER_SLICE,
    IDLE_TIMEOUT_S,
    MAX_INFLIGHT,
    Connection,
    FrameHandler,
    TlsReader,
)
from data_plane.remoting.limits import InboundGuard, InboundLimits
from data_plane.remoting.tls_channel import ChannelContext, TlsChannel, available
from data_plane.tls import TLS_RECORD_HANDSHAKE, ServerTls, TlsConfigError

log = logging.getLogger(__name__)

TLS_SNIFF_TIMEOUT_S = 10.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0

Handler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"]
# Runs ahead of every handler: None lets the request through, a command answers instead, an
# awaitable of either decides later (e.g. after fetching an unknown token key).
Before = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"]


class Processors:
    """Request code → handler. Unknown codes get REQUEST_CODE_NOT_SUPPORTED and the connection
    stays open. ``before`` runs ahead of every handler (authentication) and may answer instead;
    a request it lets through proves its connection (``Connection.proven``: limits.py).
    ``frame_handler`` (``Connection.frame_handler``) answers some requests straight from their
    frames ahead of the table; connections made while ``before`` is set do without it, since it
    would pass by the check."""

    def __init__(self) -> None:
        self.handlers: dict[int, Handler] = {}
        self.before: Before | None = None
        self.frame_handler: FrameHandler | None = None
        self.checked_frame_handler: FrameHandler | None = None

    def frame_path(self) -> FrameHandler | None:
        """The frame handler for a new connection: while ``before`` checks every request, only
        ``checked_frame_handler`` (it may refuse straight from a frame, never serve one)."""
        return self.frame_handler if self.before is None else self.checked_frame_handler

    def register(self, code: int, handler: Handler) -> None:
        self.handlers[int(code)] = handler

    def __call__(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand | None] | None:
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request code {cmd.code} not supported")
        if self.before is not None:
            refused = self.before(conn, cmd)
            if refused is not None:
                if isinstance(refused, RemotingCommand):
                    return refused
                return _decide_later(refused, handler, conn, cmd)
            conn.proven = True
        return handler(conn, cmd)


async def _decide_later(
    pending: Awaitable[RemotingCommand | None], handler: Handler, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | None:
    refused = await pending
    if refused is not None:
        return refused
    conn.proven = True
    answer = handler(conn, cmd)
    if answer is None or isinstance(answer, RemotingCommand):
        return answer
    return await answer


class _Refused(asyncio.Protocol):
    """A connection past the server's limit: closed as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]  # (a socket transport)


class RemotingServer:
    def __init__(
        self,
        processors: Processors,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        answer_slice: int = ANSWER_SLICE,
        max_inflight: int = MAX_INFLIGHT,
        on_close: Callable[[Connection], None] | None = None,
        limits: InboundLimits | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.processors = processors
        self.tls = (tls or ServerTls()).validate()
        self._channel: ChannelContext | None = None  # TLS on TlsChannel
        self._ssl: ssl.SSLContext | None = None  # TLS on the event loop's transport
        if self.tls.enabled and available():
            try:
                self._channel = ChannelContext.for_server(self.tls.cert_file, self.tls.key_file)
            except ssl.SSLError as e:
                raise TlsConfigError(str(e)) from None
        else:
            self._ssl = self.tls.context()
        self._listen_sock: socket.socket | None = None  # permissive: our own accept loop
        self._accept_task: asyncio.Task[None] | None = None
        self._sniffing: set[asyncio.Task[None]] = set()
        self._handshaking: set[TlsChannel] = set()  # TLS connections whose handshake is under way
        self.tls_connections = 0  # connections served over TLS (in permissive mode the rest are plain)
        # Passed to every new Connection (see there); the broker sets it once its store runs.
        self.before_write: Callable[[], object] | None = None
        # Passed to every new Connection: called with each FLOW_CONTROL answer (the broker's throttle).
        self.on_flow_control: Callable[[Connection, RemotingCommand], None] | None = None
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self.answer_slice = answer_slice
        self.max_inflight = max_inflight
        self.connections: set[Connection] = set()
        self._on_close_hook = on_close
        self._server: asyncio.base_events.Server | None = None
        self.limits = limits or InboundLimits()
        problems = self.limits.problems(max_frame_bytes)
        if problems:
            raise ValueError("; ".join(problems))
        self.guard = InboundGuard(self.limits)
        self._sweep_timer: asyncio.TimerHandle | None = None

    @property
    def refused(self) -> dict[str, int]:
        """Connections closed by the inbound limits (and refused frames), by reason."""
        return dict(self.guard.refused)

    def _sweep(self) -> None:
        """Close the connections whose incomplete frame is past ``frame_complete_timeout_ms``."""
        loop = asyncio.get_running_loop()
        timeout_s = self.limits.frame_complete_timeout_ms / 1000
        if self.guard.partial:
            now = loop.time()
            for conn in list(self.guard.partial):
                conn.expire_partial(now, timeout_s)
        self._sweep_timer = loop.call_later(min(1.0, timeout_s / 4), self._sweep)

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self._on_close_hook is not None:
            self._on_close_hook(conn)

    def _make(self) -> Connection:
        conn = Connection(
            self.processors,
            max_frame_bytes=self.max_frame_bytes,
            idle_timeout_s=self.idle_timeout_s,
            max_inflight=self.max_inflight,
            on_close=self._closed,
            server_side=True,
            before_write=self.before_write,
            on_flow_control=self.on_flow_control,
            answer_slice=self.answer_slice,
            frame_handler=self.processors.frame_path(),
            guard=self.guard,
            prove_on_frame=self.processors.before is None,
        )
        self.connections.add(conn)
        return conn

    def _make_tls(self) -> TlsReader:
        self.tls_connections += 1
        return TlsReader(self._make())

    def _make_channel(self) -> asyncio.BaseProtocol:
        """A TLS connection's channel. Connections still in their handshake count against
        ``max_connections_total`` (past it the connection is closed as it is accepted) and are
        aborted when the server closes."""
        assert self._channel is not None
        if len(self._handshaking) + len(self.connections) + len(self._sniffing) >= self.limits.max_connections_total:
            self.guard.refused["max_connections_total"] += 1
            return _Refused()
        channel = TlsChannel(
            self._channel,
            self._make_tls,
            handshake_timeout_s=TLS_HANDSHAKE_TIMEOUT_S,
            on_handshake_end=self._handshaking.discard,
        )
        self._handshaking.add(channel)
        return channel

    def _tls_factory(self) -> Callable[[], asyncio.BaseProtocol]:
        return self._make_channel if self._channel is not None else self._make_tls

    async def start(self, *, serving: bool = True) -> None:
        """Bind (port 0 picks a free port, read back into ``port``) and, with ``serving``,
        accept connections; otherwise call ``start_serving`` once the handlers are ready."""
        loop = asyncio.get_running_loop()
        if self.tls.mode == "permissive":
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            sock = socket.create_server((self.host, self.port), family=family, backlog=1024)
            sock.setblocking(False)
            self._listen_sock = sock
            self.port = sock.getsockname()[1]
            if serving:
                await self.start_serving()
        else:
            self._server = await loop.create_server(
                self._make if not self.tls.enabled else self._tls_factory(),
                self.host,
                self.port,
                reuse_address=True,
                backlog=1024,
                start_serving=serving,
                ssl=self._ssl,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self._ssl is not None else None,
            )
            self.port = self._server.sockets[0].getsockname()[1]
        if self._sweep_timer is None:
            self._sweep()

    async def start_serving(self) -> None:
        if self._listen_sock is not None:
            if self._accept_task is None:
                self._accept_task = asyncio.get_running_loop().create_task(
                    self._accept_loop(self._listen_sock), name=f"remoting-accept-{self.port}"
                )
            return
        assert self._server is not None
        await self._server.start_serving()

    # --- permissive TLS: TLS and plain TCP on one port --------------------------------------------------
    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _addr = await loop.sock_accept(listener)
            except OSError as e:  # EMFILE and the like: back off instead of spinning
                log.warning("accepting a connection failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            if len(self._sniffing) + len(self.connections) >= self.limits.max_connections_total:
                self.guard.refused["max_connections_total"] += 1
                sock.close()
                continue
            task = loop.create_task(self._sniff(sock))
            self._sniffing.add(task)
            task.add_done_callback(self._sniffing.discard)

    async def _sniff(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        readable: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(sock.fileno(), ready)
        try:
            await asyncio.wait_for(readable, TLS_SNIFF_TIMEOUT_S)
            first = sock.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError, asyncio.CancelledError):
            loop.remove_reader(sock.fileno())
            sock.close()
            return
        loop.remove_reader(sock.fileno())
        if not first:
            sock.close()
            return
        use_tls = first[0] == TLS_RECORD_HANDSHAKE
        try:
            await loop.connect_accepted_socket(
                self._tls_factory() if use_tls else self._make,
                sock,
                ssl=self._ssl if use_tls else None,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if use_tls and self._ssl is not None else None,
            )
        except (OSError, TimeoutError) as e:  # a failed TLS handshake
            log.info("a connection's TLS handshake failed: %s", e)
            sock.close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self, grace_s: float = 1.0) -> None:
        for channel in list(self._handshaking):
            channel.abort()
        self._handshaking.clear()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if self._listen_sock is not None:
            tasks = [t for t in (self._accept_task, *self._sniffing) if t is not None]
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            self._accept_task = None
            self._listen_sock.close()
            self._listen_sock = None
            await self._close_connections(grace_s)
        if self._server is not None:
            self._server.close()
            await self._close_connections(grace_s)
            await self._server.wait_closed()
            self._server = None

    async def _close_connections(self, grace_s: float) -> None:
        conns = list(self.connections)
        for conn in conns:
            conn.close()
        # close() waits for our answers to be read; a peer that never reads is dropped.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.closed_event.wait() for c in conns)), grace_s)
        for conn in conns:
            conn.abort()
