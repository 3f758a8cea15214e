"""Operators: tenants (create, suspend, resume, delete), plans, quota overrides, the fleet."""

from __future__ import annotations

import pytest

from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
# A plan's limits that PUT /v1/plans/{plan} requires.
PLAN_LIMITS = {
    "publish_msgs_per_s": 10,
    "publish_bytes_per_s": 1000,
    "consume_msgs_per_s": 20,
    "consume_bytes_per_s": 2000,
    "max_topics": 1,
    "max_queues": 4,
    "storage_bytes": 10_000,
    "max_retention_hours": 2,
}


async def test_tenants_are_created_listed_read_and_changed(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    made = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "acme", "display_name": "Acme Inc."})
    assert made.status == 201
    assert (made.body["id"], made.body["plan"], made.body["status"]) == ("acme", "free", "active")
    again = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "acme"})
    assert again.status == 409
    assert again.body["error"]["code"] == "tenant_exists"
    bad = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "Acme!"})
    assert bad.status == 400
    assert bad.body["error"]["details"]["field"] == "id"
    no_plan = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "beta", "plan": "platinum"})
    assert no_plan.status == 404
    assert no_plan.body["error"]["code"] == "plan_not_found"
    await cp.call("POST", "/v1/tenants", operator=True, json={"id": "beta", "plan": "enterprise"})
    listed = await cp.call("GET", "/v1/tenants", operator=True)
    assert [t["id"] for t in listed.body["tenants"]] == ["acme", "beta"]
    changed = await cp.call("PATCH", "/v1/tenants/acme", operator=True, json={"plan": "standard"})
    assert changed.status == 200
    assert changed.body["plan"] == "standard"
    assert (await cp.call("GET", "/v1/tenants/acme", operator=True)).body["display_name"] == "Acme Inc."
    missing = await cp.call("GET", "/v1/tenants/nobody", operator=True)
    assert missing.status == 404
    assert missing.body["error"]["code"] == "tenant_not_found"


async def test_a_suspended_tenant_gets_no_tokens_and_its_tokens_stop_working(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    cred, token = await cp.new_tenant("acme")
    suspended = await cp.call("POST", "/v1/tenants/acme/suspend", operator=True)
    assert suspended.status == 200
    assert suspended.body["status"] == "suspended"
    refused = await cp.token_request(cred["access_key"], cred["secret"])
    assert refused.status == 401
    assert refused.body == {
        "error": "invalid_client",
        "error_description": "the credential's tenant is not active",
    }
    api = await cp.call("GET", "/v1/tenants/acme/topics", token=token)
    assert api.status == 403
    assert api.body["error"]["code"] == "tenant_suspended"
    await cp.call("POST", "/v1/tenants/acme/resume", operator=True)
    assert await cp.token_for(cred["access_key"], cred["secret"])
    assert (await cp.call("GET", "/v1/tenants/acme/topics", token=token)).status == 200


async def test_deleting_a_tenant_drops_its_resources_and_revokes_its_credentials(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    cred, token = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    await cp.call("POST", "/v1/tenants/acme/topics", token=token, json={"name": "orders"})
    deleted = await cp.call("DELETE", "/v1/tenants/acme", operator=True)
    assert deleted.status == 204
    assert (await cp.call("GET", "/v1/tenants/acme", operator=True)).status == 404
    assert (await cp.call("GET", "/v1/tenants/acme/topics", token=token)).status == 401
    assert await cp.services.pool.fetchval("SELECT count(*) FROM topics WHERE tenant_id = 'acme'") == 0
    status = await cp.services.pool.fetchval("SELECT status FROM credentials WHERE access_key = $1", cred["access_key"])
    assert status == "revoked"
    again = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "acme"})
    assert again.status == 409  # the id stays taken: usage history keeps its name
    groups = (await cp.call("GET", "/v1/fleet/broker-groups", operator=True)).body["broker_groups"]
    assert groups[0]["placed_queues"] == 0


async def test_plans_are_seeded_replaced_and_overridden_per_tenant(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    plans = (await cp.call("GET", "/v1/plans", operator=True)).body["plans"]
    assert [p["name"] for p in plans] == ["enterprise", "free", "standard"]
    limits = dict(PLAN_LIMITS)
    created = await cp.call("PUT", "/v1/plans/tiny", operator=True, json=limits)
    assert created.status == 201
    assert created.body["max_topics"] == 1
    replaced = await cp.call("PUT", "/v1/plans/tiny", operator=True, json={**limits, "max_topics": 2})
    assert replaced.status == 200
    assert replaced.body["max_topics"] == 2
    with_per_broker = await cp.call(
        "PUT", "/v1/plans/tiny", operator=True, json={**limits, "max_topics": 2, "max_connections": 7}
    )
    assert (with_per_broker.body["max_connections"], with_per_broker.body["max_inflight_requests"]) == (7, 10000)
    replaced = await cp.call("PUT", "/v1/plans/tiny", operator=True, json={**limits, "max_topics": 2})
    assert replaced.body["max_connections"] == 1000
    partial = await cp.call("PUT", "/v1/plans/tiny", operator=True, json={"max_topics": 3})
    assert partial.status == 400
    assert partial.body["error"]["code"] == "invalid_field"
    await cp.call("POST", "/v1/tenants", operator=True, json={"id": "acme", "plan": "tiny"})
    quota = await cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"max_topics": 5, "storage_bytes": 7})
    assert quota.status == 200
    assert quota.body["overrides"] == {"max_topics": 5, "storage_bytes": 7}
    # (a plan written without the per-broker limits nor the tiered ones gets their defaults)
    defaults = {
        "max_connections": 1000,
        "max_inflight_requests": 10000,
        "unlimited_retention": False,
        "max_tiered_bytes": None,
    }
    assert quota.body["effective"] == {**limits, **defaults, "max_topics": 5, "storage_bytes": 7}
    cleared = await cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"max_topics": None})
    assert cleared.body["effective"]["max_topics"] == 2
    assert cleared.body["overrides"] == {}
    tenant_view = await cp.call("POST", "/v1/tenants/acme/credentials", operator=True, json={})
    token = await cp.token_for(tenant_view.body["access_key"], tenant_view.body["secret"])
    assert (await cp.call("GET", "/v1/tenants/acme/quota", token=token)).body["plan"] == "tiny"
    assert (await cp.call("PUT", "/v1/tenants/acme/quota", token=token, json={"max_topics": 99})).status == 403
    assert (await cp.call("PUT", "/v1/plans/tiny", token=token, json=limits)).status == 403


