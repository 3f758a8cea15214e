"""``orbit namesrv`` as real processes, spoken to over TCP with RemotingClient: registration,
routes, cluster info, bad input, closed connections, eviction and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import pytest_asyncio

from data_plane.remoting.bodies import loads, topic_config
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

    StartNamesrv = Callable[..., ServerProcess]

pytestmark = pytest.mark.integration

DEADLINE_S = 10.0
MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:20911"


def register_cmd(
    *,
    name: str = "broker-a",
    addr: str = MASTER,
    broker_id: int = 0,
    cluster: str = "DefaultCluster",
    topics: dict[str, int] | None = None,
    version: tuple[int, int] = (1_700_000_000_000, 1),
    without: str | None = None,
    body: bytes | None = None,
) -> RemotingCommand:
    """A REGISTER_BROKER request as a RocketMQ 4.x broker sends it."""
    host, _, port = addr.rpartition(":")
    ext = {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": cluster,
        "haServerAddr": f"{host}:{int(port) + 1}" if port.isdigit() else "127.0.0.1:1",
        "brokerId": str(broker_id),
        "compressed": "false",
    }
    if without is not None:
        del ext[without]
    if body is None:
        table = {t: topic_config(t, n, n) for t, n in (topics if topics is not None else {"TopicTest": 8}).items()}
        wrapper = {"topicConfigTable": table, "dataVersion": {"timestamp": version[0], "counter": version[1]}}
        body = orjson.dumps({"topicConfigSerializeWrapper": wrapper, "filterServerList": []})
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=ext, body=body)


def route_cmd(topic: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})


async def poll(condition: Callable[[], Awaitable[bool]], timeout_s: float = DEADLINE_S) -> bool:
    """True as soon as ``condition()`` holds; False if it still does not at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await condition():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def clients() -> AsyncIterator[Callable[[], RemotingClient]]:
    """``clients()`` → a new RemotingClient (its own connections), closed after the test."""
    made: list[RemotingClient] = []

    def make() -> RemotingClient:
        made.append(RemotingClient())
        return made[-1]

    yield make
    for c in made:
        await c.close()


async def route_code(client: RemotingClient, ns: str, topic: str) -> int:
    return (await client.invoke(ns, route_cmd(topic))).code


# --- registration and lookups -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_registered_broker_serves_its_topic_with_rocketmq_field_names(
    start_namesrv: StartNamesrv, clients: Callable[[], RemotingClient]
) -> None:
    ns = start_namesrv().address
    client = clients()
    r = await client.invoke(ns, register_cmd(topics={"TopicTest": 8}))
    assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
    assert not (r.ext_fields or {}).get("masterAddr")

    slave = await client.invoke(ns, register_cmd(addr=SLAVE, broker_id=1))
    assert slave.code == ResponseCode.SUCCESS
    assert slave.ext_fields is not None
    assert (slave.ext_fields["masterAddr"], slave.ext_fields["haServerAddr"]) == (MASTER, "127.0.0.1:10912")

    r = await client.invoke(ns, route_cmd("TopicTest"))
    assert r.code == ResponseCode.SUCCESS
    raw = r.body_bytes()
    assert b'"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:20911"}' in raw  # fastjson's bare keys
    assert loads(raw) == {
        "brokerDatas": [
            {"brokerAddrs": {"0": MASTER, "1": SLAVE}, "brokerName": "broker-a", "cluster": "DefaultCluster"}
        ],
        "filterServerTable": {},
        "queueDatas": [
            {"brokerName": "broker-a", "perm": 6, "readQueueNums": 8, "topicSynFlag": 0, "writeQueueNums": 8}
        ],
    }


@pytest.mark.asyncio
async def test_an_unknown_topic_is_topic_not_exist(
    namesrv: ServerProcess, clients: Callable[[], RemotingClient]
) -> None:
    r = await clients().invoke(namesrv.address, route_cmd("Nope"))
    assert r.code == 17
    assert r.remark == "No topic route info in name server for the topic: Nope"


