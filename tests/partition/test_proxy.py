"""PathProxy (loadtest/partition/proxy.py) against an echo server on 127.0.0.1: each mode does
what the partition tier relies on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from loadtest.partition.proxy import Mode, PathProxy

pytestmark = [pytest.mark.partition, pytest.mark.asyncio]

QUIET_S = 0.3  # nothing arriving within this counts as held


class Echo:
    """Echoes every byte back and keeps what it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                self.received += data
                writer.write(data)
                await writer.drain()
        writer.close()


@pytest_asyncio.fixture
async def proxy() -> AsyncIterator[tuple[PathProxy, Echo]]:
    echo = Echo()
    echo.server = await asyncio.start_server(echo._serve, "127.0.0.1", 0)
    p = PathProxy("test", "127.0.0.1", echo.server.sockets[0].getsockname()[1])
    await p.start()
    try:
        yield p, echo
    finally:
        await p.close()
        echo.server.close()
        await echo.server.wait_closed()


async def connect(p: PathProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", p.port)


async def answer(reader: asyncio.StreamReader, n: int) -> bytes | None:
    try:
        return await asyncio.wait_for(reader.readexactly(n), QUIET_S)
    except TimeoutError:
        return None


async def test_pass_forwards_both_ways(proxy: tuple[PathProxy, Echo]) -> None:
    p, _ = proxy
    r, w = await connect(p)
    w.write(b"ping")
    assert await answer(r, 4) == b"ping"
    w.close()


async def test_hold_drops_both_ways_and_the_heal_resets_what_lost_bytes(proxy: tuple[PathProxy, Echo]) -> None:
    p, echo = proxy
    r, w = await connect(p)
    w.write(b"a")
    assert await answer(r, 1) == b"a"
    p.set_mode(Mode.HOLD)
    w.write(b"lost")
    assert await answer(r, 4) is None
    r2, w2 = await connect(p)  # accepted, never connected through
    w2.write(b"new")
    assert await answer(r2, 3) is None
    assert bytes(echo.received) == b"a"
    p.heal()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r.readexactly(1), 2.0)  # its stream lost bytes: reset
    r3, w3 = await connect(p)
    w3.write(b"after")
    assert await answer(r3, 5) == b"after"
    for x in (w, w2, w3):
        x.close()


async def test_hold_answers_lets_requests_through_and_drops_the_answers(proxy: tuple[PathProxy, Echo]) -> None:
    p, echo = proxy
    r, w = await connect(p)
    p.set_mode(Mode.HOLD_ANSWERS)
    w.write(b"heartbeat")
    assert await answer(r, 9) is None
    assert bytes(echo.received) == b"heartbeat"
    w.close()


async def test_reset_resets_open_and_new_connections(proxy: tuple[PathProxy, Echo]) -> None:
    p, _ = proxy
    r, w = await connect(p)
    w.write(b"x")
    assert await answer(r, 1) == b"x"
    p.set_mode(Mode.RESET)
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r.readexactly(1), 2.0)
    r2, w2 = await connect(p)
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r2.readexactly(1), 2.0)
    p.heal()
    r3, w3 = await connect(p)
    w3.write(b"y")
    assert await answer(r3, 1) == b"y"
    for x in (w, w2, w3):
        x.close()


async def test_flap_alternates_between_passing_and_holding(proxy: tuple[PathProxy, Echo]) -> None:
    p, _ = proxy
    p.set_mode(Mode.FLAP, flap_ms=200)
    passed = held = 0
    for _ in range(12):  # ~1.2 s: both phases seen, each connection new (a held one is reset)
        r, w = await connect(p)
        w.write(b"z")
        try:
            got = await asyncio.wait_for(r.readexactly(1), 0.1)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            got = None
        passed += got == b"z"
        held += got is None
        w.close()
        await asyncio.sleep(0.05)
    assert passed
    assert held
    with pytest.raises(ValueError, match="flap_ms"):
        p.set_mode(Mode.FLAP, flap_ms=1)
