"""Remoting over real sockets on 127.0.0.1 (port 0): RemotingServer with a Processors table and
RemotingClient in this process. Covers opaque multiplexing, oneway requests, timeouts, error
answers that keep the connection, frames that close it (too large, malformed), idle closing,
back-pressure from a client that never reads, connection loss, reconnecting, and one run under
uvloop. Raw clients are asyncio streams speaking the frame format directly."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from data_plane.remoting.command import (
    MAX_FRAME_BYTES,
    SERIALIZE_ROCKETMQ,
    RemotingCommand,
    decode_frame,
    encode,
    encode_bytes,
)
from data_plane.remoting.connection import ANSWER_SLICE, IDLE_TIMEOUT_S, WRITE_HIGH_WATER, Connection, Dispatch
from data_plane.remoting.errors import (
    HeaderError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from data_plane.remoting.server import Processors, RemotingServer

pytestmark = pytest.mark.integration

ECHO = 9001
DELAYED = 9002
HEADER_ERROR = 9003
BOOM = 9004
ASYNC_HEADER_ERROR = 9005
ASYNC_BOOM = 9006
NEVER = 9007
ABORT = 9008
BIG = 9009
RECORD = 9010
CALL_BACK = 9011
BUSY = 9012
PARKED = 9013
NOT_REGISTERED = 9999
BIG_BODY = b"B" * (256 * 1024)


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_s} s")
        await asyncio.sleep(0.005)


class App:
    """The handlers of the test server, and what they saw."""

    def __init__(self) -> None:
        self.recorded: list[RemotingCommand] = []
        self.finish_order: list[str] = []
        self.late_done = asyncio.Event()
        self.finished_at: list[float] = []  # when each BUSY request's handling ended
        self.release = asyncio.Event()  # what PARKED requests wait for

    def processors(self) -> Processors:
        p = Processors()
        p.register(ECHO, self.echo)
        p.register(DELAYED, self.delayed)
        p.register(HEADER_ERROR, self.header_error)
        p.register(BOOM, self.boom)
        p.register(ASYNC_HEADER_ERROR, self.async_header_error)
        p.register(ASYNC_BOOM, self.async_boom)
        p.register(NEVER, lambda conn, cmd: None)
        p.register(ABORT, self.abort)
        p.register(BIG, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=BIG_BODY))
        p.register(RECORD, self.record)
        p.register(CALL_BACK, self.call_back)
        p.register(BUSY, self.busy)
        p.register(PARKED, self.parked)
        return p

    def echo(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, remark="echo", ext_fields=cmd.ext_fields, body=cmd.body_bytes())

    async def delayed(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields or {}
        await asyncio.sleep(int(ext["delayMs"]) / 1000)
        self.finish_order.append(ext["id"])
        if ext.get("late"):
            asyncio.get_running_loop().call_soon(self.late_done.set)
        return cmd.response(ResponseCode.SUCCESS, remark=ext["id"])

    def header_error(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise HeaderError("missing header field 'topic'")

    def boom(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("boom")

    async def async_header_error(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0)
        raise HeaderError("header field 'queueId' = 99 is outside [0, 7]")

    async def async_boom(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0)
        raise RuntimeError("async boom")

    def abort(self, conn: Connection, cmd: RemotingCommand) -> None:
        conn.abort()

    def record(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.recorded.append(cmd)
        return cmd.response(ResponseCode.SUCCESS, remark="must not be sent to a oneway request")

    def busy(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """A request that keeps the event loop busy (CPU-bound work) for ``ms``."""
        time.sleep(int((cmd.ext_fields or {})["ms"]) / 1000)
        self.finish_order.append(str(cmd.opaque))
        self.finished_at.append(time.monotonic())
        return cmd.response(ResponseCode.SUCCESS, remark=str(cmd.opaque))

    def parked(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        """A request that waits for ``release`` as a held pull waits for a message (``park``)."""
        conn.park()

        async def answer() -> RemotingCommand:
            await self.release.wait()
            conn.unpark()
            return cmd.response(ResponseCode.SUCCESS, remark="released")

        return answer()

    async def call_back(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        answer = await conn.invoke(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, remark="ping"), 3000)
        return cmd.response(ResponseCode.SUCCESS, remark=f"client said {answer.remark}")


@contextlib.asynccontextmanager
async def serving(
    app: App,
    *,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    answer_slice: int = ANSWER_SLICE,
    before_write: Callable[[], object] | None = None,
) -> AsyncIterator[RemotingServer]:
    server = RemotingServer(
        app.processors(),
        port=0,
        max_frame_bytes=max_frame_bytes,
        idle_timeout_s=idle_timeout_s,
        answer_slice=answer_slice,
    )
    server.before_write = before_write
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def client_of(
    *, dispatch: Dispatch | None = None, connect_timeout_ms: int = 3000
) -> AsyncIterator[RemotingClient]:
    client = RemotingClient(dispatch, connect_timeout_ms=connect_timeout_ms)
    try:
        yield client
    finally:
        await client.close()


async def echo(client: RemotingClient, addr: str, text: str = "hi", timeout_ms: int = 3000) -> None:
    r = await client.invoke(addr, RemotingCommand(ECHO, ext_fields={"t": text}, body=text.encode()), timeout_ms)
    assert r.is_response
    assert (r.code, r.remark, r.ext_fields, r.body) == (ResponseCode.SUCCESS, "echo", {"t": text}, text.encode())


@contextlib.asynccontextmanager
async def raw_connection(addr: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def read_frame(reader: asyncio.StreamReader) -> RemotingCommand:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    return decode_frame(await reader.readexactly(length))


async def closed_by_peer(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bool:
    """True once the server closed the connection (EOF or reset), reading anything it sent."""

    async def drain() -> None:
        while await reader.read(65536):
            pass

    try:
        await asyncio.wait_for(drain(), timeout_s)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def delayed(ident: str, delay_ms: int, *, late: bool = False) -> RemotingCommand:
    ext = {"id": ident, "delayMs": str(delay_ms)}
    if late:
        ext["late"] = "1"
    return RemotingCommand(DELAYED, ext_fields=ext)


# --- request / response ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_concurrent_requests_answered_out_of_order_each_get_their_own_answer(seed: int) -> None:
    app = App()
    rng = random.Random(seed)
    n = 100
    delays = list(range(0, 2 * n, 2))
    rng.shuffle(delays)
    async with serving(app) as server, client_of() as client:
        answers = await asyncio.gather(
            *(client.invoke(server.address, delayed(str(i), delays[i]), 10_000) for i in range(n))
        )
        assert [a.remark for a in answers] == [str(i) for i in range(n)]
        assert all(a.code == ResponseCode.SUCCESS and a.is_response for a in answers)
        # The server really did finish them out of order, and all on one connection.
        assert app.finish_order != [str(i) for i in range(n)]
        assert sorted(app.finish_order, key=int) == [str(i) for i in range(n)]
        assert len(server.connections) == 1


@pytest.mark.asyncio
async def test_a_oneway_request_is_handled_and_gets_no_response() -> None:
    app = App()
    async with serving(app) as server, raw_connection(server.address) as (reader, writer):
        writer.write(encode_bytes(RemotingCommand(RECORD, opaque=1, flag=FLAG_ONEWAY, ext_fields={"n": "1"})))
        writer.write(encode_bytes(RemotingCommand(ECHO, opaque=2, ext_fields={"t": "x"})))
        await writer.drain()
        first = await asyncio.wait_for(read_frame(reader), 5)
        assert (first.opaque, first.remark) == (2, "echo")  # nothing came back for opaque 1
        assert [c.ext_fields for c in app.recorded] == [{"n": "1"}]
        assert app.recorded[0].is_oneway


@pytest.mark.asyncio
async def test_a_oneway_request_to_an_async_handler_gets_no_response() -> None:
    app = App()
    async with serving(app) as server, raw_connection(server.address) as (reader, writer):
        oneway = delayed("x", 1)
        oneway.opaque, oneway.flag = 1, FLAG_ONEWAY
        writer.write(encode_bytes(oneway))
        await writer.drain()
        await until(lambda: app.finish_order == ["x"], what="the oneway handler")
        writer.write(encode_bytes(RemotingCommand(ECHO, opaque=2)))
        await writer.drain()
        assert (await asyncio.wait_for(read_frame(reader), 5)).opaque == 2


@pytest.mark.asyncio
async def test_the_clients_invoke_oneway_reaches_the_handler() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        await client.invoke_oneway(server.address, RemotingCommand(RECORD, ext_fields={"k": "v"}))
        await until(lambda: len(app.recorded) == 1, what="the oneway request")
        assert app.recorded[0].ext_fields == {"k": "v"}
        assert app.recorded[0].is_oneway
        await echo(client, server.address)


@pytest.mark.asyncio
async def test_a_binary_request_gets_a_binary_response_on_the_wire() -> None:
    app = App()
    async with serving(app) as server, raw_connection(server.address) as (reader, writer):
        request = RemotingCommand(ECHO, opaque=5, ext_fields={"t": "b"}, body=b"xyz", serialize_type=SERIALIZE_ROCKETMQ)
        writer.write(encode_bytes(request))
        await writer.drain()
        head = await asyncio.wait_for(reader.readexactly(8), 5)
        assert head[4] == SERIALIZE_ROCKETMQ
        (length,) = struct.unpack_from(">I", head)
        rest = await reader.readexactly(length - 4)
        response = decode_frame(head[4:] + rest)
        assert (response.opaque, response.remark, response.ext_fields, response.body) == (5, "echo", {"t": "b"}, b"xyz")
        assert response.serialize_type == SERIALIZE_ROCKETMQ


@pytest.mark.asyncio
async def test_a_request_that_times_out_raises_remoting_timeout_and_its_late_answer_is_ignored() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        started = time.monotonic()
        with pytest.raises(RemotingTimeoutError) as info:
            await client.invoke(server.address, delayed("late", 400, late=True), timeout_ms=50)
        assert time.monotonic() - started < 0.35
        assert isinstance(info.value, asyncio.TimeoutError)
        assert isinstance(info.value, RemotingError)
        assert (info.value.code, info.value.timeout_ms) == (DELAYED, 50)
        conn = await client.connection(server.address)
        await asyncio.wait_for(app.late_done.wait(), 5)
        # The late answer is on the wire ahead of this echo's; it must not be taken for it.
        await echo(client, server.address, "after")
        assert await client.connection(server.address) is conn
        assert not conn.closed


@pytest.mark.asyncio
async def test_requests_with_different_timeouts_each_time_out_at_their_own_deadline() -> None:
    """One timer serves every request of a connection: a shorter timeout sent after longer ones
    still fires first, and answered requests in between do not disturb either."""
    app = App()
    async with serving(app) as server, client_of() as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        failed_at: dict[int, float] = {}

        async def wait_out(timeout_ms: int) -> None:
            with pytest.raises(RemotingTimeoutError) as info:
                await client.invoke(server.address, RemotingCommand(NEVER), timeout_ms=timeout_ms)
            assert info.value.timeout_ms == timeout_ms
            failed_at[timeout_ms] = loop.time() - started

        waits = [asyncio.create_task(wait_out(ms)) for ms in (900, 600, 150)]
        for i in range(20):  # answered along the way
            await echo(client, server.address, f"between {i}", timeout_ms=900)
        await asyncio.gather(*waits)
        assert sorted(failed_at, key=failed_at.__getitem__) == [150, 600, 900]
        for ms, at in failed_at.items():
            assert ms / 1000 <= at + 0.01, failed_at  # never early (loop clock granularity aside)
            assert at < ms / 1000 + 0.3, failed_at
        conn = await client.connection(server.address)
        assert not conn._pending  # nothing left waiting


@pytest.mark.asyncio
async def test_a_request_whose_caller_gave_up_is_forgotten() -> None:
    """A caller cancels its wait (asyncio.wait_for); the request is dropped from the table of
    requests waiting for answers once later ones pass it, not kept until the connection closes."""
    app = App()
    async with serving(app) as server, client_of() as client:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.invoke(server.address, RemotingCommand(NEVER), timeout_ms=60_000), 0.05)
        conn = await client.connection(server.address)
        for i in range(3):
            await echo(client, server.address, f"later {i}", timeout_ms=60_000)
        assert not conn._pending


@pytest.mark.asyncio
async def test_answered_requests_are_let_go_while_an_earlier_one_still_waits() -> None:
    """A request the server holds (as a broker holds a long-polling pull) sits at the front of
    its timeout's deadlines; the answered requests sent after it are let go at once — their
    futures, and the answers (frames, reads) those hold, are freed — and the connection's
    bookkeeping stays within a bound of what still waits, not of what was ever sent."""
    app = App()
    async with serving(app) as server, client_of() as client:
        held = asyncio.ensure_future(client.invoke(server.address, RemotingCommand(NEVER), timeout_ms=60_000))
        conn = await client.connection(server.address)
        await until(lambda: len(conn._pending) == 1, what="the held request sent")
        answered: list[weakref.ref[asyncio.Future[RemotingCommand]]] = []
        for i in range(1_000):
            cmd = RemotingCommand(ECHO, ext_fields={"t": str(i)}, body=b"x" * 1024)
            fut = conn.invoke(cmd, 60_000)
            assert (await fut).ext_fields == {"t": str(i)}
            answered.append(weakref.ref(fut))
            del fut
            entries = sum(len(d) for d in conn._deadlines.values())
            assert entries <= 2 * (len(conn._pending) + 1) + 64, (i, entries)  # as of the last send
        await asyncio.sleep(0.01)  # the loop's last handle (the last wake-up) lets go of the last future
        assert [i for i, r in enumerate(answered) if r() is not None] == []
        assert len(conn._pending) == 1  # the held one still waits (and times out in its turn)
        assert not held.done()
        held.cancel()


@pytest.mark.asyncio
async def test_timeout_is_catchable_as_asyncio_timeout_error() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        with pytest.raises(asyncio.TimeoutError):
            await client.invoke(server.address, RemotingCommand(NEVER), timeout_ms=30)


# --- error answers that keep the connection -----------------------------------------------------
@pytest.mark.asyncio
async def test_an_unknown_request_code_is_answered_not_supported_and_the_connection_stays() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        await echo(client, server.address)
        conn = await client.connection(server.address)
        r = await client.invoke(server.address, RemotingCommand(NOT_REGISTERED))
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert str(NOT_REGISTERED) in (r.remark or "")
        await echo(client, server.address)
        assert await client.connection(server.address) is conn
        assert len(server.connections) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("code", "remark"),
    [
        (HEADER_ERROR, "missing header field 'topic'"),
        (ASYNC_HEADER_ERROR, "header field 'queueId' = 99 is outside [0, 7]"),
    ],
)
async def test_a_handler_header_error_is_answered_system_error_with_its_message(code: int, remark: str) -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        await echo(client, server.address)
        conn = await client.connection(server.address)
        r = await client.invoke(server.address, RemotingCommand(code))
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, remark)
        await echo(client, server.address)
        assert await client.connection(server.address) is conn


@pytest.mark.asyncio
@pytest.mark.parametrize(("code", "message"), [(BOOM, "RuntimeError: boom"), (ASYNC_BOOM, "RuntimeError: async boom")])
async def test_a_handler_crash_is_answered_system_error_and_the_server_keeps_serving(code: int, message: str) -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        r = await client.invoke(server.address, RemotingCommand(code))
        assert r.code == ResponseCode.SYSTEM_ERROR
        assert message in (r.remark or "")
        await echo(client, server.address)
        async with client_of() as other:
            await echo(other, server.address)


@pytest.mark.asyncio
async def test_a_before_hook_may_answer_instead_of_the_handler() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        server.processors.before = lambda conn, cmd: (
            cmd.response(ResponseCode.NO_PERMISSION, "denied") if (cmd.ext_fields or {}).get("t") == "deny" else None
        )
        r = await client.invoke(server.address, RemotingCommand(ECHO, ext_fields={"t": "deny"}))
        assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "denied")
        await echo(client, server.address, "allow")


@contextlib.asynccontextmanager
async def two_in_flight(app: App) -> AsyncIterator[tuple[str, RemotingClient, Connection]]:
    """A server whose connection to the client takes two requests in flight at most."""
    async with serving(app) as server, client_of() as client:
        await echo(client, server.address)
        (server_conn,) = server.connections
        server_conn.max_inflight = 2
        yield server.address, client, server_conn


async def three_working_requests(client: RemotingClient, addr: str) -> list[int]:
    """Three requests that work 200 ms each, at once: their answers' codes, sorted."""
    answers = await asyncio.gather(*(client.invoke(addr, delayed(str(i), 200), 5000) for i in range(3)))
    return sorted(a.code for a in answers)