@pytest.mark.asyncio
async def test_cluster_info_topic_list_and_topic_deletion(
    namesrv: ServerProcess, clients: Callable[[], RemotingClient]
) -> None:
    ns, client = namesrv.address, clients()
    await client.invoke(ns, register_cmd(topics={"T1": 4, "T2": 2}))
    await client.invoke(ns, register_cmd(name="broker-b", addr="127.0.0.1:30911", cluster="C2", topics={"T1": 4}))

    r = await client.invoke(ns, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert r.code == ResponseCode.SUCCESS
    assert b'"brokerAddrs":{0:"127.0.0.1:30911"}' in r.body_bytes()
    assert loads(r.body_bytes()) == {
        "brokerAddrTable": {
            "broker-a": {"brokerAddrs": {"0": MASTER}, "brokerName": "broker-a", "cluster": "DefaultCluster"},
            "broker-b": {"brokerAddrs": {"0": "127.0.0.1:30911"}, "brokerName": "broker-b", "cluster": "C2"},
        },
        "clusterAddrTable": {"C2": ["broker-b"], "DefaultCluster": ["broker-a"]},
    }

    r = await client.invoke(ns, RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    assert sorted(loads(r.body_bytes())["topicList"]) == ["T1", "T2"]

    r = await client.invoke(ns, RemotingCommand(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields={"topic": "T2"}))
    assert r.code == ResponseCode.SUCCESS
    assert await route_code(client, ns, "T2") == ResponseCode.TOPIC_NOT_EXIST
    assert await route_code(client, ns, "T1") == ResponseCode.SUCCESS

    unregister = {"brokerName": "broker-b", "brokerAddr": "127.0.0.1:30911", "clusterName": "C2", "brokerId": "0"}
    r = await client.invoke(ns, RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields=unregister))
    assert r.code == ResponseCode.SUCCESS
    route = loads((await client.invoke(ns, route_cmd("T1"))).body_bytes())
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a"]


def test_a_multi_tenant_name_server_will_not_start_without_a_way_to_check_credentials(tmp_path: Path) -> None:
    """With --tenancy every request needs a credential (tests/security/test_namesrv_registration.py):
    without the control plane's URL and a state directory it refuses to start, saying why."""
    r = subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "namesrv", "--listen", "127.0.0.1:0", "--tenancy"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert r.returncode == 2
    assert "--tenancy needs --control-plane-url and --state-dir" in r.stderr


@pytest.mark.asyncio
async def test_a_compressed_registration_is_understood(
    namesrv: ServerProcess, clients: Callable[[], RemotingClient]
) -> None:
    version = b'{"counter":1,"timestamp":2}'
    line = b"Zipped 3 3 6 SINGLE_TAG"
    raw = (
        struct.pack(">i", len(version))
        + version
        + struct.pack(">ii", 1, len(line))
        + line
        + struct.pack(">i", 2)
        + b"[]"
    )
    cmd = register_cmd(body=zlib.compress(raw, 9))
    assert cmd.ext_fields is not None
    cmd.ext_fields["compressed"] = "true"
    cmd.ext_fields["bodyCrc32"] = str(zlib.crc32(cmd.body_bytes()) & 0x7FFFFFFF)
    client = clients()
    assert (await client.invoke(namesrv.address, cmd)).code == ResponseCode.SUCCESS
    route = loads((await client.invoke(namesrv.address, route_cmd("Zipped"))).body_bytes())
    assert route["queueDatas"][0]["writeQueueNums"] == 3


@pytest.mark.asyncio
async def test_two_name_servers_keep_independent_state(
    start_namesrv: StartNamesrv, clients: Callable[[], RemotingClient]
) -> None:
    one, two = start_namesrv().address, start_namesrv().address
    assert one != two
    client = clients()
    assert (await client.invoke(one, register_cmd(topics={"OnlyOne": 1}))).code == ResponseCode.SUCCESS
    assert await route_code(client, one, "OnlyOne") == ResponseCode.SUCCESS
    assert await route_code(client, two, "OnlyOne") == ResponseCode.TOPIC_NOT_EXIST


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_bad_requests_get_a_remark_naming_the_problem_and_the_connection_stays(
    namesrv: ServerProcess, clients: Callable[[], RemotingClient]
) -> None:
    ns, client = namesrv.address, clients()
    conn = await client.connection(ns)
    bad: list[tuple[RemotingCommand, str]] = [
        (register_cmd(without="brokerAddr"), "brokerAddr"),
        (register_cmd(without="brokerName"), "brokerName"),
        (register_cmd(without="clusterName"), "clusterName"),
        (register_cmd(without="haServerAddr"), "haServerAddr"),
        (register_cmd(without="brokerId"), "brokerId"),
        (register_cmd(addr="no-port"), "brokerAddr"),
        (register_cmd(body=b"{garbage"), "not JSON"),
        (register_cmd(body=b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":7}}}'), "dataVersion"),
        (RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC), "topic"),
        (RemotingCommand(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields={}), "topic"),
        (RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields={"brokerName": "b"}), "brokerAddr"),
    ]
    for cmd, field in bad:
        r = await client.invoke(ns, cmd)
        assert r.code == ResponseCode.SYSTEM_ERROR, r
        assert field in (r.remark or ""), r
    crc = register_cmd()
    assert crc.ext_fields is not None
    crc.ext_fields["bodyCrc32"] = "12345"
    assert (await client.invoke(ns, crc)).remark == "crc32 not match"
    r = await client.invoke(ns, RemotingCommand(9999))
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

    assert (await client.invoke(ns, register_cmd())).code == ResponseCode.SUCCESS
    assert await route_code(client, ns, "TopicTest") == ResponseCode.SUCCESS
    assert await client.connection(ns) is conn
    assert not conn.closed


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # a length of ~1.2 GB: over the frame limit
        b"\x00\x00\x00\x08\x00\x00\x00\x04{bad",  # a header that is not JSON
        b"\x00\x00\x00\x08\x07\x00\x00\x04abcd",  # an unknown serialization type
        b"\x00\x00\x00\x02ab",  # shorter than its own header-length field
        b"\x00\x00\x10\x00partial",  # a frame cut short, then the socket closes
    ],
)
async def test_garbage_bytes_do_not_kill_the_name_server(
    namesrv: ServerProcess, clients: Callable[[], RemotingClient], garbage: bytes
) -> None:
    host, _, port = namesrv.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(garbage)
    await writer.drain()
    if garbage.endswith(b"partial"):
        writer.close()
    else:
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # the server hung up
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    client = clients()
    assert (await client.invoke(namesrv.address, register_cmd())).code == ResponseCode.SUCCESS
    assert await route_code(client, namesrv.address, "TopicTest") == ResponseCode.SUCCESS
    assert namesrv.proc.poll() is None


