"""The HA link of a multi-tenant broker group takes its secret from the control plane
(docs/ha.md, "The HA link"): a slave with authentication on does not link until the reconciler
has sent it the group's secret (HMAC-SHA256 of the master key over the group's name), then
replicates; the secret is kept sealed on the broker, so a slave restarted while the control
plane is down links again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from control_plane.reconcile_source import ha_link_secret
from data_plane.remoting import bodies
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from tests.integration.conftest import ServerProcess
from tests.integration.tenancy_cluster import GROUP, TenancyCluster, tenancy_fixture, until  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def status(cluster: TenancyCluster, addr: str) -> dict[str, str]:
    cmd = RemotingCommand(
        RequestCode.GET_BROKER_RUNTIME_INFO, ext_fields={"Authorization": f"Bearer {cluster.cp.operator_token}"}
    )
    resp = await cluster.wire.invoke(addr, cmd, 5000)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    table = bodies.loads_object(resp.body_bytes()).get("table") or {}
    return {str(k): str(v) for k, v in table.items()}


async def test_a_slave_links_with_the_control_planes_secret(tenancy: TenancyCluster, tmp_path: Path) -> None:
    master = tenancy.broker_addr
    m = await status(tenancy, master)
    assert m["haLinkAuth"] == "control plane"  # the fixture's reconcile round brought it
    slave_store = tmp_path / "stores" / "broker-a-s1"

    async def start_slave() -> ServerProcess:
        flags = tenancy.broker_flags(
            "--role", "SLAVE", "--broker-id", "1", "--set", "ha_listen=127.0.0.1:0",
            "--set", f"ha_master_address={m['haServerAddr']}",
        )  # fmt: skip
        return await asyncio.to_thread(
            tenancy.spawn_broker, tenancy.namesrv.address, *flags, name=GROUP, store_dir=slave_store
        )

    slave = await start_slave()
    s = await status(tenancy, slave.address)
    assert s["haLinkAuth"] == "waiting for the control plane"
    assert s["haConnected"] == "False"
    assert "HA link of group broker-a: no secret yet" in slave.log_text()

    reply = await tenancy.cp.call(
        "PATCH", f"/v1/fleet/broker-groups/{GROUP}", operator=True, json={"broker_addrs": [master, slave.address]}
    )
    assert reply.status == 200, reply.body
    await tenancy.reconciled(rounds=1)

    async def linked() -> bool:
        return (await status(tenancy, slave.address)).get("haConnected") == "True"

    await until(linked, "the slave replicating with the control plane's secret", timeout_s=20)
    assert (await status(tenancy, master))["haSlaves"] == "1"
    secret = ha_link_secret(tenancy.settings.master_key, GROUP)
    sealed = slave_store / "config" / "auth" / "ha-link.bin"
    assert sealed.exists()
    assert secret not in sealed.read_bytes()
    for p in (tenancy.broker, slave):
        assert p is not None
        assert secret.hex() not in p.log_text()

    # The control plane goes away; the slave restarts and links with the secret it kept.
    await tenancy.stop_control_plane()
    await asyncio.to_thread(slave.stop)
    tenancy.wire.close_connection(slave.address)
    slave = await start_slave()
    assert (await status(tenancy, slave.address))["haLinkAuth"] == "control plane"
    await until(linked, "the restarted slave replicating without the control plane", timeout_s=20)
