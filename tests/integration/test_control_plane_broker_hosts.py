"""Broker credentials per host: operators issue one per host of a broker group's broker_addrs
(the secret shown once), issuing again rotates (the previous one revoked, as desired state shows
brokers and name servers), a host leaving broker_addrs has its credential revoked, and only
operators reach these endpoints."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
G = "/v1/fleet/broker-groups/broker-a"
ADDRS = ["10.0.0.1:10911", "10.0.0.1:10921", "[fd00::2]:10911"]


async def new_group(cp: ControlPlaneHarness, broker_addrs: list[str]) -> None:
    body = {
        "name": "broker-a",
        "namesrv_addrs": ["10.0.0.9:9876"],
        "broker_addrs": broker_addrs,
        "max_queues": 100,
        "max_msgs_per_s": 1000,
        "storage_bytes": 1 << 30,
    }
    reply = await cp.call("POST", "/v1/fleet/broker-groups", operator=True, json=body)
    assert reply.status == 201, reply.body


async def snapshot_credentials(cp: ControlPlaneHarness) -> dict[str, dict[str, Any]]:
    """The credentials the reconciler sends the group's brokers and name servers, by access key."""
    state = await cp.services.desired_state("broker-a")
    return {c["access_key"]: dict(c) for c in state["credentials"]}


async def hosts(cp: ControlPlaneHarness) -> dict[str, dict[str, Any]]:
    reply = await cp.call("GET", G + "/hosts", operator=True)
    assert reply.status == 200, reply.body
    return {h["host"]: h for h in reply.body["hosts"]}


async def test_an_operator_issues_a_credential_for_a_listed_host(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cp = control_plane
    await new_group(cp, ADDRS)
    before = await hosts(cp)
    assert list(before) == ["10.0.0.1", "fd00::2"]
    assert before["10.0.0.1"] == {
        "host": "10.0.0.1",
        "broker_addrs": ["10.0.0.1:10911", "10.0.0.1:10921"],
        "access_key": None,
        "status": "none",
        "created_at": None,
        "revoked_at": None,
    }

    made = await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)
    assert made.status == 201, made.body
    assert made.headers["Cache-Control"] == "no-store"
    access_key, secret = made.body["access_key"], made.body["secret"]
    assert (made.body["broker_group"], made.body["host"], made.body["role"]) == ("broker-a", "10.0.0.1", "broker")
    assert made.body["tenant_id"] is None
    assert made.body["status"] == "active"
    assert made.body["replaced"] is None
    assert made.body["description"] == "broker host broker-a/10.0.0.1"
    token = await cp.token_for(access_key, secret)
    usage = await cp.call("POST", "/internal/v1/usage", token=token, json={"records": []})
    assert usage.status == 200, usage.body
    v6 = await cp.call("POST", G + "/hosts/fd00::2/credential", operator=True)
    assert v6.status == 201, v6.body
    assert v6.body["host"] == "fd00::2"

    listed = await cp.call("GET", G + "/hosts", operator=True)
    assert secret not in str(listed.body)
    assert v6.body["secret"] not in str(listed.body)
    after = {h["host"]: h for h in listed.body["hosts"]}
    assert after["10.0.0.1"]["access_key"] == access_key
    assert after["10.0.0.1"]["status"] == "active"
    assert after["10.0.0.1"]["created_at"] == made.body["created_at"]
    assert after["fd00::2"]["access_key"] == v6.body["access_key"]
    assert all("secret" not in h for h in listed.body["hosts"])
    admin_list = await cp.call("GET", "/v1/admin/credentials", operator=True)
    assert access_key in {c["access_key"] for c in admin_list.body["credentials"]}
    assert secret not in str(admin_list.body)

    sent = (await snapshot_credentials(cp))[access_key]
    assert (sent["role"], sent["tenant"], sent["status"], sent["secret"]) == ("broker", "*", "active", secret)
    logged = caplog.text
    for sensitive in (secret, v6.body["secret"], token):
        assert sensitive not in logged
    assert access_key in logged  # access keys are identifiers and may be logged