# --- brokers going away -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_broker_whose_connection_closes_leaves_the_routes(
    namesrv: ServerProcess, clients: Callable[[], RemotingClient]
) -> None:
    ns = namesrv.address
    broker, reader = clients(), clients()
    await broker.invoke(ns, register_cmd(topics={"Gone": 2}))
    await reader.invoke(ns, register_cmd(name="broker-b", addr="127.0.0.1:30911", topics={"Stays": 2}))
    assert await route_code(reader, ns, "Gone") == ResponseCode.SUCCESS
    await broker.close()

    async def gone() -> bool:
        return await route_code(reader, ns, "Gone") == ResponseCode.TOPIC_NOT_EXIST

    assert await poll(gone)
    assert await route_code(reader, ns, "Stays") == ResponseCode.SUCCESS


@pytest.mark.asyncio
async def test_a_silent_broker_is_evicted_while_a_heartbeating_one_stays(
    start_namesrv: StartNamesrv, clients: Callable[[], RemotingClient]
) -> None:
    ns = start_namesrv("--broker-expiry-s", "1", "--scan-interval-s", "0.2").address
    silent, alive, reader = clients(), clients(), clients()
    await silent.invoke(ns, register_cmd(topics={"Silent": 2}))
    silent_conn = await silent.connection(ns)
    stop = asyncio.Event()

    async def heartbeat() -> None:
        while not stop.is_set():
            r = await alive.invoke(ns, register_cmd(name="broker-b", addr="127.0.0.1:30911", topics={"Alive": 2}))
            assert r.code == ResponseCode.SUCCESS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    beating = asyncio.create_task(heartbeat())
    try:
        started = time.monotonic()

        async def evicted() -> bool:
            return await route_code(reader, ns, "Silent") == ResponseCode.TOPIC_NOT_EXIST

        assert await poll(evicted)
        assert time.monotonic() - started > 0.5  # not at once: only after the expiry
        assert await route_code(reader, ns, "Alive") == ResponseCode.SUCCESS

        async def hung_up() -> bool:
            return silent_conn.closed  # eviction closes the silent broker's connection

        assert await poll(hung_up)
    finally:
        stop.set()
        await beating
    assert await route_code(reader, ns, "Alive") == ResponseCode.SUCCESS


def test_sigterm_stops_the_name_server_with_exit_code_0(start_namesrv: StartNamesrv) -> None:
    ns = start_namesrv()

    async def use() -> Any:
        client = RemotingClient()
        try:
            return (await client.invoke(ns.address, register_cmd())).code
        finally:
            await client.close()

    assert asyncio.run(use()) == ResponseCode.SUCCESS
    assert ns.stop() == 0
    assert "stopping" in ns.log_text()
