"""The name server of a multi-tenant cluster, attacked from outside (plain remoting requests to the
real name server process of the tenancy cluster): registrations, unregistrations, route lookups,
cluster info and the control plane's snapshot each need the right credential, and registrations
come only from the hosts the fleet lists. The real broker keeps its routes throughout."""

from __future__ import annotations

import asyncio
import struct

import orjson
import pytest

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes
from sdk.credentials import AccessKeyCredentials
from tests.integration.tenancy_cluster import GROUP, TenancyCluster, Tenant, tenancy_fixture, until  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.asyncio]

FAKE_ADDR = "127.0.0.1:1"  # where a fake broker would have the tenants' clients send


def register(
    topic: str, *, broker_name: str = GROUP, broker_addr: str = FAKE_ADDR, broker_id: int = 0
) -> RemotingCommand:
    body = {
        "topicConfigSerializeWrapper": {
            "topicConfigTable": {
                topic: {"topicName": topic, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "order": False}
            },
            "dataVersion": {"timestamp": 1, "counter": 1},
        },
        "filterServerList": [],
    }
    return RemotingCommand(
        RequestCode.REGISTER_BROKER,
        ext_fields={
            "brokerName": broker_name,
            "brokerAddr": broker_addr,
            "clusterName": "DefaultCluster",
            "haServerAddr": broker_addr,
            "brokerId": str(broker_id),
            "compressed": "false",
        },
        body=bodies.dumps(body),
    )


def unregister(broker_addr: str, broker_id: int = 0) -> RemotingCommand:
    return RemotingCommand(
        RequestCode.UNREGISTER_BROKER,
        ext_fields={
            "brokerName": GROUP,
            "brokerAddr": broker_addr,
            "clusterName": "DefaultCluster",
            "brokerId": str(broker_id),
        },
    )


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})


def signed(cmd: RemotingCommand, access_key: str, secret: str) -> RemotingCommand:
    cmd.ext_fields = {**(cmd.ext_fields or {}), **(AccessKeyCredentials(access_key, secret)(cmd) or {})}
    return cmd


def bearer(cmd: RemotingCommand, token: str) -> RemotingCommand:
    cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {token}"}
    return cmd


async def ask(addr: str, cmd: RemotingCommand) -> RemotingCommand:
    client = RemotingClient()
    try:
        return await client.invoke(addr, cmd, 5000)
    finally:
        await client.close()