async def test_a_host_not_in_broker_addrs_is_refused(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    await new_group(cp, ADDRS)
    count = await cp.services.pool.fetchval("SELECT count(*) FROM credentials")
    unlisted = await cp.call("POST", G + "/hosts/10.0.0.3/credential", operator=True)
    assert unlisted.status == 404
    assert unlisted.body["error"]["code"] == "broker_host_not_found"
    assert "'10.0.0.3' is not a host of broker group 'broker-a'" in unlisted.body["error"]["message"]
    assert unlisted.body["error"]["details"] == {
        "broker_group": "broker-a",
        "host": "10.0.0.3",
        "hosts": ["10.0.0.1", "fd00::2"],
    }
    port_too = await cp.call("POST", G + "/hosts/10.0.0.1:10911/credential", operator=True)
    assert port_too.body["error"]["code"] == "broker_host_not_found"  # a host, not an address
    nowhere = await cp.call("POST", "/v1/fleet/broker-groups/broker-z/hosts/10.0.0.1/credential", operator=True)
    assert nowhere.status == 404
    assert nowhere.body["error"]["code"] == "broker_group_not_found"
    assert (await cp.call("GET", "/v1/fleet/broker-groups/broker-z/hosts", operator=True)).status == 404
    bad = await cp.call("POST", G + "/hosts/x';drop/credential", operator=True)
    assert bad.status == 400
    assert bad.body["error"]["details"]["field"] == "host"
    never = await cp.call("DELETE", G + "/hosts/10.0.0.1/credential", operator=True)
    assert never.status == 404
    assert never.body["error"]["code"] == "credential_not_found"
    assert await cp.services.pool.fetchval("SELECT count(*) FROM credentials") == count


async def test_issuing_again_rotates_and_revoking_reaches_the_snapshot(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    await new_group(cp, ADDRS)
    first = (await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)).body
    first_token = await cp.token_for(first["access_key"], first["secret"])

    second = await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)
    assert second.status == 201
    assert second.body["replaced"] == first["access_key"]
    assert second.body["access_key"] != first["access_key"]
    refused = await cp.token_request(first["access_key"], first["secret"])
    assert refused.status == 401
    assert refused.body["error"] == "invalid_client"
    stale = await cp.call("POST", "/internal/v1/usage", token=first_token, json={"records": []})
    assert stale.status == 401
    await cp.token_for(second.body["access_key"], second.body["secret"])
    sent = await snapshot_credentials(cp)
    assert (sent[first["access_key"]]["status"], sent[first["access_key"]]["secret"]) == ("revoked", "")
    assert sent[second.body["access_key"]]["status"] == "active"
    assert (await hosts(cp))["10.0.0.1"]["access_key"] == second.body["access_key"]

    revoked = await cp.call("DELETE", G + "/hosts/10.0.0.1/credential", operator=True)
    assert revoked.status == 200
    assert revoked.body["access_key"] == second.body["access_key"]
    assert revoked.body["status"] == "revoked"
    assert "secret" not in revoked.body
    listed = (await hosts(cp))["10.0.0.1"]
    assert (listed["access_key"], listed["status"]) == (second.body["access_key"], "revoked")
    assert listed["revoked_at"] is not None
    assert (await snapshot_credentials(cp))[second.body["access_key"]]["status"] == "revoked"
    assert (await cp.token_request(second.body["access_key"], second.body["secret"])).status == 401
    again = await cp.call("DELETE", G + "/hosts/10.0.0.1/credential", operator=True)
    assert again.status == 200
    assert again.body["revoked_at"] == revoked.body["revoked_at"]
    active = await cp.services.pool.fetchval(
        "SELECT count(*) FROM credentials WHERE role = 'broker' AND status = 'active'"
    )
    assert active == 0


async def test_a_host_leaving_broker_addrs_has_its_credential_revoked(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    await new_group(cp, ADDRS)
    leaving = (await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)).body
    staying = (await cp.call("POST", G + "/hosts/fd00::2/credential", operator=True)).body

    capacity = await cp.call("PATCH", G, operator=True, json={"max_queues": 50})
    assert capacity.status == 200
    assert {k: v["status"] for k, v in (await hosts(cp)).items()} == {"10.0.0.1": "active", "fd00::2": "active"}

    moved = await cp.call("PATCH", G, operator=True, json={"broker_addrs": ["[fd00::2]:10911", "10.0.0.4:10911"]})
    assert moved.status == 200, moved.body
    sent = await snapshot_credentials(cp)
    assert sent[leaving["access_key"]]["status"] == "revoked"
    assert sent[staying["access_key"]]["status"] == "active"
    assert (await cp.token_request(leaving["access_key"], leaving["secret"])).status == 401
    await cp.token_for(staying["access_key"], staying["secret"])
    assert list(await hosts(cp)) == ["fd00::2", "10.0.0.4"]
    gone = await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)
    assert gone.status == 404
    assert gone.body["error"]["code"] == "broker_host_not_found"
    bound = await cp.services.pool.fetch("SELECT host FROM broker_host_credentials WHERE broker_group = 'broker-a'")
    assert [r["host"] for r in bound] == ["fd00::2"]

    back = await cp.call("PATCH", G, operator=True, json={"broker_addrs": ADDRS})
    assert back.status == 200
    assert (await hosts(cp))["10.0.0.1"]["status"] == "none"  # a host coming back needs a new credential


