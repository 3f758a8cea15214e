"""Frame floods against a real name server and broker (data_plane/remoting/limits.py).

The attacker speaks raw TCP from other loopback addresses (127.0.0.2 …) while the SDK's clients
use 127.0.0.1, so per-address caps fall on the attacker alone:

* many connections announcing 16 MiB frames and sending 15 MiB of each are closed, and the
  server's RSS grows by far less than the ~630 MB they send (the unprotected server buffered all
  of it); the refusals are counted by reason and logged, rate-limited; SDK clients keep working;
* a frame trickled a byte at a time is closed at the frame deadline, a connection sending whole
  frames is not;
* connections past the per-address and the total cap are closed as they open;
* a fresh connection may not announce a frame over ``max_first_frame_bytes`` (with the shared
  allowance off) while a proven one may; a producer whose first request is a 4 MiB batch is served
  under the defaults;
* incomplete frames together stay within ``max_partial_frame_bytes_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from data_plane.refusal_log import LOG_BURST
from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes
from sdk import Message, MessageQueue, Producer, PullConsumer
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until

pytestmark = pytest.mark.timing  # (floods: the servers' CPU and memory are measured)

MIB = 1024 * 1024
ATTACKER = "127.0.0.2"
UNKNOWN_CODE = 9999  # answered REQUEST_CODE_NOT_SUPPORTED by both servers: proof a frame was served
Servers = tuple[ServerProcess, ServerProcess]  # (name server, broker)


# --- the attacker's tools -------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def connect(addr: str, source: str = ATTACKER) -> socket.socket:
    host, _, port = addr.rpartition(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(10)
    s.connect((host, int(port)))
    return s


def request(body: bytes = b"", opaque: int = 1) -> bytes:
    return encode_bytes(RemotingCommand(UNKNOWN_CODE, opaque=opaque, body=body))


def request_of_length(length: int, opaque: int = 1) -> bytes:
    """A whole request frame whose length field is exactly ``length``."""
    overhead = len(request(opaque=opaque)) - 4
    return request(b"b" * (length - overhead), opaque)


def answer(s: socket.socket, timeout_s: float = 10.0) -> RemotingCommand:
    s.settimeout(timeout_s)
    head = _read_exactly(s, 4)
    return decode_frame(_read_exactly(s, struct.unpack(">I", head)[0]))


def _read_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by the server")
        out += chunk
    return bytes(out)


def served(s: socket.socket, opaque: int = 1) -> bool:
    """The server answers a small request on ``s``."""
    s.sendall(request(opaque=opaque))
    r = answer(s)
    return r.is_response and r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and r.opaque == opaque


def served_soon(addr: str, held: list[socket.socket], source: str = ATTACKER, timeout_s: float = 5.0) -> int:
    """Connect from ``source`` until a connection is served (the server may take a moment to see
    a connection closed and give its place back); the attempts refused on the way."""
    deadline = time.monotonic() + timeout_s
    refused = 0
    time.sleep(0.2)
    while True:
        s = connect(addr, source)
        held.append(s)
        try:
            assert served(s)
        except OSError:
            if time.monotonic() > deadline:
                raise
            refused += 1
            time.sleep(0.1)
        else:
            return refused


def closed_within(s: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the server closed ``s`` (EOF or reset, reading whatever it sent before),
    or None if it is still open after ``timeout_s``."""
    start = time.monotonic()
    while (left := start + timeout_s - time.monotonic()) > 0:
        if not select.select([s], [], [], left)[0]:
            return None
        try:
            if not s.recv(65536):
                return time.monotonic() - start
        except OSError:  # reset
            return time.monotonic() - start
    return None


def open_now(s: socket.socket) -> bool:
    return closed_within(s, 0.3) is None


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for s in held:
            s.close()


