"""What a byte costs to send and receive over loopback: plain TCP, and TLS two ways.

- ``plain``: the event loop's TCP transport (what a plain connection uses);
- ``tls-channel``: ``data_plane.remoting.tls_channel`` (what a TLS connection uses): the
  OpenSSL ``cryptography`` ships, over memory buffers, decrypting into the protocol's buffer;
- ``tls-memory-bio``: the event loop's TLS transport, the system's OpenSSL over memory buffers
  (what a TLS connection uses with ``ORBIT_TLS_ENGINE=stdlib``);
- ``tls-socket``: the system's OpenSSL reading and writing the socket itself (``ssl.SSLSocket``,
  non-blocking).

A sender process writes ``--mib`` MiB in pieces of ``--chunk-kib`` KiB (a pull's answer) to a receiver
process; each reports its CPU seconds, and the figures are CPU microseconds per KiB on each side.
It also reports AES-256-GCM's speed in the system's OpenSSL and in the one ``cryptography``
bundles (``cipher_gb_per_s``). The difference between ``tls-channel`` and ``plain`` is what TLS
adds to every consumed message (about 1 KiB); see ``orbit bench e2e --tls`` for the end-to-end
ratio.

    python -m benchmarks.tls_transport [--mib 2048] [--chunk-kib 130] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import orjson

from benchmarks.machine import python_loop_ns
from benchmarks.output import emit, header
from data_plane.interpreter import interpreter_facts
from data_plane.remoting.tls_channel import ChannelContext, TlsChannel, open_connection
from data_plane.tls import CA_FILE, CERT_FILE, KEY_FILE, client_context, make_local_ca

MODES = ("plain", "tls-channel", "tls-memory-bio", "tls-socket")
TIMEOUT_S = 300.0  # a measurement's transfer, at most


def _server_context(files: dict[str, str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files["cert"], files["key"])
    return ctx


async def _wait_fd(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


async def _handshake(loop: asyncio.AbstractEventLoop, s: ssl.SSLSocket) -> None:
    while True:
        try:
            s.do_handshake()
            return
        except ssl.SSLWantReadError:
            await _wait_fd(loop, s.fileno(), write=False)
        except ssl.SSLWantWriteError:
            await _wait_fd(loop, s.fileno(), write=True)


class _Pump(asyncio.Protocol):
    """Writes ``total`` bytes of ``piece`` as fast as the transport takes them."""

    def __init__(self, piece: bytes, total: int, done: asyncio.Future[None]) -> None:
        self.piece, self.left, self.done = piece, total, done
        self.paused = False
        self.transport: Any = None
        self.connected: asyncio.Future[None] = done.get_loop().create_future()
        self.closed: asyncio.Future[None] = done.get_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.connected.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()

    def pump(self) -> None:
        while not self.paused and self.left > 0:
            self.transport.write(self.piece)
            self.left -= len(self.piece)
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)


async def _send(mode: str, files: dict[str, str], listener: socket.socket, piece: bytes, total: int) -> float:
    loop = asyncio.get_running_loop()
    sock, _ = await loop.sock_accept(listener)
    sock.setblocking(False)
    if mode == "tls-socket":
        s = _server_context(files).wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        await _handshake(loop, s)
        started = time.process_time()
        left = total
        while left > 0:
            try:
                s.send(piece)  # (no partial writes: OpenSSL finishes the piece or asks to be called again)
                left -= len(piece)
            except (ssl.SSLWantWriteError, BlockingIOError):
                await _wait_fd(loop, s.fileno(), write=True)
        spent = time.process_time() - started
        s.close()
        return spent
    done: asyncio.Future[None] = loop.create_future()
    pump = _Pump(piece, total, done)
    if mode == "tls-channel":
        channel = ChannelContext.for_server(files["cert"], files["key"])
        await loop.connect_accepted_socket(lambda: TlsChannel(channel, lambda: pump), sock)
    else:
        await loop.connect_accepted_socket(
            lambda: pump, sock, ssl=_server_context(files) if mode == "tls-memory-bio" else None
        )
    await asyncio.wait_for(pump.connected, TIMEOUT_S)  # (the handshake done)
    transport = pump.transport
    started = time.process_time()
    pump.pump()
    await done
    transport.close()  # (after what it holds is written)
    await pump.closed
    return time.process_time() - started


class _Sink(asyncio.BufferedProtocol):
    def __init__(self, total: int, done: asyncio.Future[None]) -> None:
        self.view = memoryview(bytearray(256 * 1024))
        self.left, self.done = total, done

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        self.left -= nbytes
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed with {self.left} bytes to come"))


async def _receive(mode: str, files: dict[str, str], port: int, total: int) -> float:
    loop = asyncio.get_running_loop()
    ctx = client_context(ca_file=files["ca"])
    done: asyncio.Future[None] = loop.create_future()
    if mode == "tls-socket":
        raw = socket.socket()
        raw.setblocking(False)
        await loop.sock_connect(raw, ("127.0.0.1", port))
        s = ctx.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False)
        await _handshake(loop, s)
        view = memoryview(bytearray(256 * 1024))
        left = total

        def readable() -> None:
            nonlocal left
            try:
                while left > 0:
                    try:
                        n = s.recv_into(view)
                    except ssl.SSLWantReadError:
                        return
                    if not n:
                        raise ConnectionError(f"closed with {left} bytes to come")
                    left -= n
                done.set_result(None)
            except Exception as e:  # (a reset, a TLS error): the measurement fails, it does not hang
                done.set_exception(e)
            loop.remove_reader(s.fileno())

        started = time.process_time()
        loop.add_reader(s.fileno(), readable)
        await asyncio.wait_for(done, TIMEOUT_S)
        spent = time.process_time() - started
        s.close()
        return spent
    sink = _Sink(total, done)
    tls = mode == "tls-memory-bio"
    transport: asyncio.BaseTransport
    if mode == "tls-channel":
        channel = ChannelContext.for_client(files["ca"])
        transport = await open_connection(lambda: sink, "127.0.0.1", port, channel, server_hostname="localhost")
    else:
        transport, _ = await loop.create_connection(
            lambda: sink, "127.0.0.1", port, ssl=ctx if tls else None, server_hostname="localhost" if tls else None
        )
    started = time.process_time()
    await asyncio.wait_for(done, TIMEOUT_S)
    spent = time.process_time() - started
    transport.close()
    return spent


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def measure(mode: str, files: dict[str, str], mib: int, chunk_kib: int) -> dict[str, float]:
    total = mib << 20
    piece = os.urandom(chunk_kib << 10)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # the sender
        code = 1
        try:
            os.close(r)
            spent = _run_loop(_send(mode, files, listener, piece, total))
            os.write(w, orjson.dumps(spent))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    listener.close()
    try:
        wall = time.perf_counter()
        received = _run_loop(_receive(mode, files, port, total))
        wall = time.perf_counter() - wall
    except BaseException:
        os.kill(child, signal.SIGKILL)
        raise
    finally:
        _, status = os.waitpid(child, 0)
        answer = os.read(r, 64)
        os.close(r)
    if status:
        raise RuntimeError(f"the sender exited with status {status}")
    sent = orjson.loads(answer)
    kib = total / 1024
    return {
        "sender_us_per_kib": round(sent * 1e6 / kib, 3),
        "receiver_us_per_kib": round(received * 1e6 / kib, 3),
        "mb_per_s": round(total / wall / 1e6),
    }


def cipher_gb_per_s(seconds: float = 1.0) -> dict[str, float | None]:
    """AES-256-GCM over 16 KiB records (what TLS 1.3 negotiates here), one core: the system's
    OpenSSL (``openssl speed``; None without the binary) and the release ``cryptography`` bundles
    (its AESGCM, called from Python: a little under what OpenSSL itself does)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    out: dict[str, float | None] = {"system_openssl": None}
    try:
        run = subprocess.run(
            ["openssl", "speed", "-seconds", str(max(1, round(seconds))), "-bytes", "16384", "-evp", "aes-256-gcm"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        last = run.stdout.strip().splitlines()[-1].split()
        out["system_openssl"] = round(float(last[-1].rstrip("k")) * 1000 / 1e9, 2)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    key = AESGCM(os.urandom(32))
    nonce, record = os.urandom(12), os.urandom(16384)
    done = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for _ in range(100):
            key.encrypt(nonce, record, None)
        done += 100
    out["bundled_openssl"] = round(done * 16384 / (time.perf_counter() - began) / 1e9, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tls_transport", description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=2048, help="MiB sent in each measurement (default 2048)")
    ap.add_argument("--chunk-kib", type=int, default=130, help="KiB a write hands over (default 130, a pull's answer)")
    ap.add_argument("--rounds", type=int, default=2, help="measurements of each mode, interleaved (default 2)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    if not 1 <= args.mib <= 65536 or not 1 <= args.chunk_kib <= 16384 or not 1 <= args.rounds <= 20:
        ap.error("--mib 1..65536, --chunk-kib 1..16384, --rounds 1..20")
    with tempfile.TemporaryDirectory(prefix="orbit-tls-bench-") as d:
        made = make_local_ca(d)
        files = {"cert": made[CERT_FILE], "key": made[KEY_FILE], "ca": made[CA_FILE]}
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                runs[mode].append(measure(mode, files, args.mib, args.chunk_kib))
                print(mode, runs[mode][-1], file=sys.stderr, flush=True)
    median = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    plain, tls, stdlib = median["plain"], median["tls-channel"], median["tls-memory-bio"]
    result = {
        **header("tls_transport", argv),
        "options": {"mib": args.mib, "chunk_kib": args.chunk_kib, "rounds": args.rounds},
        "machine": {"cpus": os.cpu_count(), **interpreter_facts(), "python_loop_ns": python_loop_ns()},
        "cipher_gb_per_s": cipher_gb_per_s(),
        "runs": runs,
        "median": median,
        "tls_adds_us_per_kib": {
            "sender": round(tls["sender_us_per_kib"] - plain["sender_us_per_kib"], 3),
            "receiver": round(tls["receiver_us_per_kib"] - plain["receiver_us_per_kib"], 3),
        },
        "stdlib_tls_adds_us_per_kib": {
            "sender": round(stdlib["sender_us_per_kib"] - plain["sender_us_per_kib"], 3),
            "receiver": round(stdlib["receiver_us_per_kib"] - plain["receiver_us_per_kib"], 3),
        },
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
