"""The failover leases over HTTP against a real PostgreSQL: the configured master takes the
first epoch, renews it, and after its lease runs out the most caught-up live member becomes
master under the next epoch; everyone else is told whom to follow; bad heartbeats are refused;
operators see it all in the fleet view."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.postgres_fixture import (  # noqa: F401  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LEASE_S = 1.0


async def broker_token(cp: ControlPlaneHarness) -> str:
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    assert made.status == 201, made.body
    return await cp.token_for(made.body["access_key"], made.body["secret"])


async def beat(cp: ControlPlaneHarness, token: str, member: int, max_offset: int, **extra: Any) -> dict[str, Any]:
    body = {
        "cluster": "c1", "broker_name": "broker-x", "member_id": member, "addr": f"127.0.0.1:{10911 + 10 * member}",
        "ha_addr": f"127.0.0.1:{10912 + 10 * member}", "max_offset": max_offset, "epoch": extra.pop("epoch", 0),
        "acting_master": False, "lease_s": LEASE_S, **extra,
    }  # fmt: skip
    reply = await cp.call("POST", "/internal/v1/ha/heartbeat", token=token, json=body)
    assert reply.status == 200, reply.body
    return dict(reply.body)


async def test_election_renewal_and_failover(control_plane: ControlPlaneHarness) -> None:
    token = await broker_token(control_plane)
    # A slave heard first does not take a new group: it waits for the configured master.
    first = await beat(control_plane, token, 1, 0)
    assert (first["role"], first["master_addr"]) == ("SLAVE", "")
    m = await beat(control_plane, token, 0, 0, master_role="SYNC_MASTER")
    assert (m["role"], m["epoch"], m["master_role"]) == ("MASTER", 1, "SYNC_MASTER")
    s = await beat(control_plane, token, 1, 100)
    assert (s["role"], s["epoch"], s["master_addr"], s["master_ha_addr"]) == (
        "SLAVE",
        1,
        "127.0.0.1:10911",
        "127.0.0.1:10912",
    )
    # Renewals keep the master; a slave that is further ahead does not steal it. (The master
    # renews for longer than the test's short lease here, so a stall of the host cannot end it.)
    for _ in range(3):
        renewed = await beat(control_plane, token, 0, 500, epoch=1, master_role="SYNC_MASTER", lease_s=60)
        assert renewed["role"] == "MASTER"
        assert (await beat(control_plane, token, 1, 100))["role"] == "SLAVE"
        assert (await beat(control_plane, token, 2, 900))["role"] == "SLAVE"
        await asyncio.sleep(LEASE_S / 3)
    # Its last renewal is for LEASE_S; then the master goes quiet and the slaves go on (member 2
    # now behind member 1). Once the lease has run out, the live member furthest ahead (1) wins
    # the next epoch, never member 2.
    assert (await beat(control_plane, token, 0, 500, epoch=1, master_role="SYNC_MASTER"))["role"] == "MASTER"
    winner = None
    for _ in range(20):
        one = await beat(control_plane, token, 1, 100)
        if one["role"] == "MASTER":
            winner = one
            break
        assert one["master_addr"] in ("127.0.0.1:10911", "")
        two = await beat(control_plane, token, 2, 90)
        assert two["role"] == "SLAVE"
        await asyncio.sleep(LEASE_S / 4)
    assert winner is not None
    assert winner["epoch"] == 2
    two = await beat(control_plane, token, 2, 90)
    assert (two["role"], two["epoch"], two["master_addr"]) == ("SLAVE", 2, "127.0.0.1:10921")
    # The old master comes back: told to follow the new one under the new epoch.
    old = await beat(control_plane, token, 0, 500, epoch=1, master_role="SYNC_MASTER")
    assert (old["role"], old["epoch"], old["master_addr"]) == ("SLAVE", 2, "127.0.0.1:10921")
    view = await control_plane.call("GET", "/v1/fleet/ha", operator=True)
    assert view.status == 200
    (group,) = [g for g in view.body["broker_groups"] if g["broker_name"] == "broker-x"]
    assert (group["epoch"], group["master_id"]) == (2, 1)
    assert {m["member_id"] for m in group["members"]} == {0, 1, 2}


async def test_bad_heartbeats_are_refused(control_plane: ControlPlaneHarness) -> None:
    token = await broker_token(control_plane)
    base = {"cluster": "c1", "broker_name": "broker-y", "member_id": 0, "addr": "127.0.0.1:1", "max_offset": 0,
            "epoch": 0, "lease_s": 5}  # fmt: skip
    for change, field in (
        ({"member_id": 100}, "member_id"),
        ({"addr": "no-port"}, "addr"),
        ({"lease_s": 0}, "lease_s"),
        ({"master_role": "SLAVE"}, "master_role"),
        ({"surprise": 1}, "surprise"),
    ):
        reply = await control_plane.call("POST", "/internal/v1/ha/heartbeat", token=token, json={**base, **change})
        assert reply.status == 400, (change, reply.body)
        assert field in str(reply.body), reply.body
    _tenant, tenant_token = await control_plane.new_tenant("ha-tenant")
    reply = await control_plane.call("POST", "/internal/v1/ha/heartbeat", token=tenant_token, json=base)
    assert reply.status == 403
    reply = await control_plane.call("GET", "/v1/fleet/ha", token=token)
    assert reply.status == 403