async def ask_from(source_host: str, addr: str, cmd: RemotingCommand) -> RemotingCommand:
    """One request over a connection made from ``source_host`` (another loopback address)."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source_host, 0))
    try:
        writer.write(encode_bytes(cmd))
        await writer.drain()
        (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
        return decode_frame(await asyncio.wait_for(reader.readexactly(length), 5))
    finally:
        writer.close()


def broker_credential(tenancy: TenancyCluster) -> tuple[str, str]:
    assert tenancy.broker_credentials_file is not None
    doc = orjson.loads(tenancy.broker_credentials_file.read_bytes())
    return str(doc["access_key"]), str(doc["secret"])


async def routed_addrs(tenancy: TenancyCluster, topic: str) -> set[str]:
    r = await ask(tenancy.namesrv.address, bearer(route_request(topic), tenancy.cp.operator_token))
    assert r.code == ResponseCode.SUCCESS, r.remark
    route = bodies.loads_object(r.body_bytes())
    return {a for bd in route["brokerDatas"] for a in bd["brokerAddrs"].values()}


async def victim(tenancy: TenancyCluster) -> tuple[Tenant, str]:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    assert tenancy.broker is not None
    real = tenancy.broker.address
    assert await routed_addrs(tenancy, "acme%orders") == {real}
    return acme, real


async def test_a_registration_without_a_broker_credential_is_refused_and_routes_stay(
    tenancy: TenancyCluster,
) -> None:
    acme, real = await victim(tenancy)
    ns = tenancy.namesrv.address
    # No credential; a tenant's access key; a tenant's token; under a new broker name and over id 0.
    attempts = [
        register("acme%orders", broker_name="evil"),
        register("acme%orders"),
        signed(register("acme%orders", broker_name="evil"), acme.access_key, acme.secret),
        bearer(register("acme%orders"), acme.token),
        signed(register("acme%orders"), acme.access_key, "not-the-secret"),
    ]
    for cmd in attempts:
        r = await ask(ns, cmd)
        assert r.code == ResponseCode.NO_PERMISSION, (cmd.ext_fields, r.code, r.remark)
    assert await routed_addrs(tenancy, "acme%orders") == {real}


async def test_a_broker_credential_registers_only_groups_and_hosts_the_fleet_lists(tenancy: TenancyCluster) -> None:
    _acme, real = await victim(tenancy)
    ns = tenancy.namesrv.address
    ak, secret = broker_credential(tenancy)
    # A broker group the fleet does not list.
    r = await ask(ns, signed(register("acme%orders", broker_name="evil"), ak, secret))
    assert r.code == ResponseCode.NO_PERMISSION
    assert "not in the fleet" in (r.remark or "")
    # The fleet's group, but an address on a host it does not list.
    r = await ask(ns, signed(register("acme%orders", broker_addr="10.9.9.9:10911", broker_id=1), ak, secret))
    assert r.code == ResponseCode.NO_PERMISSION
    assert "10.9.9.9" in (r.remark or "")
    # The fleet's group and address, sent from a host the fleet does not list (127.0.0.2).
    r = await ask_from("127.0.0.2", ns, signed(register("acme%orders", broker_addr=real, broker_id=1), ak, secret))
    assert r.code == ResponseCode.NO_PERMISSION
    assert "host 127.0.0.2" in (r.remark or "")
    assert await routed_addrs(tenancy, "acme%orders") == {real}


async def test_an_unregistration_needs_a_broker_or_operator_credential(tenancy: TenancyCluster) -> None:
    acme, real = await victim(tenancy)
    ns = tenancy.namesrv.address
    for cmd in (
        unregister(real),
        signed(unregister(real), acme.access_key, acme.secret),
        bearer(unregister(real), acme.token),
    ):
        r = await ask(ns, cmd)
        assert r.code == ResponseCode.NO_PERMISSION, r.remark
    await asyncio.sleep(0)  # (the refusals are answered; nothing was removed)
    assert await routed_addrs(tenancy, "acme%orders") == {real}


async def test_route_lookups_need_a_credential_of_the_topics_tenant(tenancy: TenancyCluster) -> None:
    acme, real = await victim(tenancy)
    beta = await tenancy.new_tenant("beta")
    ns = tenancy.namesrv.address
    r = await ask(ns, route_request("acme%orders"))
    assert r.code == ResponseCode.NO_PERMISSION
    assert "no credentials" in (r.remark or "")
    for cmd in (
        bearer(route_request("acme%orders"), beta.token),
        signed(route_request("acme%orders"), beta.access_key, beta.secret),
    ):
        r = await ask(ns, cmd)
        assert r.code == ResponseCode.NO_PERMISSION, r.remark
        assert r.body_bytes() == b""
    for cmd in (
        bearer(route_request("acme%orders"), acme.token),
        signed(route_request("acme%orders"), acme.access_key, acme.secret),
    ):
        r = await ask(ns, cmd)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert real in r.body_bytes().decode()


async def test_cluster_info_the_topic_list_and_the_snapshot_are_operators_only(tenancy: TenancyCluster) -> None:
    acme, real = await victim(tenancy)
    ns = tenancy.namesrv.address
    for code in (RequestCode.GET_BROKER_CLUSTER_INFO, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER):
        for cmd in (RemotingCommand(code), bearer(RemotingCommand(code), acme.token)):
            r = await ask(ns, cmd)
            assert r.code == ResponseCode.NO_PERMISSION, (code, r.remark)
        r = await ask(ns, bearer(RemotingCommand(code), tenancy.cp.operator_token))
        assert r.code == ResponseCode.SUCCESS, (code, r.remark)
    info = await ask(ns, bearer(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), tenancy.cp.operator_token))
    assert real in info.body_bytes().decode()
    # A snapshot listing the attacker's host and credential, sent by a tenant or a broker: refused.
    forged = {"version": 2**62, "credentials": [], "fleet": {"evil": ["127.0.0.1:1"]}}
    ak, secret = broker_credential(tenancy)
    for cmd in (
        RemotingCommand(RequestCode.ORBIT_SYNC_TENANCY, body=orjson.dumps(forged)),
        bearer(RemotingCommand(RequestCode.ORBIT_SYNC_TENANCY, body=orjson.dumps(forged)), acme.token),
        signed(RemotingCommand(RequestCode.ORBIT_SYNC_TENANCY, body=orjson.dumps(forged)), ak, secret),
    ):
        r = await ask(ns, cmd)
        assert r.code == ResponseCode.NO_PERMISSION, r.remark
    r = await ask(ns, signed(register("acme%orders", broker_name="evil"), ak, secret))
    assert r.code == ResponseCode.NO_PERMISSION  # the forged fleet was not taken
    assert await routed_addrs(tenancy, "acme%orders") == {real}
    # Nor does a broker take a snapshot (access keys, the HA link's secret) from a broker credential.
    forged_broker = {"version": 2**62, "credentials": [], "tenants": [], "topic_retention_hours": {}}
    cmd = signed(RemotingCommand(RequestCode.ORBIT_SYNC_TENANCY, body=orjson.dumps(forged_broker)), ak, secret)
    r = await tenancy.invoke(cmd)
    assert r.code == ResponseCode.NO_PERMISSION, r.remark
    assert "operators only" in (r.remark or "")
    await tenancy.reconciled(rounds=1)  # the control plane's own snapshots still apply


async def test_a_credential_bound_to_a_host_registers_only_its_group_from_its_host(tenancy: TenancyCluster) -> None:
    """Per-host broker credentials: the fleet would let 127.0.0.1 register either group, but a
    credential bound to broker-a's host 127.0.0.2 registers neither from 127.0.0.1, nor broker-b."""
    _acme, real = await victim(tenancy)
    ns = tenancy.namesrv.address
    cp = tenancy.cp
    other = await cp.call(
        "POST", "/v1/fleet/broker-groups", operator=True,
        json={"name": "broker-b", "namesrv_addrs": [ns], "broker_addrs": ["127.0.0.1:1"], "max_queues": 10,
              "max_msgs_per_s": 1000, "storage_bytes": 1 << 30},
    )  # fmt: skip
    assert other.status == 201, other.body
    patched = await cp.call(
        "PATCH", f"/v1/fleet/broker-groups/{GROUP}", operator=True, json={"broker_addrs": [real, "127.0.0.2:1"]}
    )
    assert patched.status == 200, patched.body
    made = await cp.call("POST", f"/v1/fleet/broker-groups/{GROUP}/hosts/127.0.0.2/credential", operator=True)
    assert made.status == 201, made.body
    ak, secret = made.body["access_key"], made.body["secret"]
    # Two rounds after the credential was issued, the name server has it and its binding (the
    # groups' fake brokers do not answer, so the groups' own rounds report errors).
    rec = tenancy.reconciler
    start = rec.rounds

    def synced() -> bool:
        rec.kick()
        return rec.rounds >= start + 2 and not rec.namesrv_errors

    await until(synced, "two reconcile rounds reaching the name server")
    # From 127.0.0.1, a host the fleet lists for both groups: refused, it is not the credential's host.
    r = await ask(ns, signed(register("acme%orders", broker_addr="127.0.0.1:2", broker_id=2), ak, secret))
    assert r.code == ResponseCode.NO_PERMISSION
    assert "bound to another host" in (r.remark or "")
    # From its own host, for another group: refused.
    r = await ask_from("127.0.0.2", ns, signed(register("acme%orders", broker_name="broker-b"), ak, secret))
    assert r.code == ResponseCode.NO_PERMISSION
    assert "bound to broker group" in (r.remark or "")
    # From its own host, for its group: taken.
    r = await ask_from(
        "127.0.0.2", ns, signed(register("acme%orders", broker_addr="127.0.0.2:1", broker_id=3), ak, secret)
    )
    assert r.code == ResponseCode.SUCCESS, r.remark  # (its route goes with its connection, closed here)