def flood(addr: str, held: list[socket.socket], n: int, announce: int, send: int) -> int:
    """``n`` connections each announcing a frame of ``announce`` bytes and sending ``send`` of
    them (at once, from threads); the connections the server read it all from."""
    payload = b"\0" * send  # one buffer, shared by every sender

    def one(_: int) -> bool:
        s = connect(addr)
        held.append(s)
        s.settimeout(30)
        try:
            s.sendall(struct.pack(">I", announce))
            s.sendall(payload)
        except OSError:  # closed by the server while we sent
            return False
        return True

    with ThreadPoolExecutor(n) as pool:
        return sum(pool.map(one, range(n)))


# --- the servers, and what they say -------------------------------------------------------------
def servers(start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess], *,
            namesrv_flags: tuple[str, ...] = (), broker_settings: tuple[str, ...] = ()) -> Servers:  # fmt: skip
    ns = start_namesrv(*namesrv_flags)
    broker_flags = [flag for kv in broker_settings for flag in ("--set", kv)]
    return ns, start_broker(ns.address, *broker_flags)


def refusal_lines(server: ServerProcess, reason: str) -> list[str]:
    return [
        line
        for line in server.log_text().splitlines()
        if re.search(rf"closing connection from {re.escape(ATTACKER)}:\d+ \({reason}\)", line)
    ]


async def broker_refusals(broker: ServerProcess) -> dict[str, int]:
    """The broker's refusal counters, from its runtime info (GET_BROKER_RUNTIME_INFO)."""
    client = RemotingClient()
    try:
        r = await client.invoke(broker.address, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), 5000)
    finally:
        await client.close()
    table = bodies.loads_object(r.body_bytes())["table"]
    return {k.removeprefix("refused."): int(v) for k, v in table.items() if k.startswith("refused.")}


async def round_trip(namesrv_addr: str, topic: str) -> None:
    """An SDK producer sends a message and a pull consumer reads it back."""
    body = f"still served {time.monotonic_ns()}".encode()
    async with Producer(f"p-{topic}", namesrv_addrs=namesrv_addr, instance_name=f"p-{topic}") as producer:
        await producer.create_topic(topic, queue_nums=1)
        await producer.send(Message(topic, body))
    consumer = PullConsumer(
        f"c-{topic}", namesrv_addrs=namesrv_addr, instance_name=f"c-{topic}", consume_from="FIRST_OFFSET"
    )
    consumer.assign([MessageQueue(topic, "broker-a", 0)])
    await consumer.start()
    got: list[bytes] = []
    try:

        async def arrived() -> bool:
            got.extend(m.body for m in await consumer.poll(timeout_ms=200))
            return body in got

        await until(arrived, f"the message sent to {topic} read back")
    finally:
        await consumer.shutdown()


# --- the flood ------------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("target", ["namesrv", "broker"])
async def test_many_connections_announcing_16_mib_frames_are_closed_and_memory_stays_bounded(
    target: str, start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess]
) -> None:
    ns, broker = servers(
        start_namesrv, start_broker,
        namesrv_flags=("--frame-complete-timeout-ms", "3000"), broker_settings=("frame_complete_timeout_ms=3000",),
    )  # fmt: skip
    victim = ns if target == "namesrv" else broker
    await round_trip(ns.address, "Before")
    before = rss_bytes(victim.proc.pid)
    n, announce, send = 40, 16 * MIB, 15 * MIB  # ~630 MB sent, all of it buffered unprotected
    peak = before
    with sockets() as held:
        attack = asyncio.ensure_future(asyncio.to_thread(flood, victim.address, held, n, announce, send))
        while not attack.done():
            peak = max(peak, rss_bytes(victim.proc.pid))
            await asyncio.sleep(0.02)
        read_whole = attack.result()
        # SDK clients are served while the attack's admitted frames are still held ...
        await round_trip(ns.address, "During")
        peak = max(peak, rss_bytes(victim.proc.pid))
        assert peak - before < 100 * MIB, f"RSS grew by {(peak - before) / MIB:.0f} MiB"
        # Only what the unproven connections' shared allowance (32 MiB) admits was read whole ...
        assert read_whole <= 2
        # ... and every attacking connection is closed: at once, or at the frame deadline.
        assert all(closed_within(s, 10) is not None for s in held)
    assert victim.proc.poll() is None
    await round_trip(ns.address, "After")
    # Refused at the length prefix (over max_first_frame_bytes, past the allowance) or closed at
    # the deadline; logged as one line each with the source address, at most LOG_BURST of them.
    assert len(refusal_lines(victim, "max_first_frame_bytes")) == LOG_BURST  # of n - 2 refused
    if victim is broker:
        counts = await broker_refusals(broker)
        assert counts.get("max_first_frame_bytes", 0) + counts.get("frame_complete_timeout_ms", 0) == n
        assert counts.get("max_first_frame_bytes", 0) >= n - 2


