"""Topics and consumer groups: idempotent creation, placement by free capacity, plan limits,
the crash-safe provisioning state, and a broker group's desired state."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from control_plane.reconcile_source import ServicesStateSource
from data_plane.broker.tenancy import parse_snapshot
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
T = "/v1/tenants/acme"


async def test_creating_a_topic_twice_answers_the_same_topic(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    spec = {"name": "orders", "message_type": "FIFO", "retention_hours": 48, "throughput_hint_msgs_per_s": 6500}
    first = await cp.call("POST", T + "/topics", token=token, json=spec)
    assert first.status == 201
    assert (first.body["queue_count"], first.body["status"], first.body["wire_name"]) == (
        7,
        "provisioning",
        "acme%orders",
    )
    second = await cp.call("POST", T + "/topics", token=token, json=spec)
    assert second.status == 200
    assert second.body == first.body
    conflict = await cp.call("POST", T + "/topics", token=token, json={**spec, "message_type": "NORMAL"})
    assert conflict.status == 409
    assert conflict.body["error"]["code"] == "topic_exists"
    assert conflict.body["error"]["details"]["existing"]["message_type"] == "FIFO"
    listed = await cp.call("GET", T + "/topics", token=token)
    assert [t["name"] for t in listed.body["topics"]] == ["orders"]


async def test_concurrent_identical_creates_make_one_topic(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    replies = await asyncio.gather(
        *(cp.call("POST", T + "/topics", token=token, json={"name": "orders"}) for _ in range(8))
    )
    assert sorted(r.status for r in replies) == [200] * 7 + [201]
    assert await cp.services.pool.fetchval("SELECT sum(queue_count) FROM topic_placements") == 4


async def test_queues_spread_over_broker_groups_by_free_capacity(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme", plan="enterprise")
    await cp.new_broker_group("broker-a", max_queues=100)
    await cp.new_broker_group("broker-b", max_queues=100)
    await cp.new_broker_group("broker-c", max_queues=40)
    big = await cp.call("POST", T + "/topics", token=token, json={"name": "big", "throughput_hint_msgs_per_s": 60_000})
    assert big.status == 201
    placed = {p["broker_group"]: p["queue_count"] for p in big.body["placements"]}
    assert placed == {"broker-a": 30, "broker-b": 30}  # a and b fall to 70 free, still above c's 40
    assert sum(placed.values()) == big.body["queue_count"] == 60
    # now a and b have 70 free, c has 40: the next queues go to a and b until they are level with c
    more = await cp.call(
        "POST", T + "/topics", token=token, json={"name": "more", "throughput_hint_msgs_per_s": 66_000}
    )
    placed = {p["broker_group"]: p["queue_count"] for p in more.body["placements"]}
    assert placed == {"broker-a": 32, "broker-b": 32, "broker-c": 2}
    fleet = {
        g["name"]: g["free_queues"]
        for g in (await cp.call("GET", "/v1/fleet/broker-groups", operator=True)).body["broker_groups"]
    }
    assert fleet == {"broker-a": 38, "broker-b": 38, "broker-c": 38}
    # draining groups take nothing new
    await cp.call("PATCH", "/v1/fleet/broker-groups/broker-a", operator=True, json={"status": "draining"})
    await cp.call("PATCH", "/v1/fleet/broker-groups/broker-b", operator=True, json={"status": "draining"})
    last = await cp.call("POST", T + "/topics", token=token, json={"name": "last"})
    assert [p["broker_group"] for p in last.body["placements"]] == ["broker-c"]


async def test_plan_limits_refuse_with_a_stable_code(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme", plan="free")  # 5 topics, 20 queues, 24 h retention
    await cp.new_broker_group("broker-a")
    long = await cp.call("POST", T + "/topics", token=token, json={"name": "t", "retention_hours": 25})
    assert long.status == 422
    assert long.body["error"]["details"]["limit"] == "max_retention_hours"
    for i in range(5):
        assert (await cp.call("POST", T + "/topics", token=token, json={"name": f"t{i}"})).status == 201
    sixth = await cp.call("POST", T + "/topics", token=token, json={"name": "t5"})
    assert sixth.status == 422
    assert sixth.body["error"] == {
        "code": "quota_exceeded",
        "message": "plan limit max_topics is 5; this request needs 6",
        "details": {"limit": "max_topics", "allowed": 5, "requested": 6},
    }
    await cp.call("PUT", T + "/quota", operator=True, json={"max_topics": 10})
    queues = await cp.call("POST", T + "/topics", token=token, json={"name": "t5"})
    assert queues.status == 422
    assert queues.body["error"]["details"]["limit"] == "max_queues"


async def test_a_create_that_fails_half_way_leaves_nothing_and_can_be_retried(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme")
    await cp.new_broker_group("tiny", max_queues=2)
    failed = await cp.call("POST", T + "/topics", token=token, json={"name": "orders"})
    assert failed.status == 503
    assert failed.body["error"]["code"] == "insufficient_capacity"
    assert await cp.services.pool.fetchval("SELECT count(*) FROM topics") == 0
    await cp.call("PATCH", "/v1/fleet/broker-groups/tiny", operator=True, json={"max_queues": 10})
    assert (await cp.call("POST", T + "/topics", token=token, json={"name": "orders"})).status == 201


async def test_the_reconciler_marks_topics_active_group_by_group(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    await cp.new_broker_group("broker-b")
    await cp.call("POST", T + "/topics", token=token, json={"name": "orders"})
    services = cp.services
    assert await services.mark_topic_active(tenant_id="acme", name="orders", broker_group="broker-a") == "provisioning"
    assert await services.mark_topic_active(tenant_id="acme", name="orders", broker_group="broker-b") == "active"
    grown = await cp.call("PATCH", T + "/topics/orders", token=token, json={"throughput_hint_msgs_per_s": 8000})
    assert grown.body["status"] == "provisioning"
    assert grown.body["queue_count"] == 8
    assert await services.mark_topic_active(tenant_id="acme", name="orders") == "active"
    shrunk = await cp.call("PATCH", T + "/topics/orders", token=token, json={"throughput_hint_msgs_per_s": 10})
    assert shrunk.body["queue_count"] == 8  # queues are never taken away
    gone = await cp.call("DELETE", T + "/topics/orders", token=token)
    assert gone.status == 204
    missing = await cp.call("GET", T + "/topics/orders", token=token)
    assert missing.status == 404
    assert missing.body["error"]["code"] == "topic_not_found"


async def test_consumer_groups(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme")
    made = await cp.call("POST", T + "/groups", token=token, json={"name": "billing"})
    assert made.status == 201
    assert (made.body["max_retries"], made.body["retry_policy"], made.body["consume_orderly"]) == (
        16,
        "exponential",
        False,
    )
    assert (made.body["retry_topic"], made.body["dlq_topic"]) == ("%RETRY%acme%billing", "%DLQ%acme%billing")
    assert (await cp.call("POST", T + "/groups", token=token, json={"name": "billing"})).status == 200
    other = await cp.call("POST", T + "/groups", token=token, json={"name": "billing", "max_retries": 3})
    assert other.status == 409
    assert other.body["error"]["code"] == "group_exists"
    changed = await cp.call(
        "PATCH", T + "/groups/billing", token=token, json={"retry_policy": "fixed", "fixed_interval_ms": 500}
    )
    assert (changed.body["retry_policy"], changed.body["fixed_interval_ms"], changed.body["max_retries"]) == (
        "fixed",
        500,
        16,
    )
    bad = await cp.call("POST", T + "/groups", token=token, json={"name": "g2", "max_retries": 65})
    assert bad.status == 400
    assert bad.body["error"]["details"]["field"] == "max_retries"
    assert (await cp.call("DELETE", T + "/groups/billing", token=token)).status == 204
    assert (await cp.call("GET", T + "/groups/billing", token=token)).status == 404


async def test_desired_state_of_a_broker_group(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    acme_cred, acme = await cp.new_tenant("acme", plan="standard")
    _, beta = await cp.new_tenant("beta", plan="standard")
    await cp.new_tenant("idle")  # no topics: on no broker group
    await cp.new_broker_group("broker-a")
    await cp.new_broker_group("broker-b")
    await cp.call(
        "POST", "/v1/tenants/acme/topics", token=acme, json={"name": "orders", "throughput_hint_msgs_per_s": 8000}
    )
    await cp.call("POST", "/v1/tenants/acme/groups", token=acme, json={"name": "billing", "consume_orderly": True})
    await cp.call("POST", "/v1/tenants/beta/topics", token=beta, json={"name": "events", "message_type": "DELAY"})
    revoked = await cp.call("POST", "/v1/tenants/acme/credentials", token=acme, json={})
    await cp.call("DELETE", f"/v1/tenants/acme/credentials/{revoked.body['access_key']}", token=acme)

    state = await cp.services.desired_state("broker-a")
    assert state["broker_group"] == "broker-a"
    assert state["broker_group_status"] == "active"
    topics = {t["name"]: t for t in state["topics"]}
    assert topics["acme%orders"]["read_queue_nums"] == topics["acme%orders"]["write_queue_nums"] == 4
    assert topics["acme%orders"]["perm"] == 6
    assert topics["acme%orders"]["status"] == "provisioning"
    assert state["groups"] == [
        {
            "name": "acme%billing",
            "tenant": "acme",
            "group": "billing",
            "retry_max_times": 16,
            "consume_orderly": True,
            "retry_policy": "exponential",
            "fixed_interval_ms": 10_000,
            "retry_topic": "%RETRY%acme%billing",
            "dlq_topic": "%DLQ%acme%billing",
        }
    ]
    tenants = {t["id"]: t for t in state["tenants"]}
    assert "idle" not in tenants
    assert tenants["acme"]["broker_group_count"] == 2
    assert tenants["acme"]["quota"]["publish_msgs_per_s"] == 2500  # standard: 5000 over 2 groups
    creds = {c["access_key"]: c for c in state["credentials"]}
    assert creds[acme_cred["access_key"]]["secret"] == acme_cred["secret"]
    assert creds[acme_cred["access_key"]]["tenant"] == "acme"
    assert creds[acme_cred["access_key"]]["status"] == "active"
    assert creds[revoked.body["access_key"]]["status"] == "revoked"
    assert creds[revoked.body["access_key"]]["secret"] == ""
    assert creds[cp.operator_access_key]["role"] == "operator"
    assert creds[cp.operator_access_key]["tenant"] == "*"
    everywhere = {t["name"] for t in state["topics"]} | {
        t["name"] for t in (await cp.services.desired_state("broker-b"))["topics"]
    }
    assert everywhere == {"acme%orders", "beta%events"}


# --- retention in two tiers -------------------------------------------------------------------------
async def test_retention_is_hours_up_to_a_year_or_unlimited_where_the_plan_allows_it(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme", plan="standard")  # 168 h, no unlimited retention
    await cp.new_broker_group("broker-a")
    for bad in (0, 8761, 100_000, "forever", "Unlimited", 1.5, True):
        refused = await cp.call("POST", T + "/topics", token=token, json={"name": "t", "retention_hours": bad})
        assert refused.status == 400, (bad, refused.body)
        assert refused.body["error"]["code"] == "invalid_field"
        assert refused.body["error"]["details"]["field"] == "retention_hours"
        assert '1..8760 or "unlimited"' in refused.body["error"]["message"]
    unlimited = await cp.call("POST", T + "/topics", token=token, json={"name": "t", "retention_hours": "unlimited"})
    assert unlimited.status == 422
    assert unlimited.body["error"]["code"] == "quota_exceeded"
    assert unlimited.body["error"]["details"] == {"limit": "unlimited_retention", "allowed": False, "requested": True}
    assert "needs a plan with unlimited_retention" in unlimited.body["error"]["message"]
    assert "at most 168 hours" in unlimited.body["error"]["message"]
    assert await cp.services.pool.fetchval("SELECT count(*) FROM topics") == 0

    made = await cp.call("POST", T + "/topics", token=token, json={"name": "t", "retention_hours": 168})
    assert made.status == 201
    assert (made.body["retention_hours"], made.body["local_retention_hours"]) == (168, None)
    patched = await cp.call("PATCH", T + "/topics/t", token=token, json={"retention_hours": "unlimited"})
    assert patched.status == 422
    assert patched.body["error"]["details"]["limit"] == "unlimited_retention"

    # The plan's flag (or the tenant's override of it) allows it: kept for good.
    await cp.call("PUT", T + "/quota", operator=True, json={"unlimited_retention": True})
    patched = await cp.call("PATCH", T + "/topics/t", token=token, json={"retention_hours": "unlimited"})
    assert patched.status == 200, patched.body
    assert patched.body["retention_hours"] == "unlimited"
    assert (await cp.call("GET", T + "/topics/t", token=token)).body["retention_hours"] == "unlimited"
    assert await cp.services.pool.fetchval("SELECT retention_hours FROM topics WHERE name = 't'") is None
    # Finite retention is still capped by max_retention_hours.
    capped = await cp.call("PATCH", T + "/topics/t", token=token, json={"retention_hours": 169})
    assert capped.status == 422
    assert capped.body["error"]["details"] == {"limit": "max_retention_hours", "allowed": 168, "requested": 169}

    _, big = await cp.new_tenant("bigco", plan="enterprise")  # the top plan: unlimited retention
    archive = await cp.call(
        "POST", "/v1/tenants/bigco/topics", token=big, json={"name": "archive", "retention_hours": "unlimited"}
    )
    assert archive.status == 201, archive.body
    assert archive.body["retention_hours"] == "unlimited"
    again = await cp.call(
        "POST", "/v1/tenants/bigco/topics", token=big, json={"name": "archive", "retention_hours": "unlimited"}
    )
    assert again.status == 200  # the same spec
    other = await cp.call("POST", "/v1/tenants/bigco/topics", token=big, json={"name": "archive"})
    assert other.status == 409
    assert other.body["error"]["details"]["existing"]["retention_hours"] == "unlimited"


async def test_local_retention_is_part_of_the_total_and_null_means_the_brokers_default(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    _, token = await cp.new_tenant("acme", plan="enterprise")  # 720 h, unlimited retention
    await cp.new_broker_group("broker-a")
    for bad in (0, 8761, "12", 2.5):
        refused = await cp.call("POST", T + "/topics", token=token, json={"name": "t", "local_retention_hours": bad})
        assert refused.status == 400, (bad, refused.body)
        assert refused.body["error"]["details"]["field"] == "local_retention_hours"
    longer = await cp.call(
        "POST", T + "/topics", token=token, json={"name": "t", "retention_hours": 48, "local_retention_hours": 49}
    )
    assert longer.status == 400
    assert longer.body["error"]["details"]["field"] == "local_retention_hours"
    assert "at most retention_hours (48)" in longer.body["error"]["message"]
    default = await cp.call("POST", T + "/topics", token=token, json={"name": "t", "local_retention_hours": 73})
    assert default.status == 400  # above the default total, 72 h
    assert await cp.services.pool.fetchval("SELECT count(*) FROM topics") == 0

    spec = {"name": "t", "retention_hours": 48, "local_retention_hours": 12}
    made = await cp.call("POST", T + "/topics", token=token, json=spec)
    assert made.status == 201
    assert (made.body["retention_hours"], made.body["local_retention_hours"]) == (48, 12)
    assert (await cp.call("POST", T + "/topics", token=token, json=spec)).status == 200
    other = await cp.call("POST", T + "/topics", token=token, json={**spec, "local_retention_hours": 24})
    assert other.status == 409
    assert other.body["error"]["details"]["existing"]["local_retention_hours"] == 12

    # A PATCH leaves it alone when left out, and the total may not go below it.
    lower = await cp.call("PATCH", T + "/topics/t", token=token, json={"retention_hours": 6})
    assert lower.status == 400
    assert lower.body["error"]["details"]["field"] == "local_retention_hours"
    both = await cp.call("PATCH", T + "/topics/t", token=token, json={"retention_hours": 6, "local_retention_hours": 6})
    assert (both.status, both.body["retention_hours"], both.body["local_retention_hours"]) == (200, 6, 6)
    described = await cp.call("PATCH", T + "/topics/t", token=token, json={"description": "orders"})
    assert (described.body["retention_hours"], described.body["local_retention_hours"]) == (6, 6)
    unlimited = await cp.call(
        "PATCH", T + "/topics/t", token=token, json={"retention_hours": "unlimited", "local_retention_hours": 8760}
    )
    assert (unlimited.body["retention_hours"], unlimited.body["local_retention_hours"]) == ("unlimited", 8760)
    cleared = await cp.call("PATCH", T + "/topics/t", token=token, json={"local_retention_hours": None})
    assert cleared.status == 200
    assert (cleared.body["retention_hours"], cleared.body["local_retention_hours"]) == ("unlimited", None)


async def test_the_tenancy_snapshot_maps_each_topic_to_its_retentions_and_tenants_to_their_tiered_share(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    _, big = await cp.new_tenant("bigco", plan="enterprise")
    _, small = await cp.new_tenant("small", plan="free")  # 1 GiB in object storage
    await cp.new_broker_group("broker-a")
    await cp.new_broker_group("broker-b")
    topics = [
        ("bigco", big, {"name": "archive", "retention_hours": "unlimited", "local_retention_hours": 24}),
        ("bigco", big, {"name": "orders", "retention_hours": 500}),
        ("small", small, {"name": "events", "retention_hours": 12, "local_retention_hours": 1}),
    ]
    for tenant, token, spec in topics:
        made = await cp.call("POST", f"/v1/tenants/{tenant}/topics", token=token, json=spec)
        assert made.status == 201, made.body
    snapshot = (await ServicesStateSource(cp.services).desired_state("broker-a"))["tenancy"]
    assert snapshot["topic_retention_hours"] == {"bigco%archive": None, "bigco%orders": 500, "small%events": 12}
    assert snapshot["topic_local_retention_hours"] == {"bigco%archive": 24, "small%events": 1}
    shares = {t["id"]: (t["storage_bytes"], t["max_tiered_bytes"]) for t in snapshot["tenants"]}
    # Each broker group gets its share: the tenant's limit over the 2 groups holding it; null: none.
    assert shares == {"bigco": (10995116277760 // 2, None), "small": (1073741824 // 2, 1073741824 // 2)}
    # The broker reads the very snapshot the reconciler sends.
    parsed = parse_snapshot(orjson.dumps(snapshot))
    assert parsed["topic_retention_hours"]["bigco%archive"] is None
    assert parsed["topic_local_retention_hours"] == {"bigco%archive": 24, "small%events": 1}
