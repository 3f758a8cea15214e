"""RemotingServer: accepts connections and hands their requests to a ``Processors`` table."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import MAX_FRAME_BYTES, RemotingCommand
from data_plane.remoting.connection import ANSWER_SLICE, IDLE_TIMEOUT_S, MAX_INFLIGHT, Connection, FrameHandler

log = logging.getLogger(__name__)

Handler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"]
# Runs ahead of every handler: None lets the request through, a command answers instead, an
# awaitable of either decides later (e.g. after fetching an unknown token key).
Before = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"]


class Processors:
    """Request code → handler. Unknown codes get REQUEST_CODE_NOT_SUPPORTED and the connection
    stays open. ``before`` runs ahead of every handler (authentication) and may answer instead.
    ``frame_handler`` (``Connection.frame_handler``) answers some requests straight from their
    frames ahead of the table; connections made while ``before`` is set do without it, since it
    would pass by the check."""

    def __init__(self) -> None:
        self.handlers: dict[int, Handler] = {}
        self.before: Before | None = None
        self.frame_handler: FrameHandler | None = None

    def frame_path(self) -> FrameHandler | None:
        """The frame handler for a new connection: none while ``before`` checks every request."""
        return self.frame_handler if self.before is None else None

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
        return handler(conn, cmd)


async def _decide_later(
    pending: Awaitable[RemotingCommand | None], handler: Handler, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | None:
    refused = await pending
    if refused is not None:
        return refused
    answer = handler(conn, cmd)
    if answer is None or isinstance(answer, RemotingCommand):
        return answer
    return await answer


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
    ) -> None:
        self.processors = processors
        # Passed to every new Connection (see there); the broker sets it once its store runs.
        self.before_write: Callable[[], object] | None = None
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self.answer_slice = answer_slice
        self.max_inflight = max_inflight
        self.connections: set[Connection] = set()
        self._on_close_hook = on_close
        self._server: asyncio.base_events.Server | None = None

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
            answer_slice=self.answer_slice,
            frame_handler=self.processors.frame_path(),
        )
        self.connections.add(conn)
        return conn

    async def start(self, *, serving: bool = True) -> None:
        """Bind (port 0 picks a free port, read back into ``port``) and, with ``serving``,
        accept connections; otherwise call ``start_serving`` once the handlers are ready."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._make, self.host, self.port, reuse_address=True, backlog=1024, start_serving=serving
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def start_serving(self) -> None:
        assert self._server is not None
        await self._server.start_serving()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            self._server.close()
            conns = list(self.connections)
            for conn in conns:
                conn.close()
            # close() waits for our answers to be read; a peer that never reads is dropped.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(c.closed_event.wait() for c in conns)), grace_s)
            for conn in conns:
                conn.abort()
            await self._server.wait_closed()
            self._server = None