# --- the slow frame -------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("target", ["namesrv", "broker"])
async def test_a_trickled_frame_is_closed_at_the_deadline_and_whole_frames_are_not(
    target: str, start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess]
) -> None:
    ns, broker = servers(
        start_namesrv, start_broker,
        namesrv_flags=("--frame-complete-timeout-ms", "1000"), broker_settings=("frame_complete_timeout_ms=1000",),
    )  # fmt: skip
    victim = ns if target == "namesrv" else broker

    def trickle_and_talk() -> tuple[float | None, bool]:
        with sockets() as held:
            slow, steady = connect(victim.address), connect(victim.address)
            held += [slow, steady]
            frame = request(b"x" * 200)
            slow.sendall(frame[:12])
            start, closed_after, sent = time.monotonic(), None, 12
            while time.monotonic() - start < 5 and sent < len(frame):
                with contextlib.suppress(OSError):  # a byte every 100 ms: never idle, never done
                    slow.sendall(frame[sent : sent + 1])
                sent += 1
                assert served(steady, opaque=sent)  # whole frames, over the same seconds
                if closed_within(slow, 0.1) is not None:
                    closed_after = time.monotonic() - start
                    break
            return closed_after, served(steady, opaque=1)

    closed_after, steady_served = await asyncio.to_thread(trickle_and_talk)
    assert closed_after is not None, "the trickled frame's connection was never closed"
    assert 0.9 <= closed_after <= 3.0
    assert steady_served
    assert len(refusal_lines(victim, "frame_complete_timeout_ms")) == 1
    await round_trip(ns.address, "AfterTrickle")


# --- connection caps ------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("target", ["namesrv", "broker"])
async def test_connections_past_the_per_address_cap_are_closed_and_other_addresses_served(
    target: str, start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess]
) -> None:
    cap = 8
    ns, broker = servers(
        start_namesrv, start_broker,
        namesrv_flags=("--max-connections-per-address", str(cap)),
        broker_settings=(f"max_connections_per_address={cap}",),
    )  # fmt: skip
    victim = ns if target == "namesrv" else broker

    def fill_and_overflow() -> int:
        with sockets() as held:
            for _ in range(cap):
                held.append(connect(victim.address))
            assert all(served(s) for s in held)
            extra = connect(victim.address)
            held.append(extra)
            assert closed_within(extra, 3) is not None  # the one past the cap: closed as it opens
            assert all(open_now(s) and served(s, 2) for s in held[:cap])
            other = connect(victim.address, source="127.0.0.3")  # another address: its own count
            held.append(other)
            assert served(other)
            held[0].close()  # one of the address's connections goes: room for one more
            return 1 + served_soon(victim.address, held)

    refused = await asyncio.to_thread(fill_and_overflow)
    await round_trip(ns.address, "PerAddress")
    assert len(refusal_lines(victim, "max_connections_per_address")) == refused
    if victim is broker:
        assert (await broker_refusals(broker)).get("max_connections_per_address") == refused


@pytest.mark.asyncio
async def test_connections_past_the_total_cap_are_closed(start_namesrv: Callable[..., ServerProcess]) -> None:
    ns = start_namesrv("--max-connections-total", "6")

    def fill_and_overflow() -> None:
        with sockets() as held:
            for i in range(6):  # from three addresses: the cap is on all of them together
                held.append(connect(ns.address, source=f"127.0.0.{2 + i % 3}"))
            assert all(served(s) for s in held)
            extra = connect(ns.address, source="127.0.0.5")
            held.append(extra)
            assert closed_within(extra, 3) is not None
            held[0].close()
            served_soon(ns.address, held, source="127.0.0.5")

    await asyncio.to_thread(fill_and_overflow)
    assert "(max_connections_total)" in ns.log_text()


