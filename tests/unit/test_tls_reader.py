"""TlsReader on a client connection: answers of every size, cut anywhere by the TLS records and
the reads, arrive whole and unchanged — large ones decrypted straight into a buffer of their
own — and a frame over the connection's limit is refused. Real TLS over loopback: a server
that writes its answers in random pieces, the SDK's RemotingClient reading them."""

from __future__ import annotations

import asyncio
import random
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import FLAG_RESPONSE
from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes
from data_plane.remoting.connection import TLS_FRAME_DIRECT_BYTES
from data_plane.remoting.errors import RemotingError
from data_plane.tls import ServerTls, client_context, make_local_ca

pytestmark = pytest.mark.asyncio
_LEN = struct.Struct(">i")


def _body(size: int, salt: int) -> bytes:
    pattern = bytes((i * 31 + salt) & 0xFF for i in range(997))
    return (pattern * (size // 997 + 1))[:size]


class _PieceServer:
    """Answers each request with a body of the size its ``size`` field asks for, written in
    random pieces (each drained before the next, so each goes out in TLS records of its own)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = _LEN.unpack(await reader.readexactly(4))
                req = decode_frame(await reader.readexactly(length))
                ext = req.ext_fields or {}
                size = int(ext["size"])
                if ext.get("lie") == "1":  # a length prefix over the client's limit
                    writer.write(_LEN.pack(int(ext["claim"])) + b"x" * 64)
                    await writer.drain()
                    continue
                out = RemotingCommand(0, opaque=req.opaque, flag=FLAG_RESPONSE, body=_body(size, req.opaque))
                data = encode_bytes(out)
                pos = 0
                while pos < len(data):
                    step = self.rng.choice((1, 3, 5, 700, 16_384, 40_000, 1 << 20))
                    writer.write(data[pos : pos + step])
                    await writer.drain()
                    pos += step
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def tls_server(tmp_path: Path, seed: int) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    ca = make_local_ca(str(tmp_path / "ca"))
    server_ctx = ServerTls("enforcing", ca["server.pem"], ca["server-key.pem"]).context()
    piece = _PieceServer(random.Random(seed))
    server = await asyncio.start_server(piece.serve, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"localhost:{port}", client_context(ca_file=ca["ca.pem"])
    finally:
        server.close()
        await server.wait_closed()


async def test_answers_of_every_size_arrive_whole_over_tls(tls_server: tuple[str, ssl.SSLContext], seed: int) -> None:
    addr, ctx = tls_server
    rng = random.Random(seed)
    sizes = [0, 10, TLS_FRAME_DIRECT_BYTES - 200, TLS_FRAME_DIRECT_BYTES, 70_000, 300_000, 2_000_000]
    sizes += [rng.randrange(0, 400_000) for _ in range(30)]
    client = RemotingClient(ssl_context=ctx)
    try:
        for _ in range(3):  # one at a time, then several in flight (frames back to back in a read)
            rng.shuffle(sizes)
            got = await asyncio.gather(
                *(client.invoke(addr, RemotingCommand(11, ext_fields={"size": str(n)}), 10_000) for n in sizes)
            )
            for n, resp in zip(sizes, got, strict=True):
                body = resp.body_bytes()
                assert len(body) == n
                assert body == _body(n, resp.opaque), n
    finally:
        await client.close()


async def test_a_frame_over_the_limit_is_refused_and_nothing_is_buffered_for_it(
    tls_server: tuple[str, ssl.SSLContext],
) -> None:
    addr, ctx = tls_server
    client = RemotingClient(ssl_context=ctx, max_frame_bytes=1 << 20)
    try:
        ok = await client.invoke(addr, RemotingCommand(11, ext_fields={"size": "200000"}), 10_000)
        assert len(ok.body_bytes()) == 200_000
        lie = RemotingCommand(11, ext_fields={"size": "0", "lie": "1", "claim": str((1 << 20) + 1)})
        with pytest.raises(RemotingError):
            await client.invoke(addr, lie, 3_000)
        assert all(c.closed for c in client._conns.values())  # closed over it, not waiting for 1 MiB
    finally:
        await client.close()
