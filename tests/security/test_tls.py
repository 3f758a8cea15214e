"""TLS on the remoting listeners, from outside: real name server and broker processes with a
local CA's certificate (data_plane/tls.py), in enforcing and permissive mode, and ``orbit dev up
--tls`` with tenancy, where the CLI connects over TLS, verifying, and a plain client still works
on the permissive ports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, encode_bytes
from data_plane.remoting.errors import RemotingError
from data_plane.tls import CA_FILE, CERT_FILE, KEY_FILE, client_context, make_local_ca
from sdk import Message, Producer
from sdk.admin import AdminClient
from tests.integration.helpers import orbit, start_dev_up

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

DEADLINE_S = 120.0
STOCK_SCRIPT = Path(__file__).resolve().parents[1] / "integration" / "thirdparty_client_script.py"


@pytest.fixture
def ca(tmp_path: Path) -> dict[str, str]:
    return make_local_ca(str(tmp_path / "tls"))


def tls_flags(mode: str, files: dict[str, str]) -> list[str]:
    return ["--tls-mode", mode, "--tls-cert", files[CERT_FILE], "--tls-key", files[KEY_FILE]]


def broker_tls(mode: str, files: dict[str, str]) -> list[str]:
    return [
        *("--set", f"tls_mode={mode}", "--set", f"tls_cert_file={files[CERT_FILE]}"),
        *("--set", f"tls_key_file={files[KEY_FILE]}", "--set", f"tls_ca_file={files[CA_FILE]}"),
    ]


async def cluster_info(addr: str, ctx: ssl.SSLContext | None) -> RemotingCommand:
    client = RemotingClient(ssl_context=ctx)
    try:
        return await client.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), 5000)
    finally:
        await client.close()


def plain_request_is_dropped(addr: str) -> bool:
    """A plain frame sent to a TLS-only port: the server answers no frame and closes."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(encode_bytes(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO)))
        s.settimeout(10)
        try:
            got = s.recv(4096)
        except (ConnectionResetError, TimeoutError):
            return True
        return got == b"" or not got.startswith(b"\x00")  # closed, or a TLS alert record