async def test_plans_allow_unlimited_retention_cap_and_price_tiered_bytes(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    seeded = {p["name"]: p for p in (await cp.call("GET", "/v1/plans", operator=True)).body["plans"]}
    assert {n: (p["unlimited_retention"], p["max_tiered_bytes"]) for n, p in seeded.items()} == {
        "free": (False, 1 << 30),
        "standard": (False, None),
        "enterprise": (True, None),  # the top plan keeps messages for good when a topic asks
    }
    assert {n: p["tiered_price_per_gb_month_micros"] for n, p in seeded.items()} == {
        "free": 0,
        "standard": 23_000,
        "enterprise": 20_000,
    }
    assert seeded["standard"]["storage_bytes"] == 107374182400  # the disk's quota as it was
    limits = dict(PLAN_LIMITS)
    tiered = {"unlimited_retention": True, "max_tiered_bytes": 5 << 30, "tiered_price_per_gb_month_micros": 21_500}
    made = await cp.call("PUT", "/v1/plans/archive", operator=True, json={**limits, **tiered})
    assert made.status == 201, made.body
    assert {k: made.body[k] for k in tiered} == tiered
    uncapped = await cp.call(
        "PUT", "/v1/plans/archive", operator=True, json={**limits, **tiered, "max_tiered_bytes": None}
    )
    assert uncapped.body["max_tiered_bytes"] is None  # null: no cap
    for field, bad in (
        ("unlimited_retention", "yes"),
        ("unlimited_retention", 1),
        ("max_tiered_bytes", -1),
        ("max_tiered_bytes", 2**63),
        ("tiered_price_per_gb_month_micros", -5),
        ("tiered_price_per_gb_month_micros", 0.5),
    ):
        refused = await cp.call("PUT", "/v1/plans/archive", operator=True, json={**limits, field: bad})
        assert refused.status == 400, (field, bad, refused.body)
        assert refused.body["error"]["details"]["field"] == field
    # Overrides: a tenant may get unlimited retention or a tiered cap of its own; the price is the plan's.
    await cp.call("POST", "/v1/tenants", operator=True, json={"id": "acme", "plan": "standard"})
    quota = await cp.call(
        "PUT", "/v1/tenants/acme/quota", operator=True, json={"unlimited_retention": True, "max_tiered_bytes": 1000}
    )
    assert quota.status == 200, quota.body
    assert quota.body["overrides"] == {"unlimited_retention": True, "max_tiered_bytes": 1000}
    assert (quota.body["effective"]["unlimited_retention"], quota.body["effective"]["max_tiered_bytes"]) == (True, 1000)
    priced = await cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"tiered_price_per_gb_month_micros": 1})
    assert priced.status == 400
    assert priced.body["error"]["code"] == "invalid_request"  # not a field of overrides
    back = await cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={})
    assert (back.body["effective"]["unlimited_retention"], back.body["effective"]["max_tiered_bytes"]) == (False, None)


async def test_the_fleet_has_broker_groups_hosts_and_capacity(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    group = await cp.new_broker_group("broker-a", max_queues=64)
    assert (group["name"], group["max_queues"], group["placed_queues"], group["free_queues"]) == ("broker-a", 64, 0, 64)
    dup = await cp.call("POST", "/v1/fleet/broker-groups", operator=True, json={**group, "hosts": None})
    assert dup.status == 400  # unknown fields are refused before anything else
    dup = await cp.call(
        "POST",
        "/v1/fleet/broker-groups",
        operator=True,
        json={"name": "broker-a", "max_queues": 1, "max_msgs_per_s": 1, "storage_bytes": 1},
    )
    assert dup.status == 409
    assert dup.body["error"]["code"] == "broker_group_exists"
    host = await cp.call(
        "POST",
        "/v1/fleet/broker-groups/broker-a/hosts",
        operator=True,
        json={"broker_id": 0, "host": "ssd-01.dc1", "address": "10.0.0.1:10911"},
    )
    assert host.status == 201
    await cp.call(
        "POST",
        "/v1/fleet/broker-groups/broker-a/hosts",
        operator=True,
        json={"broker_id": 1, "host": "ssd-02.dc1", "address": "10.0.0.2:10911"},
    )
    got = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a", operator=True)).body
    assert [(h["broker_id"], h["host"]) for h in got["hosts"]] == [(0, "ssd-01.dc1"), (1, "ssd-02.dc1")]
    drained = await cp.call("PATCH", "/v1/fleet/broker-groups/broker-a", operator=True, json={"status": "draining"})
    assert drained.body["status"] == "draining"
    nowhere = await cp.call(
        "POST",
        "/v1/fleet/broker-groups/broker-z/hosts",
        operator=True,
        json={"broker_id": 0, "host": "h", "address": "10.0.0.1:1"},
    )
    assert nowhere.status == 404
    assert nowhere.body["error"]["code"] == "broker_group_not_found"