TWO_TAKEN = [ResponseCode.SUCCESS, ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY]


@pytest.mark.asyncio
async def test_requests_over_the_inflight_limit_are_answered_system_busy() -> None:
    async with two_in_flight(App()) as (addr, client, _server_conn):
        assert await three_working_requests(client, addr) == TWO_TAKEN
        await echo(client, addr)


@pytest.mark.asyncio
async def test_parked_requests_do_not_count_against_the_inflight_limit() -> None:
    app = App()
    async with two_in_flight(app) as (addr, client, server_conn):
        # Ten waiting in one connection (a consumer's held pulls, one a queue), past the limit
        parked = [asyncio.ensure_future(client.invoke(addr, RemotingCommand(PARKED), 5000)) for _ in range(10)]
        await until(lambda: server_conn.parked == 10, what="ten requests parked")
        assert server_conn.inflight == 10
        assert await three_working_requests(client, addr) == TWO_TAKEN  # work: still up to the limit
        assert not any(p.done() for p in parked)
        app.release.set()
        assert [(r.code, r.remark) for r in await asyncio.gather(*parked)] == [(ResponseCode.SUCCESS, "released")] * 10
        assert (server_conn.parked, server_conn.inflight) == (0, 0)


@pytest.mark.asyncio
async def test_the_server_can_ask_the_client_and_the_client_answers() -> None:
    app = App()

    def client_dispatch(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, remark=f"pong to {cmd.remark}")

    async with serving(app) as server, client_of(dispatch=client_dispatch) as client:
        r = await client.invoke(server.address, RemotingCommand(CALL_BACK))
        assert (r.code, r.remark) == (ResponseCode.SUCCESS, "client said pong to ping")


