"""RemotingClient: connections by address, requests with timeouts, answers to the peer's
requests (a broker asks clients things too: NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable

from data_plane.remoting.command import MAX_FRAME_BYTES, RemotingCommand
from data_plane.remoting.connection import Connection, Dispatch, TlsReader
from data_plane.remoting.errors import RemotingConnectError, RemotingTimeoutError
from data_plane.remoting.tls_channel import ChannelContext, available, open_connection
from data_plane.tls import ClientSslContext

log = logging.getLogger(__name__)


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {addr!r} is not host:port")
    return host, int(port)


class RemotingClient:
    def __init__(
        self,
        dispatch: Dispatch | None = None,
        *,
        connect_timeout_ms: int = 3000,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_timeout_s: float = 0,
        local_host: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``local_host``: the local address connections are made from (None: the system's
        choice) — a broker registers with name servers from the address it serves on, which is
        the one the fleet lists for it. ``ssl_context``: connect over TLS, checking the server's
        certificate and name as the context says; one from ``data_plane.tls.client_context`` runs
        on ``tls_channel.TlsChannel`` where it is available, any other on the event loop's TLS."""
        self.dispatch = dispatch
        self.local_host = local_host
        self.ssl_context = ssl_context
        self._channel: ChannelContext | None = None
        if isinstance(ssl_context, ClientSslContext) and available():
            self._channel = ChannelContext.for_client(ssl_context.ca_file, verify=ssl_context.verify)
        self.connect_timeout_ms = connect_timeout_ms
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self.closed = False

    def _forget(self, addr: str, conn: Connection) -> None:
        if self._conns.get(addr) is conn:
            del self._conns[addr]

    async def connection(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self.closed:
            raise RemotingConnectError(addr, "client is closed")
        pending = self._connecting.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Connection] = loop.create_future()
        self._connecting[addr] = fut
        try:
            host, port = split_addr(addr)
            try:
                conn = Connection(
                    self.dispatch,
                    max_frame_bytes=self.max_frame_bytes,
                    idle_timeout_s=self.idle_timeout_s,
                    on_close=lambda c: self._forget(addr, c),
                )
                local_addr = None if self.local_host is None else (self.local_host, 0)
                if self._channel is not None:
                    opened: Awaitable[object] = open_connection(
                        lambda: TlsReader(conn),
                        host,
                        port,
                        self._channel,
                        local_addr=local_addr,
                        handshake_timeout_s=self.connect_timeout_ms / 1000,
                    )
                else:
                    opened = loop.create_connection(
                        (lambda: conn) if self.ssl_context is None else (lambda: TlsReader(conn)),
                        host,
                        port,
                        local_addr=local_addr,
                        ssl=self.ssl_context,
                        server_hostname=host if self.ssl_context is not None else None,
                    )
                await asyncio.wait_for(opened, self.connect_timeout_ms / 1000)
            except (OSError, TimeoutError) as e:
                raise RemotingConnectError(addr, str(e) or type(e).__name__) from None
            self._conns[addr] = conn
            fut.set_result(conn)
            return conn
        except BaseException as e:
            if not fut.done():
                fut.set_exception(e)
                fut.exception()  # retrieved: waiters that shield it re-raise it themselves
            raise
        finally:
            del self._connecting[addr]

    def open_connection(self, addr: str) -> Connection | None:
        """The open connection to ``addr``, if there is one (no connecting)."""
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn.closed else None

    def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000) -> Awaitable[RemotingCommand]:
        """The response to ``cmd`` (await it). On an open connection this is the connection's
        own future: no coroutine in between on the hot path."""
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn.invoke(cmd, timeout_ms)
        return self._connect_and_invoke(addr, cmd, timeout_ms)

    async def _connect_and_invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> RemotingCommand:
        conn = await self.connection(addr)
        try:
            return await conn.invoke(cmd, timeout_ms)
        except RemotingTimeoutError:
            raise
        except RemotingConnectError:
            self._forget(addr, conn)
            raise

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        conn.invoke_oneway(cmd)

    def close_connection(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        self.closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for c in conns:
            c.close()
        for c in conns:
            if not c.closed:
                try:
                    await asyncio.wait_for(c.closed_event.wait(), 1.0)
                except TimeoutError:
                    c.abort()
