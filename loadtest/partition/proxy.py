"""PathProxy: one network path of a broker (its control-plane calls, its HA port, its client
port) behind a TCP proxy that a test drives.

    peer ──▶ 127.0.0.1:<proxy port> ──▶ target (host:port)
             up:   peer → target   (requests, heartbeats, a slave's REPORTs)
             down: target → peer   (answers, a master's DATA frames)

Modes (``set_mode``):

- ``PASS``: bytes flow both ways.
- ``HOLD``: connections stay open and new ones are accepted, but nothing crosses in either
  direction: the bytes that arrive are dropped (a partition that silently swallows packets; no
  memory is kept for them). A new connection is not connected to the target at all.
- ``HOLD_ANSWERS``: the asymmetric cut: bytes from the peer reach the target, answers are
  dropped.
- ``RESET``: every connection is reset (RST), and each new one as soon as it is accepted.
- ``FLAP``: alternates between ``PASS`` and ``HOLD`` every ``flap_ms``.

A connection that lost bytes in a hold (either direction) has a broken stream, as a TCP
connection that timed out would: it is reset when its direction passes again (at the heal, or
at a flap's next pass), never handed the bytes after the gap. Connections that lost nothing
carry on.

Bounds: each direction of a connection moves one chunk (``CHUNK_BYTES``) at a time with the
writer's back-pressure (``drain``), and at most ``max_connections`` connections are open at once
(past that a new one is closed at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import struct
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
MAX_CONNECTIONS = 256
CONNECT_TIMEOUT_S = 3.0
# SO_LINGER on, 0 seconds: close() sends RST instead of FIN.
_LINGER_RESET = struct.pack("ii", 1, 0)


class Mode(enum.Enum):
    PASS = "pass"
    HOLD = "hold"
    HOLD_ANSWERS = "hold_answers"
    RESET = "reset"
    FLAP = "flap"


@dataclass
class ProxyCounters:
    accepted: int = 0
    refused: int = 0  # over max_connections
    reset: int = 0  # connections reset (RESET mode, or broken by a hold)
    bytes_up: int = 0
    bytes_down: int = 0
    dropped_up: int = 0
    dropped_down: int = 0


@dataclass(eq=False)
class _Link:
    """One proxied connection: the peer's side and (once connected) the target's."""

    peer_reader: asyncio.StreamReader
    peer_writer: asyncio.StreamWriter
    target_writer: asyncio.StreamWriter | None = None
    broken: bool = False  # lost bytes in a hold: reset when its direction passes again


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with RST (not FIN): the peer sees ECONNRESET."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()


class PathProxy:
    def __init__(
        self,
        name: str,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.name = name
        self.target = (target_host, target_port)
        self.listen = (listen_host, listen_port)
        self.max_connections = max_connections
        self.port = 0
        self.mode = Mode.PASS
        self.flap_ms = 0
        self.counters = ProxyCounters()
        self._up_open = asyncio.Event()  # peer → target passes
        self._down_open = asyncio.Event()  # target → peer passes
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._flapper: asyncio.Task[None] | None = None
        self._set_gates(True, True)

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1])
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._stop_flapping()
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            self._drop(link, reset=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    # --- driving it -------------------------------------------------------------------------------
    def set_mode(self, mode: Mode, *, flap_ms: int = 1000) -> None:
        """Switch to ``mode`` now (``flap_ms``: the half-period of FLAP)."""
        self._stop_flapping()
        self.mode = mode
        log.info("proxy %s: %s", self.name, mode.value)
        if mode is Mode.PASS:
            self._set_gates(True, True)
        elif mode is Mode.HOLD:
            self._set_gates(False, False)
        elif mode is Mode.HOLD_ANSWERS:
            self._set_gates(True, False)
        elif mode is Mode.RESET:
            self._set_gates(False, False)
            for link in list(self._links):
                self._drop(link, reset=True)
        else:
            if flap_ms < 10:
                raise ValueError("flap_ms must be >= 10")
            self.flap_ms = flap_ms
            self._set_gates(True, True)
            self._flapper = asyncio.get_running_loop().create_task(self._flap(flap_ms / 1000), name=f"flap-{self.name}")

    def heal(self) -> None:
        self.set_mode(Mode.PASS)

    def _stop_flapping(self) -> None:
        if self._flapper is not None:
            self._flapper.cancel()
            self._flapper = None

    async def _flap(self, half_period_s: float) -> None:
        passing = True
        while True:
            await asyncio.sleep(half_period_s)
            passing = not passing
            self._set_gates(passing, passing)

    def _set_gates(self, up: bool, down: bool) -> None:
        for gate, open_ in ((self._up_open, up), (self._down_open, down)):
            if open_:
                gate.set()
            else:
                gate.clear()
        if up and down:
            # Streams that lost bytes cannot go on: reset them now that their path is back.
            for link in [x for x in self._links if x.broken]:
                self._drop(link, reset=True)

    # --- the connections ------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._links) >= self.max_connections:
            self.counters.refused += 1
            writer.close()
            return
        if self.mode is Mode.RESET:
            self.counters.reset += 1
            _reset(writer)
            return
        self.counters.accepted += 1
        link = _Link(reader, writer)
        self._links.add(link)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(link)
        except (ConnectionError, OSError):
            pass
        finally:
            self._drop(link, reset=False)
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, link: _Link) -> None:
        # Nothing reaches the target while peer -> target is held, not even the connection.
        while not self._up_open.is_set():
            data = await _read_for(link.peer_reader, 0.05)
            if link not in self._links or data == b"":
                return
            if data:
                self.counters.dropped_up += len(data)
                link.broken = True
        if link.broken or link not in self._links:
            return
        try:
            t_reader, t_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            _reset(link.peer_writer)  # the target is down: as a refused connection looks
            return
        link.target_writer = t_writer
        if link not in self._links:  # reset while it was connecting
            _reset(t_writer)
            return
        pumps = [
            asyncio.create_task(self._pump(link, link.peer_reader, t_writer, up=True)),
            asyncio.create_task(self._pump(link, t_reader, link.peer_writer, up=False)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in pumps:
                t.cancel()
            await asyncio.wait(pumps)

    async def _pump(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
        """One direction until EOF, a reset, or a stream broken by a hold."""
        gate = self._up_open if up else self._down_open
        c = self.counters
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(CHUNK_BYTES):
                if not gate.is_set():
                    link.broken = True
                    if up:
                        c.dropped_up += len(data)
                    else:
                        c.dropped_down += len(data)
                    continue
                if link.broken:
                    return
                writer.write(data)
                if up:
                    c.bytes_up += len(data)
                else:
                    c.bytes_down += len(data)
                await writer.drain()

    def _drop(self, link: _Link, *, reset: bool) -> None:
        """Close both sides (with RST when ``reset``); its tasks see EOF and end."""
        if link not in self._links:
            return
        self._links.discard(link)
        if reset:
            self.counters.reset += 1
            _reset(link.peer_writer)
            _reset(link.target_writer)
        else:
            for w in (link.peer_writer, link.target_writer):
                if w is not None:
                    w.close()

    def snapshot(self) -> dict[str, object]:
        c = self.counters
        return {
            "mode": self.mode.value,
            "open": len(self._links),
            "accepted": c.accepted,
            "refused": c.refused,
            "reset": c.reset,
            "bytes_up": c.bytes_up,
            "bytes_down": c.bytes_down,
            "dropped_up": c.dropped_up,
            "dropped_down": c.dropped_down,
            "at": time.monotonic(),
        }


async def _read_for(reader: asyncio.StreamReader, timeout_s: float) -> bytes | None:
    """A chunk, b"" at EOF, or None when nothing came within ``timeout_s``."""
    try:
        return await asyncio.wait_for(reader.read(CHUNK_BYTES), timeout_s)
    except TimeoutError:
        return None