# --- answers in slices -------------------------------------------------------------------------------
def _pipelined(addr: str, requests: int, busy_ms: int) -> list[tuple[float, RemotingCommand]]:
    """From a thread (the server's loop is busy in its handlers): ``requests`` BUSY requests in
    one write, then each answer with the time it had fully arrived."""
    host, _, port = addr.rpartition(":")
    frames = b"".join(
        encode_bytes(RemotingCommand(BUSY, opaque=i, ext_fields={"ms": str(busy_ms)})) for i in range(1, requests + 1)
    )
    got: list[tuple[float, RemotingCommand]] = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frames)
        buf = b""
        while len(got) < requests:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(got)} answers"
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
                n = 4 + struct.unpack_from(">I", buf)[0]
                got.append((time.monotonic(), decode_frame(buf[4:n])))
                buf = buf[n:]
    return got


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("answer_slice", "writes"), [(4, [4, 8, 10]), (3, [3, 6, 9, 10]), (0, [10]), (1, list(range(1, 11)))]
)
async def test_a_reads_answers_leave_in_slices_the_first_before_the_rest_are_handled(
    answer_slice: int, writes: list[int]
) -> None:
    """Ten requests arrive in one read, each keeping the loop busy for 40 ms: with a slice of
    4 the first four answers reach the client before the fifth request is done, and the
    ``before_write`` hook (the broker's store writes there) runs before each slice's write."""
    app = App()
    handled_before_write: list[int] = []
    async with serving(
        app, answer_slice=answer_slice, before_write=lambda: handled_before_write.append(len(app.finish_order))
    ) as server:
        got = await asyncio.to_thread(_pipelined, server.address, 10, 40)
    assert [c.remark for _, c in got] == [str(i) for i in range(1, 11)]
    assert all(c.code == ResponseCode.SUCCESS for _, c in got)
    assert handled_before_write == writes
    # Each answer arrived after its own handling and before the handling of the next slice's
    # last request ended (40 ms of margin at least); with no slices, all after the last.
    for (arrived, _), i in zip(got, range(10), strict=True):
        assert arrived >= app.finished_at[i]
        last_of_slice = next(w for w in writes if w > i)
        assert arrived >= app.finished_at[last_of_slice - 1]
        if last_of_slice < 10:
            assert arrived < app.finished_at[last_of_slice], (i, writes)