@pytest.mark.asyncio
async def test_enforcing_serves_tls_only_and_clients_verify_the_certificate(
    ca: dict[str, str], tmp_path: Path, start_namesrv: Callable[..., ServerProcess]
) -> None:
    ns = start_namesrv(*tls_flags("enforcing", ca)).address
    good = await cluster_info(ns, client_context(ca_file=ca[CA_FILE]))
    assert good.code == ResponseCode.SUCCESS
    assert await asyncio.to_thread(plain_request_is_dropped, ns)
    with pytest.raises(RemotingError):  # a plain client gets no answer
        await cluster_info(ns, None)
    other = make_local_ca(str(tmp_path / "other-ca"))
    with pytest.raises(RemotingError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await cluster_info(ns, client_context(ca_file=other[CA_FILE]))  # verified by default: refused


@pytest.mark.asyncio
async def test_permissive_serves_tls_and_plain_on_one_port_and_the_sdk_sends_over_tls(
    ca: dict[str, str],
    start_namesrv: Callable[..., ServerProcess],
    start_broker: Callable[..., ServerProcess],
) -> None:
    ns = start_namesrv(*tls_flags("permissive", ca)).address
    start_broker(ns, *broker_tls("permissive", ca), "--set", "auto_create_topic_enable=true")
    assert (await cluster_info(ns, client_context(ca_file=ca[CA_FILE]))).code == ResponseCode.SUCCESS
    assert (await cluster_info(ns, None)).code == ResponseCode.SUCCESS
    for ctx in (client_context(ca_file=ca[CA_FILE]), None):
        async with Producer("tls-producer", namesrv_addrs=ns, tls=ctx) as producer:
            result = await producer.send(Message("TlsTopic", b"over tls" if ctx else b"plain"))
            assert result.status.name == "SEND_OK"
            instance = producer._instance
            assert instance is not None
            transport = instance.remoting._conns[ns].transport
            assert transport is not None
            assert (transport.get_extra_info("ssl_object") is not None) == (ctx is not None)


def test_dev_up_tls_serves_the_cli_over_verified_tls_and_plain_clients_beside_it(tmp_path: Path) -> None:
    ready = tmp_path / "dev.ready"
    proc, info = start_dev_up(
        tmp_path / "data", ready, "--control-plane-port", "0", "--single-broker", "--tls", timeout_s=DEADLINE_S
    )
    try:
        assert info["control_plane"].startswith("https://")
        ca_file = info["tls_ca_file"]
        demo = info["demo"]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "SSL_CERT"))}
        base.update(ORBIT_NAMESRV=info["namesrv"], ORBIT_CREDENTIALS_FILE=demo["credentials_file"])
        sent = orbit(dict(base, ORBIT_TLS_CA=ca_file), "produce", "--topic", demo["topic"], "--body", "tls", "--json")
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["status"] == "SEND_OK"
        plain = orbit(base, "produce", "--topic", demo["topic"], "--body", "plain", "--json")
        assert plain.returncode == 0, plain.stderr
        # A client that trusts only the system's store refuses the local CA's certificate.
        untrusting = orbit(dict(base, ORBIT_TLS="1"), "produce", "--topic", demo["topic"], "--body", "x")
        assert untrusting.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting.stderr or "certificate verify failed" in untrusting.stderr
        got = orbit(
            dict(base, ORBIT_TLS_CA=ca_file), "consume", "--topic", demo["topic"], "--group", demo["group"],
            "--earliest", "--max", "2", "--json",
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert sorted(json.loads(line)["body"] for line in got.stdout.splitlines()) == ["plain", "tls"]
        if sys.platform == "linux" and platform.machine() == "x86_64":  # the stock client's librocketmq.so
            creds = json.loads(Path(demo["credentials_file"]).read_text())
            stock = subprocess.run(
                [
                    sys.executable, str(STOCK_SCRIPT), "produce", info["namesrv"], demo["topic"], "demo%stock",
                    "--log-dir", str(tmp_path / "clientlogs"),
                    f"--access-key={creds['access_key']}", f"--secret-key={creds['secret']}",
                ],
                input=json.dumps([{"body": "stock", "tags": "t", "keys": "k", "props": {}}]),
                capture_output=True, text=True, timeout=60, check=False,
                env={k: v for k, v in base.items() if k != "PYTHONPATH"} | {"HOME": str(tmp_path / "home")},
            )  # fmt: skip
            assert stock.returncode == 0, stock.stderr[-3000:]
            assert [r["status"] for r in json.loads(stock.stdout.strip().splitlines()[-1])["results"]] == [0]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


@pytest.mark.asyncio
async def test_the_ha_link_runs_over_tls_and_a_plain_peer_gets_nothing(
    ca: dict[str, str],
    tmp_path: Path,
    start_namesrv: Callable[..., ServerProcess],
    start_broker: Callable[..., ServerProcess],
) -> None:
    """With tls_mode on, a group's HA port serves TLS only with the broker's certificate and the
    slave verifies it (tls_ca_file): the log replicates (a SYNC_MASTER answers SEND_OK), while a
    plain peer's handshake frame is answered with nothing of the log."""
    secret_file = tmp_path / "ha.secret"
    secret_file.write_text("a-shared-secret-of-the-group-0123456789\n")
    secret_file.chmod(0o600)
    ns = start_namesrv(*tls_flags("enforcing", ca)).address
    common = [*broker_tls("enforcing", ca), "--set", "ha_listen=127.0.0.1:0", "--set", f"ha_secret_file={secret_file}"]
    master = start_broker(ns, "--role", "SYNC_MASTER", *common)
    start_broker(ns, "--role", "SLAVE", "--broker-id", "1", *common, store_dir=tmp_path / "stores" / "slave")
    ctx = client_context(ca_file=ca[CA_FILE])
    admin = AdminClient(ns, tls=ctx)
    try:
        ha_host, _, ha_port = (await admin.broker_status(master.address))["haServerAddr"].rpartition(":")
        async with Producer("ha-tls", namesrv_addrs=ns, tls=ctx, send_timeout_ms=10_000) as producer:
            await producer.create_topic("HaTls", queue_nums=1)
            deadline = time.monotonic() + 30
            while True:  # until the slave has linked (over TLS) and acknowledges
                status = (await producer.send(Message("HaTls", b"replicated"))).status
                if status.name == "SEND_OK":
                    break
                assert time.monotonic() < deadline, status
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
    reader, writer = await asyncio.open_connection(ha_host, int(ha_port))
    try:
        writer.write(struct.pack(">IIqI", 0x4F524841, 2, 0, 0))  # an Orbit HA handshake, in the clear
        got = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(5):
                while chunk := await reader.read(65536):
                    got += chunk
        assert b"replicated" not in got
        assert not got.startswith(b"ORH")  # no challenge in the clear: at most a TLS alert
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_the_grpc_endpoint_serves_tls_with_the_brokers_certificate(
    ca: dict[str, str], tmp_path: Path, start_broker: Callable[..., ServerProcess]
) -> None:
    """With tls_mode on, a broker's RocketMQ 5 endpoint serves TLS only: a client that trusts the
    local CA (as the v5 clients do with GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) gets answers; a plain
    client and one trusting another CA get none."""
    import grpc

    from data_plane.proxy.v2 import definition_pb2 as pb
    from data_plane.proxy.v2 import service_pb2 as rpc
    from data_plane.proxy.v2 import service_pb2_grpc

    broker = start_broker(None, *broker_tls("enforcing", ca), "--set", "grpc_listen=127.0.0.1:0")
    endpoint = broker.info["grpc_address"]
    request = rpc.QueryRouteRequest(topic=pb.Resource(name="TBW102"))

    async def route(channel: grpc.aio.Channel) -> int:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        r: rpc.QueryRouteResponse = await stub.QueryRoute(request, timeout=5)
        return r.status.code

    trusted = grpc.ssl_channel_credentials(await asyncio.to_thread(Path(ca[CA_FILE]).read_bytes))
    options = (("grpc.ssl_target_name_override", "localhost"),)
    async with grpc.aio.secure_channel(endpoint, trusted, options=options) as channel:
        assert await route(channel) in (pb.OK, pb.TOPIC_NOT_FOUND)  # answered, over TLS
    async with grpc.aio.insecure_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await route(channel)
    other = make_local_ca(str(tmp_path / "other-ca"))
    untrusted = grpc.ssl_channel_credentials(await asyncio.to_thread(Path(other[CA_FILE]).read_bytes))
    async with grpc.aio.secure_channel(endpoint, untrusted, options=options) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await route(channel)