async def test_deleting_a_group_revokes_its_hosts_and_waits_for_its_topics(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cp = control_plane
    await new_group(cp, ADDRS)
    first = (await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)).body
    second = (await cp.call("POST", G + "/hosts/fd00::2/credential", operator=True)).body
    _, tenant = await cp.new_tenant("acme")
    made = await cp.call("POST", "/v1/tenants/acme/topics", token=tenant, json={"name": "orders"})
    assert made.status == 201, made.body

    busy = await cp.call("DELETE", G, operator=True)
    assert busy.status == 409, busy.body
    assert busy.body["error"]["code"] == "broker_group_in_use"
    assert busy.body["error"]["details"]["placed_queues"] >= 1
    assert {h["status"] for h in (await hosts(cp)).values()} == {"active"}  # nothing changed
    await cp.token_for(first["access_key"], first["secret"])

    assert (await cp.call("DELETE", "/v1/tenants/acme/topics/orders", token=tenant)).status == 204
    for token in (tenant, await cp.token_for(second["access_key"], second["secret"])):
        assert (await cp.call("DELETE", G, token=token)).status == 403  # operators only
    deleted = await cp.call("DELETE", G, operator=True)
    assert deleted.status == 200, deleted.body
    assert sorted(deleted.body["revoked_access_keys"]) == sorted([first["access_key"], second["access_key"]])
    for cred in (first, second):
        assert (await cp.token_request(cred["access_key"], cred["secret"])).status == 401
    assert (await cp.call("GET", G, operator=True)).status == 404
    again = await cp.call("DELETE", G, operator=True)
    assert again.status == 404
    assert again.body["error"]["code"] == "broker_group_not_found"
    left = await cp.services.pool.fetchval(
        "SELECT (SELECT count(*) FROM broker_hosts WHERE broker_group = 'broker-a')"
        " + (SELECT count(*) FROM broker_host_credentials WHERE broker_group = 'broker-a')"
    )
    assert left == 0
    for cred in (first, second):
        assert cred["secret"] not in caplog.text
    await new_group(cp, ADDRS)  # the name can be used again, its hosts with no credential
    assert {h["status"] for h in (await hosts(cp)).values()} == {"none"}


async def test_only_operators_reach_broker_host_credentials(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    await new_group(cp, ADDRS)
    _, tenant_admin = await cp.new_tenant("acme")
    issued = (await cp.call("POST", G + "/hosts/10.0.0.1/credential", operator=True)).body
    broker = await cp.token_for(issued["access_key"], issued["secret"])
    for token in (tenant_admin, broker):
        for method, path in (
            ("GET", G + "/hosts"),
            ("POST", G + "/hosts/10.0.0.1/credential"),
            ("DELETE", G + "/hosts/10.0.0.1/credential"),
        ):
            reply = await cp.call(method, path, token=token)
            assert reply.status == 403, (method, path, reply.body)
            assert reply.body["error"]["code"] == "forbidden"
    assert (await cp.call("GET", G + "/hosts")).status == 401
    assert (await hosts(cp))["10.0.0.1"]["access_key"] == issued["access_key"]
    assert (await hosts(cp))["10.0.0.1"]["status"] == "active"


async def test_the_openapi_document_describes_host_credentials(control_plane: ControlPlaneHarness) -> None:
    doc = (await control_plane.call("GET", "/openapi.json")).body
    path = doc["paths"]["/v1/fleet/broker-groups/{group}/hosts/{host}/credential"]
    assert set(path) == {"post", "delete"}
    assert path["post"]["x-orbit-role"] == "operator"
    assert {"201", "404"} <= set(path["post"]["responses"])
    assert "get" in doc["paths"]["/v1/fleet/broker-groups/{group}/hosts"]
    codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert "broker_host_not_found" in codes