# --- frames that close the connection -----------------------------------------------------------
@pytest.mark.asyncio
async def test_a_frame_over_the_servers_limit_closes_only_that_connection() -> None:
    app = App()
    async with serving(app, max_frame_bytes=1024) as server, client_of() as big, client_of() as other:
        await echo(other, server.address)
        await echo(big, server.address, "x" * 300)
        with pytest.raises(RemotingConnectError):
            await big.invoke(server.address, RemotingCommand(ECHO, body=b"x" * 2000), timeout_ms=5000)
        await until(lambda: len(server.connections) == 1, what="the server dropping the big client")
        await echo(other, server.address)
        # The offending client comes back on a new connection.
        await echo(big, server.address, "small again")


@pytest.mark.asyncio
async def test_a_length_prefix_over_the_default_16_mib_closes_the_connection() -> None:
    app = App()
    async with serving(app) as server, client_of() as other:
        await echo(other, server.address)
        async with raw_connection(server.address) as (reader, writer):
            writer.write(struct.pack(">I", MAX_FRAME_BYTES + 1))
            await writer.drain()
            assert await closed_by_peer(reader)
        await echo(other, server.address)
        await until(lambda: len(server.connections) == 1, what="the server forgetting the closed connection")


@pytest.mark.asyncio
async def test_a_frame_of_exactly_the_limit_is_accepted() -> None:
    app = App()
    async with serving(app, max_frame_bytes=4096) as server, raw_connection(server.address) as (reader, writer):
        probe = encode_bytes(RemotingCommand(ECHO, opaque=1))
        body = b"y" * (4096 + 4 - len(probe))
        frame = encode_bytes(RemotingCommand(ECHO, opaque=1, body=body))
        assert struct.unpack_from(">I", frame)[0] == 4096
        writer.write(frame)
        await writer.drain()
        assert (await asyncio.wait_for(read_frame(reader), 5)).body == body


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">II", 13, 9) + b"{not json",
        struct.pack(">II", 6, 2) + b"[]",
        struct.pack(">II", 6, (7 << 24) | 2) + b"{}",
        struct.pack(">I", 2) + b"ab",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["non-json-header", "json-array-header", "unknown-serialization", "length-under-4", "http"],
)
async def test_a_malformed_frame_closes_that_connection_and_the_server_serves_others(garbage: bytes) -> None:
    app = App()
    async with serving(app) as server, client_of() as other:
        await echo(other, server.address)
        async with raw_connection(server.address) as (reader, writer):
            writer.write(encode_bytes(RemotingCommand(ECHO, opaque=1)))
            await writer.drain()
            assert (await asyncio.wait_for(read_frame(reader), 5)).opaque == 1  # a good frame is answered
            writer.write(garbage)
            await writer.drain()
            assert await closed_by_peer(reader)
        await echo(other, server.address)
        await until(lambda: len(server.connections) == 1, what="the server forgetting the closed connection")


