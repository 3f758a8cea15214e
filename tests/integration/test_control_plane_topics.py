"""Topics and consumer groups: idempotent creation, placement by free capacity, plan limits,
the crash-safe provisioning state, and a broker group's desired state."""

from __future__ import annotations

import asyncio

import pytest

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
