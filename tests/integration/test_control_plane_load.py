"""Load history end to end: a real broker's load reports (``POST /internal/v1/load``) kept by the
control plane and read back by the tenant (``/groups/{name}/lag``, ``/topics/{name}/load``); who
may report and read, bad reports, and retention."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from data_plane.remoting.codes import ResponseCode
from tests.integration.load_support import lag, latest, reported_empty, send, stored_backlog, taker
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture, until  # noqa: F401
from tests.integration.test_tenancy_e2e_refusals import send_cmd
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
    serve_control_plane,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

SENT = 30


def now_ms() -> int:
    return int(dt.datetime.now(dt.UTC).timestamp() * 1000)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def report(broker: str = "broker-a", **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "broker": broker,
        "at": now_ms(),
        "topics": [{"tenant": "acme", "topic": "orders", "queues": [{"id": 0, "max_offset": 10, "perm": 6}]}],
        "groups": [
            {
                "tenant": "acme",
                "group": "billing",
                "topic": "orders",
                "queues": [{"id": 0, "committed": 4, "max_offset": 10}],
            }
        ],
    }
    doc.update(changes)
    return doc


async def test_a_brokers_reports_give_the_tenant_its_groups_backlog_and_rates(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    await reported_empty(tenancy, "orders")
    await send(tenancy, acme, "orders", SENT)
    async with taker(tenancy, acme, "billing", "orders") as consumer:
        await consumer.take(5)
        await stored_backlog(tenancy, acme, "billing", "orders", SENT - 5)
        await consumer.take(7)
        await stored_backlog(tenancy, acme, "billing", "orders", SENT - 12)
    got = await lag(tenancy, acme, "billing", "orders")
    assert got["step_s"] == 60
    assert len(got["buckets"]) in (60, 61)
    # 7 more committed between two reports: some bucket shows a consume rate.
    assert any((b["consume_rate"] or 0) > 0 for b in got["buckets"])
    everything = await lag(tenancy, acme, "billing", "")  # every topic of the group
    assert latest(everything["buckets"], "backlog") == SENT - 12
    end = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)  # (ISO to the second: past the last report)
    day = await lag(tenancy, acme, "billing", "orders", f"&from={iso(end - dt.timedelta(days=1))}&to={iso(end)}")
    assert day["step_s"] == 720
    assert latest(day["buckets"], "backlog") == SENT - 12

    async def published() -> bool:
        reply = await tenancy.cp.call("GET", "/v1/tenants/acme/topics/orders/load", token=acme.token)
        assert reply.status == 200, reply.body
        return any((b["publish_rate"] or 0) > 0 for b in reply.body["buckets"])

    # The topic was reported empty, then with its 30 messages.
    await until(published, "a stored publish rate of orders", timeout_s=30)
    rows = await tenancy.services.pool.fetch(
        "SELECT DISTINCT broker, appended FROM topic_load_samples WHERE tenant_id = 'acme' AND topic = 'orders'"
    )
    assert {(r["broker"], r["appended"]) for r in rows} >= {("broker-a", SENT)}


async def test_a_broker_reports_for_its_own_group_and_its_topics_only(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    home, other = "broker-a", "broker-b"
    await cp.new_broker_group(home)
    _made, acme_token = await cp.new_tenant("acme")
    assert (await cp.call("POST", "/v1/tenants/acme/topics", token=acme_token, json={"name": "orders"})).status == 201
    assert (await cp.call("POST", "/v1/tenants/acme/groups", token=acme_token, json={"name": "billing"})).status == 201
    await cp.new_broker_group(other)  # made after the topic: none of its queues are there
    # A credential bound to a host of the home group speaks for that group only.
    host = await cp.call("POST", f"/v1/fleet/broker-groups/{home}/hosts/127.0.0.1/credential", operator=True)
    assert host.status == 201, host.body
    bound = await cp.token_for(host.body["access_key"], host.body["secret"])
    refused = await cp.call("POST", "/internal/v1/load", token=bound, json=report(other))
    assert refused.status == 403, refused.body
    assert home in refused.body["error"]["message"]
    assert (await cp.call("POST", "/internal/v1/load", token=bound, json=report("broker-z"))).status == 403
    assert (await cp.call("POST", "/internal/v1/load", json=report(home))).status == 401
    assert (await cp.call("POST", "/internal/v1/load", token=acme_token, json=report(home))).status == 403
    # From the home group: stored. Another group's report of the same topic (not placed there,
    # whoever sends it): left out.
    ok = await cp.call("POST", "/internal/v1/load", token=bound, json=report(home))
    assert (ok.status, ok.body) == (200, {"stored": 2, "ignored": 0})
    elsewhere = await cp.call("POST", "/internal/v1/load", operator=True, json=report(other))
    assert (elsewhere.status, elsewhere.body) == (200, {"stored": 0, "ignored": 2})
    unknown_group = report(home, groups=[{**report()["groups"][0], "group": "nobody"}])
    assert (await cp.call("POST", "/internal/v1/load", token=bound, json=unknown_group)).body["ignored"] == 1
    brokers = await cp.services.pool.fetch("SELECT DISTINCT broker FROM topic_load_samples")
    assert [r["broker"] for r in brokers] == [home]
    got = (await cp.call("GET", "/v1/tenants/acme/groups/billing/lag?topic=orders", token=acme_token)).body
    assert latest(got["buckets"], "backlog") == 6


async def test_refused_sends_are_counted_per_topic_in_the_stored_history(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"publish_msgs_per_s": 50})
    assert reply.status == 200, reply.body
    await tenancy.create_topic(acme, "orders")
    answers = await asyncio.gather(*(tenancy.invoke(send_cmd("acme%orders"), token=acme.token) for _ in range(200)))
    refused = sum(a.code == ResponseCode.FLOW_CONTROL for a in answers)
    assert refused > 0
    assert {a.code for a in answers} <= {ResponseCode.SUCCESS, ResponseCode.FLOW_CONTROL}

    async def counted() -> bool:
        reply = await tenancy.cp.call("GET", "/v1/tenants/acme/topics/orders/load", token=acme.token)
        assert reply.status == 200, reply.body
        stored: int = sum(b["refused"] for b in reply.body["buckets"])
        return stored == refused

    await until(counted, f"{refused} refusals in the stored history of orders", timeout_s=30)


def one_topic(*queues: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"topics": [{"tenant": "acme", "topic": "o", "queues": list(queues), **fields}]}


def one_group(*queues: dict[str, Any]) -> dict[str, Any]:
    return {"groups": [{"tenant": "acme", "group": "g", "topic": "o", "queues": list(queues)}]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"broker": "no spaces"}, "broker"),
        ({"at": "yesterday"}, "at"),
        ({"at": None}, "at"),
        ({"at": 0}, "at"),  # older than the history kept
        ({"at": now_ms() + 3_600_000}, "at"),  # an hour ahead
        ({"topics": {}}, "topics"),
        ({"topics": [{"tenant": "acme", "topic": "orders"}]}, "topics[0].queues"),
        ({"topics": [{"tenant": "a%b", "topic": "orders", "queues": []}]}, "topics[0].tenant"),
        (one_topic(extra=1), "topics[0]"),
        (one_topic({"id": 0, "max_offset": -1}), "topics[0].queues[0].max_offset"),
        (one_topic({"id": 0, "max_offset": 2**60}), "topics[0].queues[0].max_offset"),
        (one_topic({"id": 0, "max_offset": 1}, {"id": 0, "max_offset": 2}), "topics[0].queues[1].id"),
        (one_topic({"id": 5000, "max_offset": 1}), "topics[0].queues[0].id"),
        (one_topic({"id": 0, "max_offset": 1, "perm": 9}), "topics[0].queues[0].perm"),
        ({"topics": one_topic()["topics"] * 2}, "topics[1]"),
        ({"topics": [*one_topic()["topics"], "x"]}, "topics[1]"),
        (one_group({"id": 0, "committed": 1}), "groups[0].queues[0].max_offset"),
        (one_group({"id": 0, "committed": True, "max_offset": 1}), "groups[0].queues[0].committed"),
    ],
)
async def test_bad_load_reports_are_refused_with_the_field_named(
    control_plane: ControlPlaneHarness, change: dict[str, Any], field: str
) -> None:
    await control_plane.new_broker_group("broker-a")
    body = report(**change)
    if body["at"] is None:
        del body["at"]
    reply = await control_plane.call("POST", "/internal/v1/load", operator=True, json=body)
    assert reply.status == 400, reply.body
    assert reply.body["error"]["details"]["field"] == field, reply.body


async def test_a_load_report_past_the_size_limit_is_refused(control_plane: ControlPlaneHarness) -> None:
    queues = [{"id": i, "max_offset": 10**15} for i in range(1024)]
    topics = [{"tenant": "acme", "topic": f"t{i}", "queues": queues} for i in range(4)]
    reply = await control_plane.call("POST", "/internal/v1/load", operator=True, json=report(topics=topics))
    assert reply.status == 413, reply.body
    many = [{"tenant": "acme", "topic": f"t{i}", "queues": []} for i in range(2001)]
    reply = await control_plane.call("POST", "/internal/v1/load", operator=True, json=report(topics=many))
    assert reply.status in (400, 413), reply.body


async def test_samples_older_than_the_history_are_pruned(postgres_dsn: str, tmp_path: Path) -> None:
    async with serve_control_plane(postgres_dsn, tmp_path, load_history_hours=1, load_prune_interval_s=0.1) as cp:
        await cp.new_broker_group("broker-a")
        _made, token = await cp.new_tenant("acme")
        assert (await cp.call("POST", "/v1/tenants/acme/topics", token=token, json={"name": "orders"})).status == 201
        assert (await cp.call("POST", "/v1/tenants/acme/groups", token=token, json={"name": "billing"})).status == 201
        now = dt.datetime.now(dt.UTC)
        doc = report()
        for at in (now - dt.timedelta(hours=3), now - dt.timedelta(minutes=90), now):
            got = await cp.services.load.ingest(
                access_key="test", broker="broker-a", at=at, topics=[_topic(doc)], groups=[_group(doc)]
            )
            assert got == {"stored": 2, "ignored": 0}
        kept = "SELECT count(*) FROM topic_load_samples"

        async def pruned() -> bool:
            count: int = await cp.services.pool.fetchval(kept)
            return count == 1

        await until(pruned, "the samples older than 1 hour pruned")
        assert await cp.services.pool.fetchval("SELECT count(*) FROM group_load_samples") == 1
        old = report(at=now_ms() - 2 * 3_600_000)
        assert (await cp.call("POST", "/internal/v1/load", operator=True, json=old)).status == 400


def _topic(doc: dict[str, Any]) -> dict[str, Any]:
    t = doc["topics"][0]
    return {"tenant": t["tenant"], "topic": t["topic"], "appended": 10, "queues": 1, "refused": 0}


def _group(doc: dict[str, Any]) -> dict[str, Any]:
    g = doc["groups"][0]
    return {"tenant": g["tenant"], "group": g["group"], "topic": g["topic"], "committed": 4, "backlog": 6}


async def test_a_tenant_reads_its_own_groups_lag_only(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    await cp.new_broker_group("broker-a")
    _made, acme = await cp.new_tenant("acme")
    _made, globex = await cp.new_tenant("globex")
    assert (await cp.call("POST", "/v1/tenants/acme/topics", token=acme, json={"name": "orders"})).status == 201
    assert (await cp.call("POST", "/v1/tenants/acme/groups", token=acme, json={"name": "billing"})).status == 201
    lag_path = "/v1/tenants/acme/groups/billing/lag?topic=orders"
    load_path = "/v1/tenants/acme/topics/orders/load"
    assert (await cp.call("GET", lag_path, token=acme)).status == 200
    assert (await cp.call("GET", lag_path, token=globex)).status == 403
    assert (await cp.call("GET", load_path, token=globex)).status == 403
    assert (await cp.call("GET", lag_path)).status == 401
    assert (await cp.call("GET", "/v1/tenants/acme/groups/nobody/lag", token=acme)).status == 404
    assert (await cp.call("GET", "/v1/tenants/acme/groups/billing/lag?topic=nothing", token=acme)).status == 404
    assert (await cp.call("GET", "/v1/tenants/acme/topics/nothing/load", token=acme)).status == 404
    # A credential granted group billing but no topic reads the group's lag on no topic.
    narrow = await cp.call(
        "POST",
        "/v1/tenants/acme/credentials",
        token=acme,
        json={"grants": [{"resource": "group", "pattern": "billing", "actions": ["subscribe"]}]},
    )
    assert narrow.status == 201, narrow.body
    narrow_token = await cp.token_for(narrow.body["access_key"], narrow.body["secret"])
    assert (await cp.call("GET", lag_path, token=narrow_token)).status == 403
    assert (await cp.call("GET", load_path, token=narrow_token)).status == 403
    assert (await cp.call("GET", "/v1/tenants/acme/groups/billing/lag", token=narrow_token)).status == 200
    bad = await cp.call("GET", lag_path + "&from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", token=acme)
    assert (bad.status, bad.body["error"]["details"]["field"]) == (400, "from")
    wide = await cp.call("GET", load_path + "?from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z", token=acme)
    assert (wide.status, wide.body["error"]["details"]["field"]) == (400, "to")


async def test_an_operator_reads_a_broker_groups_load_summed_over_its_tenants_topics(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    await cp.new_broker_group("broker-a")
    assert (await cp.call("PATCH", "/v1/fleet/broker-groups/broker-a", operator=True,
                          json={"max_msgs_per_s": 5000})).status == 200  # fmt: skip
    tokens = {}
    for tenant, topic in (("acme", "orders"), ("globex", "invoices")):
        _made, tokens[tenant] = await cp.new_tenant(tenant)
        made = await cp.call("POST", f"/v1/tenants/{tenant}/topics", token=tokens[tenant], json={"name": topic})
        assert made.status == 201, made.body
    # Two reports a minute apart: orders grows by 600 messages, invoices by 1,800; 5 and 7 refused.
    now = dt.datetime.now(dt.UTC)
    for at, grown, refused in ((now - dt.timedelta(seconds=150), 0, 0), (now - dt.timedelta(seconds=90), 1, 1)):
        doc = {
            "broker": "broker-a",
            "at": iso(at),
            "topics": [
                {"tenant": "acme", "topic": "orders", "queues": [{"id": 0, "max_offset": 600 * grown}],
                 "refused": 5 * refused},
                {"tenant": "globex", "topic": "invoices", "queues": [{"id": 0, "max_offset": 1800 * grown}],
                 "refused": 7 * refused},
            ],
        }  # fmt: skip
        stored = await cp.call("POST", "/internal/v1/load", operator=True, json=doc)
        assert (stored.status, stored.body) == (200, {"stored": 2, "ignored": 0})
    got = await cp.call("GET", "/v1/fleet/broker-groups/broker-a/load", operator=True)
    assert got.status == 200, got.body
    assert (got.body["broker_group"], got.body["max_msgs_per_s"], got.body["topics"]) == ("broker-a", 5000, 2)
    orders = (await cp.call("GET", "/v1/tenants/acme/topics/orders/load", token=tokens["acme"])).body["buckets"]
    invoices = (await cp.call("GET", "/v1/tenants/globex/topics/invoices/load", token=tokens["globex"])).body["buckets"]
    # Each bucket of the group is the sum of its topics' buckets.
    for g, a, b in zip(got.body["buckets"], orders, invoices, strict=True):
        assert g["start"] == a["start"] == b["start"]
        rates = [r for r in (a["publish_rate"], b["publish_rate"]) if r is not None]
        assert g["publish_rate"] == (pytest.approx(sum(rates), abs=0.01) if rates else None)
        assert g["refused"] == a["refused"] + b["refused"]
    assert sum(b["refused"] for b in got.body["buckets"]) == 12
    assert sum(b["publish_rate"] or 0 for b in got.body["buckets"]) > 0
    # Operators only; a group that is not there; a range the other load reads refuse too.
    path = "/v1/fleet/broker-groups/broker-a/load"
    assert (await cp.call("GET", path, token=tokens["acme"])).status == 403
    assert (await cp.call("GET", path)).status == 401
    assert (await cp.call("GET", "/v1/fleet/broker-groups/broker-z/load", operator=True)).status == 404
    wide = await cp.call("GET", path + "?from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z", operator=True)
    assert (wide.status, wide.body["error"]["details"]["field"]) == (400, "to")