@pytest.mark.asyncio
async def test_a_header_number_out_of_range_closes_the_connection_as_a_malformed_frame(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App()
    async with serving(app) as server, client_of() as other:
        async with raw_connection(server.address) as (reader, writer):
            header = b'{"code":9001,"opaque":1e300}'
            writer.write(struct.pack(">II", 4 + len(header), len(header)) + header)
            await writer.drain()
            assert await closed_by_peer(reader)
        await echo(other, server.address)
    # Refused by the codec, not by an exception escaping the protocol into the event loop.
    assert "malformed frame" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


# --- idle, back-pressure, loss, reconnect -----------------------------------------------------
@pytest.mark.asyncio
async def test_an_idle_connection_is_closed_after_the_idle_timeout_but_an_active_one_is_not() -> None:
    app = App()
    async with serving(app, idle_timeout_s=0.3) as server, client_of() as client:
        await echo(client, server.address)
        conn = await client.connection(server.address)
        # Traffic every 0.1 s for three idle timeouts keeps the connection.
        end = time.monotonic() + 0.9
        while time.monotonic() < end:
            await echo(client, server.address)
            await asyncio.sleep(0.1)
        assert not conn.closed
        assert await client.connection(server.address) is conn
        # Silence closes it (from the server side; the client sees it close).
        await asyncio.wait_for(conn.closed_event.wait(), 5)
        await until(lambda: not server.connections, what="the server dropping the idle connection")
        # The client connects again when next asked.
        await echo(client, server.address)
        assert await client.connection(server.address) is not conn


@pytest.mark.asyncio
async def test_an_idle_raw_connection_that_never_sent_anything_is_closed() -> None:
    app = App()
    async with serving(app, idle_timeout_s=0.3) as server, raw_connection(server.address) as (reader, _):
        started = time.monotonic()
        assert await closed_by_peer(reader, 5)
        assert time.monotonic() - started >= 0.25


async def stall(addr: str, requests: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw client that sends ``requests`` BIG requests and never reads the answers."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=1024)
    for i in range(requests):
        writer.write(encode_bytes(RemotingCommand(BIG, opaque=i + 1)))
    await writer.drain()
    return reader, writer


async def stalled_client_does_not_block_others() -> None:
    app = App()
    async with serving(app) as server, client_of() as other:
        await echo(other, server.address)
        (other_conn,) = server.connections
        _, writer = await stall(server.address, 80)  # 80 x 256 KiB = 20 MiB of answers
        try:
            await until(lambda: len(server.connections) == 2, what="the stalled client connecting")
            (stalled,) = server.connections - {other_conn}
            assert stalled.transport is not None
            transport = stalled.transport
            # Back-pressure engaged: the server buffers past its high-water mark and stops reading.
            await until(lambda: stalled.write_buffer_bytes >= WRITE_HIGH_WATER, what="the write buffer filling")
            await until(lambda: not transport.is_reading(), what="the server pausing its reads")
            for i in range(20):
                started = time.monotonic()
                await echo(other, server.address, f"prompt {i}", timeout_ms=2000)
                assert time.monotonic() - started < 1.0
        finally:
            writer.close()
        await until(lambda: len(server.connections) == 1, what="the stalled connection going away")


@pytest.mark.asyncio
async def test_a_client_that_never_reads_does_not_stop_the_server_answering_another() -> None:
    await stalled_client_does_not_block_others()


@pytest.mark.asyncio
async def test_a_client_that_never_reads_is_dropped_after_the_idle_timeout() -> None:
    app = App()
    async with serving(app, idle_timeout_s=0.3) as server:
        _, writer = await stall(server.address, 80)
        try:
            await until(lambda: len(server.connections) == 1, what="the stalled client connecting")
            (stalled,) = server.connections
            await until(lambda: stalled.write_buffer_bytes > 0, what="answers piling up")
            await until(lambda: stalled.closed, timeout_s=5, what="the stalled connection closing")
        finally:
            writer.close()


@pytest.mark.asyncio
async def test_closing_the_server_drops_a_client_that_never_reads() -> None:
    app = App()
    server = RemotingServer(app.processors(), port=0)
    await server.start()
    _, writer = await stall(server.address, 80)
    try:
        await until(lambda: len(server.connections) == 1, what="the stalled client connecting")
        (stalled,) = server.connections
        await until(lambda: stalled.write_buffer_bytes >= WRITE_HIGH_WATER, what="the write buffer filling")
        await asyncio.wait_for(server.close(), 10)
        await until(lambda: stalled.closed, timeout_s=5, what="the stalled connection closing")
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_losing_the_connection_fails_pending_requests_with_remoting_connect_error() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        await echo(client, server.address)
        conn = await client.connection(server.address)
        pending = [
            asyncio.ensure_future(client.invoke(server.address, RemotingCommand(NEVER), 30_000)) for _ in range(3)
        ]
        await client.invoke_oneway(server.address, RemotingCommand(ABORT))
        results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 5)
        assert all(isinstance(r, RemotingConnectError) for r in results), results
        assert conn.closed
        # A request on a closed connection fails at once, too.
        with pytest.raises(RemotingConnectError):
            await conn.invoke(RemotingCommand(ECHO), 1000)
        # The client reconnects.
        await echo(client, server.address)
        assert await client.connection(server.address) is not conn


@pytest.mark.asyncio
async def test_the_client_reconnects_after_the_server_restarts_on_the_same_port() -> None:
    app = App()
    server = RemotingServer(app.processors(), port=0)
    await server.start()
    port = server.port
    async with client_of(connect_timeout_ms=1000) as client:
        try:
            await echo(client, server.address)
            conn = await client.connection(server.address)
        finally:
            await server.close()
        await asyncio.wait_for(conn.closed_event.wait(), 5)
        with pytest.raises(RemotingConnectError):
            await echo(client, f"127.0.0.1:{port}")
        again = RemotingServer(app.processors(), port=port)
        await again.start()
        try:
            assert again.address == f"127.0.0.1:{port}"
            await echo(client, again.address, "back")
            assert await client.connection(again.address) is not conn
        finally:
            await again.close()


@pytest.mark.asyncio
async def test_concurrent_first_requests_share_one_connection() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        await asyncio.gather(*(echo(client, server.address, str(i)) for i in range(20)))
        assert len(server.connections) == 1


@pytest.mark.asyncio
async def test_connecting_to_a_closed_port_raises_remoting_connect_error() -> None:
    app = App()
    server = RemotingServer(app.processors(), port=0)
    await server.start()
    addr = server.address
    await server.close()
    async with client_of(connect_timeout_ms=1000) as client:
        with pytest.raises(RemotingConnectError, match=addr):
            await echo(client, addr)


# --- uvloop ---------------------------------------------------------------------------------------
def run_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    loop = uvloop.new_event_loop()
    try:
        assert "uvloop" in type(loop).__module__
        loop.run_until_complete(scenario())
    finally:
        loop.close()


def test_requests_oneway_timeouts_and_malformed_frames_behave_the_same_under_uvloop(seed: int) -> None:
    rng = random.Random(seed)

    async def scenario() -> None:
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        app = App()
        async with serving(app) as server, client_of() as client:
            delays = list(range(0, 100, 2))
            rng.shuffle(delays)
            answers = await asyncio.gather(
                *(client.invoke(server.address, delayed(str(i), d), 10_000) for i, d in enumerate(delays))
            )
            assert [a.remark for a in answers] == [str(i) for i in range(50)]
            assert app.finish_order != [str(i) for i in range(50)]
            await client.invoke_oneway(server.address, RemotingCommand(RECORD))
            await until(lambda: len(app.recorded) == 1, what="the oneway request")
            with pytest.raises(RemotingTimeoutError):
                await client.invoke(server.address, RemotingCommand(NEVER), timeout_ms=30)
            r = await client.invoke(server.address, RemotingCommand(NOT_REGISTERED))
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            async with raw_connection(server.address) as (reader, writer):
                writer.write(struct.pack(">II", 13, 9) + b"{not json")
                await writer.drain()
                assert await closed_by_peer(reader)
            await echo(client, server.address)
            await until(lambda: len(server.connections) == 1, what="the server forgetting the closed connection")

    run_on_uvloop(scenario)


def test_a_client_that_never_reads_does_not_stop_the_server_answering_another_under_uvloop() -> None:
    run_on_uvloop(stalled_client_does_not_block_others)


# --- requests laid out by the caller, answered to a waiter (Connection.invoke_frame) ---------------
class Waited:
    """A waiter (``connection.Waiter``): records what it was given and whether the connection
    was inside a read at the time."""

    def __init__(self, conn: Connection, *, wanted: bool = True) -> None:
        self.conn = conn
        self.wanted = wanted
        self.results: list[RemotingCommand] = []
        self.errors: list[BaseException] = []
        self.in_read: list[bool] = []

    def done(self) -> bool:
        return not self.wanted or bool(self.results or self.errors)

    def set_result(self, result: RemotingCommand) -> None:
        self.in_read.append(self.conn._in_read)
        self.results.append(result)

    def set_exception(self, exception: BaseException) -> None:
        self.errors.append(exception)


def _laid_out(conn: Connection, cmd: RemotingCommand) -> tuple[int, bytes, bytes]:
    """``cmd``'s opaque (the connection's next), head and body, laid out as a caller of
    ``invoke_frame`` does."""
    cmd.opaque = conn.next_opaque()
    head, *body = encode(cmd)
    return cmd.opaque, bytes(head), b"".join(bytes(b) for b in body)


def _text_request(code: int, text: str) -> RemotingCommand:
    return RemotingCommand(code, ext_fields={"t": text}, body=text.encode())


@pytest.mark.asyncio
async def test_laid_out_requests_are_answered_to_their_own_waiters_inside_the_read() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        conn = await client.connection(server.address)
        waiters = []
        for i in range(6):
            opaque, head, body = _laid_out(conn, _text_request(ECHO, f"req-{i}"))
            w = Waited(conn)
            conn.invoke_frame(opaque, ECHO, head, body, 3000, w)
            waiters.append((opaque, w))
        await until(lambda: all(w.results for _, w in waiters), what="every answer")
        for i, (opaque, w) in enumerate(waiters):
            (r,) = w.results
            expected = (opaque, "echo", {"t": f"req-{i}"}, f"req-{i}".encode())
            assert (r.opaque, r.remark, r.ext_fields, r.body_bytes()) == expected
            assert w.in_read == [True], "set_result runs in the read that brought the answer"
            assert not w.errors
        assert not conn._pending
        await echo(client, server.address, "the connection still serves futures")


@pytest.mark.asyncio
async def test_a_laid_out_request_times_out_to_its_waiter_and_a_closed_connection_fails_it_at_once() -> None:
    app = App()
    async with serving(app) as server, client_of() as client:
        conn = await client.connection(server.address)
        opaque, head, body = _laid_out(conn, _text_request(NEVER, "never"))
        w = Waited(conn)
        conn.invoke_frame(opaque, NEVER, head, body, 50, w)
        await until(lambda: bool(w.errors), what="the timeout")
        (e,) = w.errors
        assert isinstance(e, RemotingTimeoutError)
        assert (e.code, e.timeout_ms) == (NEVER, 50)
        assert not w.results
        # a waiter no longer wanted (its sender gave up): its late answer is dropped
        unwanted = Waited(conn)
        late, late_head, late_body = _laid_out(conn, delayed("gone", 100, late=True))
        conn.invoke_frame(late, DELAYED, late_head, late_body, 3000, unwanted)
        unwanted.wanted = False
        await asyncio.wait_for(app.late_done.wait(), 5)
        await echo(client, server.address, "after the unwanted answer")
        assert not unwanted.results
        assert not unwanted.errors
        assert late not in conn._pending
        conn.close()
        await until(lambda: conn.closed, what="the close")
        opaque, head, body = _laid_out(conn, _text_request(ECHO, "late"))
        closed = Waited(conn)
        conn.invoke_frame(opaque, ECHO, head, body, 3000, closed)
        (e,) = closed.errors  # at once, within the call
        assert isinstance(e, RemotingConnectError)
        assert not conn._out, "nothing is queued on a closed connection"


# --- requests answered straight from their frames (Connection.frame_handler) -----------------------
FRAMED = 9020


class FrameHandler:
    """A frame handler: answers FRAMED requests from their frames, leaves the rest (None) to
    the table; raises for one carrying ``boom``. Records the opaque of every frame it saw."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, conn: Connection, frame: bytes | bytearray | memoryview) -> bytes | None:
        cmd = decode_frame(frame)
        self.seen.append(cmd.opaque)
        if cmd.code != FRAMED:
            return None
        if (cmd.ext_fields or {}).get("boom"):
            raise RuntimeError("a bug in the frame handler")
        return encode_bytes(cmd.response(ResponseCode.SUCCESS, remark=f"framed {cmd.opaque}"))


@pytest.mark.asyncio
async def test_a_frame_handler_answers_in_order_among_the_tables_answers_and_leaves_it_the_rest() -> None:
    app = App()
    handler = FrameHandler()
    async with serving(app) as server:
        server.processors.frame_handler = handler
        async with raw_connection(server.address) as (reader, writer):
            requests = [
                RemotingCommand(FRAMED, opaque=1),
                RemotingCommand(ECHO, opaque=2, ext_fields={"t": "x"}, body=b"x"),
                RemotingCommand(FRAMED, opaque=3),
                RemotingCommand(NOT_REGISTERED, opaque=4),
            ]
            writer.write(b"".join(encode_bytes(r) for r in requests))  # one read for the server
            answers = [await asyncio.wait_for(read_frame(reader), 5) for _ in requests]
    assert [a.opaque for a in answers] == [1, 2, 3, 4]
    assert [a.remark for a in answers[:3]] == ["framed 1", "echo", "framed 3"]
    assert answers[3].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert handler.seen == [1, 2, 3, 4]  # every frame offered to it first


@pytest.mark.asyncio
async def test_connections_made_while_a_before_check_is_set_go_without_the_frame_handler() -> None:
    app = App()
    handler = FrameHandler()
    checked: list[int] = []
    async with serving(app) as server:
        server.processors.frame_handler = handler
        server.processors.register(FRAMED, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, remark="table"))
        server.processors.before = lambda conn, cmd: checked.append(cmd.opaque)  # (None: let through)
        async with raw_connection(server.address) as (reader, writer):
            writer.write(encode_bytes(RemotingCommand(FRAMED, opaque=7)))
            answer = await asyncio.wait_for(read_frame(reader), 5)
        # the table answered, after the check: the frame handler never saw it
        assert (answer.opaque, answer.remark) == (7, "table")
        assert checked == [7]
        assert handler.seen == []
        server.processors.before = None
        async with raw_connection(server.address) as (reader, writer):
            writer.write(encode_bytes(RemotingCommand(FRAMED, opaque=8)))
            answer = await asyncio.wait_for(read_frame(reader), 5)
        assert (answer.opaque, answer.remark) == (8, "framed 8")


@pytest.mark.asyncio
async def test_a_failing_frame_handler_closes_only_that_connection() -> None:
    app = App()
    async with serving(app) as server, client_of() as other:
        server.processors.frame_handler = FrameHandler()
        await echo(other, server.address)
        async with raw_connection(server.address) as (reader, writer):
            writer.write(encode_bytes(RemotingCommand(FRAMED, opaque=5, ext_fields={"boom": "1"})))
            assert await closed_by_peer(reader)
        await echo(other, server.address, "still served")
        await until(lambda: len(server.connections) == 1, what="the failed connection going away")
