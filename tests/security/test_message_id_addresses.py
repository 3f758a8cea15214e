"""Security: a message id must not make the CLI or the SDK connect to an address it encodes.

An offset message id is 16 bytes: store host IPv4 (4), port (4), CommitLog offset (8). A
producer's message id (UNIQ_KEY) is 16 bytes of another layout (client IP, pid, a per-process
part, time, counter) written the same way, 32 hex digits. ``orbit message get`` decoded every
id as an offset id and connected to the address in it: a stock client's UNIQ_KEY ``0100007F…``
sent the CLI to 1.0.0.127, and anyone who hands an operator an id picks where the operator's
machine connects (with its credentials, when it signs requests). Now an offset id is read only
from a broker the name servers list; any other id is looked up by topic in the brokers' indexes.

Real name server and broker processes; the "elsewhere" address is a listening socket of the
test on 127.0.0.1 that no route lists, and it must accept nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
import pytest_asyncio

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import ResponseCode
from data_plane.store.message import decode_message_id, encode_message_id, pack_host
from sdk import Message, Producer, protocol
from sdk.admin import AdminClient, AdminError
from tests.integration import helpers
from tests.integration.conftest import (  # noqa: F401
    ServerProcess,
    namesrv,
    processes,
    start_broker,
    start_namesrv,
)

TOPIC = "orders"
OTHER_TOPIC = "payments"
# What a client that writes its IPv4 address low byte first puts at the head of a UNIQ_KEY on
# 127.0.0.1: read as an offset id, 1.0.0.127 port 10911.
STOCK_UNIQ_KEY = "0100007F00002A9F" + "5E2B7A10C3D40001"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1 that no route lists: the address an attacker's id names."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s
    finally:
        s.close()


def accepted(s: socket.socket) -> int:
    """How many connections reached ``s`` (the kernel queues them whether or not the client is
    still there)."""
    s.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = s.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def offset_id(host: str, port: int, offset: int = 0) -> str:
    return encode_message_id(pack_host(host, port), offset)


def orbit(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    return helpers.orbit(dict(env, ORBIT_NAMESRV=ns), *args, timeout_s=60.0)


async def run_orbit(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(orbit, ns, *args)


@pytest_asyncio.fixture
async def routed(
    namesrv: ServerProcess,  # noqa: F811
    start_broker: Callable[..., ServerProcess],  # noqa: F811
) -> tuple[str, str]:
    """A name server and a broker with topics ``orders`` and ``payments`` on its routes:
    (name server address, broker address)."""
    broker = start_broker(namesrv.address)
    async with AdminClient([namesrv.address]) as admin:
        for topic in (TOPIC, OTHER_TOPIC):
            await admin.create_topic(topic, queue_nums=2)

        async def routed() -> bool:
            try:
                return all([await admin.route(t) for t in (TOPIC, OTHER_TOPIC)])
            except AdminError:
                return False

        await helpers.until(routed, "the topics' routes")
    return namesrv.address, broker.address


async def send(ns: str, body: bytes) -> tuple[str, str]:
    """Send ``body`` to ``orders`` with the SDK: (its UNIQ_KEY msg_id, its offset msg id)."""
    async with Producer("id-test-producer", namesrv_addrs=ns, instance_name="id-test") as p:
        r = await p.send(Message(TOPIC, body))
    return r.msg_id, r.offset_msg_id


@pytest.mark.asyncio
async def test_an_offset_like_id_of_an_unlisted_address_makes_no_connection(
    routed: tuple[str, str], listener: socket.socket
) -> None:
    ns, _broker = routed
    forged = offset_id("127.0.0.1", listener.getsockname()[1])

    started = time.monotonic()
    r = await run_orbit(ns, "message", "get", forged)
    assert accepted(listener) == 0, r.stderr
    assert r.returncode != 0, r.stdout
    assert "--topic" in r.stderr, r.stderr  # the id may be a UNIQ_KEY: the CLI asks for its topic
    assert "Traceback" not in r.stderr

    # With a topic the id is looked up in the topic's indexes: not found, still no connection.
    r = await run_orbit(ns, "message", "get", forged, "--topic", TOPIC)
    assert accepted(listener) == 0, r.stderr
    assert r.returncode != 0, r.stdout
    assert f"no message of {TOPIC} has the id {forged}" in r.stderr, r.stderr

    # The stock client's UNIQ_KEY of the report: nothing is sent towards 1.0.0.127.
    r = await run_orbit(ns, "message", "get", STOCK_UNIQ_KEY)
    assert r.returncode != 0, r.stdout
    assert "1.0.0.127" not in r.stderr, r.stderr
    assert "--topic" in r.stderr, r.stderr
    # Three lookups without a single connect timeout among them.
    assert time.monotonic() - started < 30


@pytest.mark.asyncio
async def test_the_sdk_view_message_makes_no_connection_to_an_unlisted_address(
    routed: tuple[str, str], listener: socket.socket
) -> None:
    ns, _broker = routed
    forged = offset_id("127.0.0.1", listener.getsockname()[1], 4096)
    async with AdminClient([ns], timeout_ms=2000) as admin:
        with pytest.raises(AdminError) as without_topic:
            await admin.view_message(forged)
        assert accepted(listener) == 0, without_topic.value
        assert "topic" in str(without_topic.value)
        with pytest.raises(AdminError, match=f"no message of {TOPIC}"):
            await admin.view_message(forged, TOPIC)
    assert accepted(listener) == 0


@pytest.mark.asyncio
async def test_a_producers_unique_key_id_is_found_through_the_index(
    routed: tuple[str, str], listener: socket.socket
) -> None:
    ns, broker = routed
    uniq, offset_msg_id = await send(ns, b"found by its unique key")
    assert uniq != offset_msg_id

    r = await run_orbit(ns, "message", "get", uniq, "--topic", TOPIC)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["body"] == "found by its unique key"
    assert shown["properties"]["UNIQ_KEY"] == uniq
    assert shown["msg_id"] == offset_msg_id

    # A stock client's id whose head reads as 1.0.0.127:10911, sent over the wire as such a
    # client would: found in the index, and the address it seems to name is never tried.
    client = RemotingClient()
    try:
        cmd = protocol.send_request(
            group="stock-producer",
            msg=Message(TOPIC, b"from a stock client"),
            queue_id=0,
            unique_id=STOCK_UNIQ_KEY,
            born_timestamp_ms=int(time.time() * 1000),
        )
        resp = await client.invoke(broker, cmd, 5000)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    finally:
        await client.close()
    assert decode_message_id(STOCK_UNIQ_KEY)[:2] == ("1.0.0.127", 10911)
    r = await run_orbit(ns, "message", "get", STOCK_UNIQ_KEY, "--topic", TOPIC, "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["body"] == "from a stock client"
    assert shown["properties"]["UNIQ_KEY"] == STOCK_UNIQ_KEY

    # The SDK's path is the same one; a topic the message is not in does not have it.
    async with AdminClient([ns]) as admin:
        m = await admin.view_message(uniq, TOPIC)
        assert m.body == b"found by its unique key"
        with pytest.raises(AdminError, match=f"no message of {OTHER_TOPIC}"):
            await admin.view_message(uniq, OTHER_TOPIC)
    assert accepted(listener) == 0


@pytest.mark.asyncio
async def test_a_real_offset_id_of_a_listed_broker_still_works(routed: tuple[str, str]) -> None:
    ns, broker = routed
    _uniq, offset_msg_id = await send(ns, b"found by its offset id")
    ip, port, _offset = decode_message_id(offset_msg_id)
    assert f"{ip}:{port}" == broker  # the store host is the address the routes list

    for extra in ((), ("--topic", TOPIC)):
        r = await run_orbit(ns, "message", "get", offset_msg_id, *extra)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["body"] == "found by its offset id"

    # A listed broker's offset id with nothing at that offset: a clear error, no traceback.
    beyond = offset_id(ip, port, 1 << 40)
    r = await run_orbit(ns, "message", "get", beyond)
    assert r.returncode != 0, r.stdout
    assert f"{broker} has no message" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("msg_id", ["not-a-message-id", "0" * 31, "G" * 32, "0" * 40])
def test_an_id_of_neither_format_is_a_clear_error(msg_id: str) -> None:
    with socket.socket() as s:  # no name server is needed to refuse it: nobody listens here
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = orbit(f"127.0.0.1:{port}", "message", "get", msg_id)
    assert r.returncode != 0
    assert "is not a message id" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
