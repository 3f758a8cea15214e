"""TlsChannel (data_plane/remoting/tls_channel.py): TLS on cryptography's OpenSSL between a socket's
transport and a protocol, over real loopback sockets, against itself and against the standard
library's TLS on the other end; what it verifies; what a hostile peer gets from it."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingError
from data_plane.remoting.limits import InboundLimits
from data_plane.remoting.server import Processors, RemotingServer
from data_plane.remoting.tls_channel import ENGINE_ENV, ChannelContext, TlsChannel, available, open_connection
from data_plane.tls import ServerTls, client_context, make_local_ca

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(not available(), reason="cryptography's OpenSSL bindings are not available"),
]
DEADLINE_S = 10.0


class Recorder(asyncio.BufferedProtocol):
    """Keeps what arrives; ``reads`` counts buffer_updated calls; a small buffer on request."""

    def __init__(self, buffer_bytes: int = 64 * 1024) -> None:
        self.view = memoryview(bytearray(buffer_bytes))
        self.data = bytearray()
        self.reads = 0
        self.transport: Any = None
        self.made = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.made.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        self.reads += 1
        self.data += self.view[:nbytes]

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    async def until(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + DEADLINE_S
        while len(self.data) < n:
            assert loop.time() < end, f"{len(self.data)} of {n} bytes arrived"
            await asyncio.sleep(0.005)


@pytest.fixture
def ca(tmp_path: Path) -> dict[str, str]:
    return make_local_ca(str(tmp_path / "ca"))


class ChannelServer:
    def __init__(self, context: ChannelContext, *, handshake_timeout_s: float = 5.0) -> None:
        self.context = context
        self.handshake_timeout_s = handshake_timeout_s
        self.protocols: list[Recorder] = []
        self.ended = 0  # handshakes that ended (done or failed)
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    def _app(self) -> Recorder:
        r = Recorder()
        self.protocols.append(r)
        return r

    def _end(self, _channel: TlsChannel) -> None:
        self.ended += 1

    def _channel(self) -> TlsChannel:
        return TlsChannel(
            self.context, self._app, handshake_timeout_s=self.handshake_timeout_s, on_handshake_end=self._end
        )

    async def start(self) -> ChannelServer:
        self.server = await asyncio.get_running_loop().create_server(self._channel, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for p in self.protocols:
            if p.transport is not None:
                p.transport.abort()
        await self.server.wait_closed()


@pytest_asyncio.fixture
async def server(ca: dict[str, str]) -> AsyncIterator[ChannelServer]:
    s = await ChannelServer(ChannelContext.for_server(ca["server.pem"], ca["server-key.pem"])).start()
    try:
        yield s
    finally:
        await s.close()


async def poll(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not check():
        assert loop.time() < end, what
        await asyncio.sleep(0.01)


def _payload(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


async def test_bytes_cross_both_ways_whole_and_in_order(server: ChannelServer, ca: dict[str, str], seed: int) -> None:
    rng = random.Random(seed)
    client = Recorder(buffer_bytes=rng.choice((1, 7, 4096, 300_000)))  # a tiny buffer too: many reads
    channel = await open_connection(
        lambda: client, "127.0.0.1", server.port, ChannelContext.for_client(ca["ca.pem"]), server_hostname="localhost"
    )
    assert channel.version() in ("TLSv1.3", "TLSv1.2")
    assert channel.cipher()
    assert client.transport is channel
    assert channel.get_extra_info("ssl_object") is channel
    await poll(lambda: len(server.protocols) == 1 and server.protocols[0].transport is not None, "server side made")
    peer = server.protocols[0]
    sent_up, sent_down = bytearray(), bytearray()
    for _ in range(40):
        up = _payload(rng, rng.choice((0, 1, 100, 16_384, 16_385, 70_000, rng.randrange(1, 1 << 20))))
        down = _payload(rng, rng.choice((0, 1, 100, 16_384, 16_385, 70_000, rng.randrange(1, 1 << 20))))
        if rng.random() < 0.5:
            channel.writelines([up[: len(up) // 2], up[len(up) // 2 :]])
        else:
            channel.write(up)
        peer.transport.write(memoryview(down))
        sent_up += up
        sent_down += down
    await peer.until(len(sent_up))
    await client.until(len(sent_down))
    assert peer.data == sent_up
    assert client.data == sent_down
    channel.close()  # close_notify: the other side sees the end and the connection go
    assert await asyncio.wait_for(peer.lost, DEADLINE_S) is None
    assert peer.eof
    await asyncio.wait_for(client.lost, DEADLINE_S)


async def test_it_talks_to_the_standard_librarys_tls_both_ways(
    server: ChannelServer, ca: dict[str, str], seed: int
) -> None:
    rng = random.Random(seed)
    blob = _payload(rng, 3_000_000)
    # The standard library's client against the channel's server.
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=client_context(ca_file=ca["ca.pem"]), server_hostname="localhost"
    )
    writer.write(blob)
    await writer.drain()
    await poll(lambda: len(server.protocols) == 1, "server side made")
    await server.protocols[0].until(len(blob))
    assert server.protocols[0].data == blob
    server.protocols[0].transport.write(blob[::-1])
    assert await reader.readexactly(len(blob)) == blob[::-1]
    writer.close()
    # The channel's client against the standard library's server.
    got = bytearray()
    done = asyncio.Event()

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while len(got) < len(blob):
            got.extend(await r.read(1 << 20))
        w.write(bytes(got))
        await w.drain()
        done.set()

    std = ServerTls("enforcing", ca["server.pem"], ca["server-key.pem"]).context()
    s = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=std)
    try:
        client = Recorder()
        port = s.sockets[0].getsockname()[1]
        channel = await open_connection(lambda: client, "127.0.0.1", port, ChannelContext.for_client(ca["ca.pem"]))
        channel.write(blob)
        await client.until(len(blob))
        assert bytes(got) == blob
        assert client.data == blob
        channel.close()
    finally:
        s.close()


@pytest.mark.parametrize(
    ("hostname", "other_ca", "why"),
    [
        ("localhost", True, "certificate verify failed"),  # signed by a CA the client does not trust
        ("orbit.example.com", False, "certificate verify failed"),  # a name the certificate does not carry
        ("10.1.2.3", False, "certificate verify failed"),  # an address it does not carry
    ],
)
async def test_the_client_refuses_a_certificate_it_cannot_verify(
    server: ChannelServer, ca: dict[str, str], tmp_path: Path, hostname: str, other_ca: bool, why: str
) -> None:
    trusted = make_local_ca(str(tmp_path / "other"))["ca.pem"] if other_ca else ca["ca.pem"]
    with pytest.raises(ssl.SSLCertVerificationError, match=why):
        await open_connection(
            Recorder, "127.0.0.1", server.port, ChannelContext.for_client(trusted), server_hostname=hostname
        )
    await poll(lambda: server.ended == 1, "the server's handshake ended")
    assert server.protocols == []  # the server's protocol was never made
    # Verification off (a test against one's own server) connects anyway.
    plain = await open_connection(
        Recorder, "127.0.0.1", server.port, ChannelContext.for_client(trusted, verify=False), server_hostname=hostname
    )
    plain.close()


async def test_a_peer_that_never_finishes_the_handshake_is_cut_at_the_deadline(ca: dict[str, str]) -> None:
    context = ChannelContext.for_server(ca["server.pem"], ca["server-key.pem"])
    server = await ChannelServer(context, handshake_timeout_s=0.3).start()
    try:
        loop = asyncio.get_running_loop()
        silent = socket.create_connection(("127.0.0.1", server.port))
        garbage = socket.create_connection(("127.0.0.1", server.port))
        garbage.sendall(b"\x00\x00\x00\x10GET / HTTP/1.1\r\n\r\n" * 100)
        started = loop.time()
        for s in (silent, garbage):
            s.settimeout(DEADLINE_S)
            got = await asyncio.to_thread(_read_to_end, s)
            assert not got.startswith(b"\x00")  # nothing but a TLS alert, if anything
            s.close()
        assert loop.time() - started < 3.0
        assert server.ended == 2
        assert server.protocols == []
    finally:
        await server.close()


def _read_to_end(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


async def test_paused_reading_holds_data_back_and_resuming_delivers_all_of_it(
    server: ChannelServer, ca: dict[str, str], seed: int
) -> None:
    rng = random.Random(seed)
    client = Recorder()
    channel = await open_connection(lambda: client, "127.0.0.1", server.port, ChannelContext.for_client(ca["ca.pem"]))
    await poll(lambda: len(server.protocols) == 1 and server.protocols[0].transport is not None, "server side made")
    first = _payload(rng, 100_000)
    server.protocols[0].transport.write(first)
    await client.until(len(first))
    channel.pause_reading()
    assert not channel.is_reading()
    second = _payload(rng, 4_000_000)
    server.protocols[0].transport.write(second)
    await asyncio.sleep(0.2)  # (a pause has no event to wait for: what arrives in this time is the check)
    assert len(client.data) == len(first)
    channel.resume_reading()
    await client.until(len(first) + len(second))
    assert client.data == first + second
    channel.close()


async def test_a_refused_protocol_closes_the_connection(ca: dict[str, str]) -> None:
    def refuse() -> asyncio.BaseProtocol:
        raise ConnectionRefusedError("over the listener's limit")

    context = ChannelContext.for_server(ca["server.pem"], ca["server-key.pem"])
    srv = await asyncio.get_running_loop().create_server(lambda: TlsChannel(context, refuse), "127.0.0.1", 0)
    try:
        client = Recorder()
        port = srv.sockets[0].getsockname()[1]
        try:
            channel = await open_connection(lambda: client, "127.0.0.1", port, ChannelContext.for_client(ca["ca.pem"]))
        except (OSError, ssl.SSLError):  # (TLS 1.3: the server may cut it before the client's handshake ends)
            refused_in_handshake = True
        else:
            refused_in_handshake = False
            channel.write(b"hello")
            await asyncio.wait_for(client.lost, DEADLINE_S)  # the server cut it after the handshake
        assert refused_in_handshake or client.lost.done()
        assert client.data == b""  # nothing was served either way
    finally:
        srv.close()


async def test_a_plain_protocol_gets_data_received_in_order(server: ChannelServer, ca: dict[str, str]) -> None:
    got = bytearray()
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    class Plain(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            assert isinstance(data, bytes)
            got.extend(data)

        def connection_lost(self, exc: Exception | None) -> None:
            lost.set_result(None)

    channel = await open_connection(Plain, "127.0.0.1", server.port, ChannelContext.for_client(ca["ca.pem"]))
    await poll(lambda: len(server.protocols) == 1 and server.protocols[0].transport is not None, "server side made")
    blob = bytes(range(256)) * 4096  # 1 MiB: more than one read's worth
    server.protocols[0].transport.write(blob)
    await poll(lambda: len(got) >= len(blob), "the blob arrived")
    assert got == blob
    channel.close()
    await asyncio.wait_for(lost, DEADLINE_S)


async def test_the_remoting_server_makes_no_connection_for_a_failed_handshake(ca: dict[str, str]) -> None:
    server = RemotingServer(Processors(), tls=ServerTls("enforcing", ca["server.pem"], ca["server-key.pem"]))
    await server.start()
    try:
        for _ in range(20):  # plain frames and half handshakes
            with socket.create_connection(("127.0.0.1", server.port)) as s:
                s.sendall(b"\x00\x00\x00\x20" + b"\x00" * 32)
                s.settimeout(DEADLINE_S)
                await asyncio.to_thread(_read_to_end, s)
        assert server.connections == set()
        client = RemotingClient(ssl_context=client_context(ca_file=ca["ca.pem"]))
        try:
            answer = await client.invoke(server.address, RemotingCommand(106), 5000)
            assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED  # (no processors): it was read
            assert len(server.connections) == 1
            assert server.tls_connections == 1
        finally:
            await client.close()
    finally:
        await server.close()


async def test_the_standard_librarys_tls_is_used_when_asked(
    ca: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENGINE_ENV, "stdlib")
    assert not available()
    other = make_local_ca(str(tmp_path / "other-ca"))
    server = RemotingServer(Processors(), tls=ServerTls("enforcing", ca["server.pem"], ca["server-key.pem"]))
    await server.start()
    client = RemotingClient(ssl_context=client_context(ca_file=ca["ca.pem"]))
    untrusting = RemotingClient(ssl_context=client_context(ca_file=other["ca.pem"]))
    try:
        answer = await client.invoke(server.address, RemotingCommand(106), 5000)
        assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        transport = client._conns[server.address].transport
        assert transport is not None
        assert isinstance(transport.get_extra_info("ssl_object"), ssl.SSLObject)
        with pytest.raises(RemotingError, match=r"certificate verify failed|CERTIFICATE_VERIFY_FAILED"):
            await untrusting.invoke(server.address, RemotingCommand(106), 5000)
    finally:
        await client.close()
        await untrusting.close()
        await server.close()


async def test_handshakes_under_way_count_against_the_connection_limit_and_end_with_the_server(
    ca: dict[str, str],
) -> None:
    server = RemotingServer(
        Processors(),
        tls=ServerTls("enforcing", ca["server.pem"], ca["server-key.pem"]),
        limits=InboundLimits(max_connections_total=3),
    )
    await server.start()
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]  # never say hello
    try:
        for s in stalled:
            s.settimeout(DEADLINE_S)
        # Two past the limit are closed as they are accepted, long before the handshake deadline.
        refused = [await asyncio.to_thread(_closed_within, s, 3.0) for s in stalled[3:]]
        assert refused == [True, True]
        assert server.refused.get("max_connections_total") == 2
        assert not any([await asyncio.to_thread(_closed_within, s, 0.3) for s in stalled[:3]])  # held
        await server.close()  # and the three under way end with the server
        assert all([await asyncio.to_thread(_closed_within, s, 3.0) for s in stalled[:3]])
    finally:
        for s in stalled:
            s.close()
        await server.close()


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