# --- first frames ---------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_fresh_connection_may_not_announce_a_large_frame_but_a_proven_one_may(
    start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess]
) -> None:
    ns, broker = servers(start_namesrv, start_broker, broker_settings=("max_large_first_frame_bytes_total=0",))

    def attack() -> None:
        with sockets() as held:
            fresh = connect(broker.address)
            held.append(fresh)
            with contextlib.suppress(OSError):  # (reset as soon as the prefix is read)
                fresh.sendall(struct.pack(">I", 2 * MIB) + b"\0" * (64 * 1024))
            closed_after = closed_within(fresh, 5)
            assert closed_after is not None
            assert closed_after < 2  # at its length prefix, not at a deadline
            exactly = connect(broker.address)  # a first frame of exactly max_first_frame_bytes
            held.append(exactly)
            exactly.sendall(request_of_length(MIB))
            assert answer(exactly).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            proven = connect(broker.address)
            held.append(proven)
            assert served(proven)  # its first frame, complete: proven from now on
            proven.sendall(request_of_length(4 * MIB, opaque=7))
            r = answer(proven)
            assert (r.code, r.opaque) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 7)

    await asyncio.to_thread(attack)
    assert (await broker_refusals(broker)).get("max_first_frame_bytes") == 1
    await round_trip(ns.address, "FirstFrames")


@pytest.mark.asyncio
async def test_a_producer_whose_first_request_is_a_4_mib_batch_is_served(
    start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess]
) -> None:
    """Under the defaults: the shared allowance for large first frames admits it."""
    ns, _broker = servers(start_namesrv, start_broker)
    async with Producer("creator", namesrv_addrs=ns.address, instance_name="creator") as creator:
        await creator.create_topic("BigFirst", queue_nums=1)
    msgs = [Message("BigFirst", bytes([65 + i]) * (MIB - 512)) for i in range(4)]
    async with Producer("big-first", namesrv_addrs=ns.address, instance_name="big-first") as producer:
        result = await producer.send_batch(msgs)
    assert len(result.msg_ids) == 4


# --- the total ------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_incomplete_frames_together_stay_within_the_total(
    start_namesrv: Callable[..., ServerProcess], start_broker: Callable[..., ServerProcess]
) -> None:
    ns, broker = servers(
        start_namesrv, start_broker,
        broker_settings=(f"max_frame_bytes={4 * MIB}", f"max_partial_frame_bytes_total={10 * MIB}"),
    )  # fmt: skip

    def attack() -> None:
        with sockets() as held:
            frames = [request_of_length(3 * MIB, opaque=100 + i) for i in range(5)]
            conns = []
            for _ in range(5):
                s = connect(broker.address)
                held.append(s)
                assert served(s)  # proven: only the total limits it now
                conns.append(s)
            for s, frame in zip(conns[:3], frames, strict=False):  # 9 MiB reserved of 10
                s.sendall(frame[:MIB])
            with contextlib.suppress(OSError):  # 3 MiB more would pass the total: closed
                conns[3].sendall(frames[3][:MIB])
            assert closed_within(conns[3], 3) is not None
            assert all(open_now(s) for s in conns[:3])
            conns[0].sendall(frames[0][MIB:])  # one completes: its reservation is given back
            assert answer(conns[0]).opaque == 100
            conns[4].sendall(frames[4])
            assert answer(conns[4]).opaque == 104
            for s, frame in zip(conns[1:3], frames[1:3], strict=True):
                s.sendall(frame[MIB:])
                assert answer(s).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

    await asyncio.to_thread(attack)
    assert (await broker_refusals(broker)).get("max_partial_frame_bytes_total") == 1
    await round_trip(ns.address, "Total")
