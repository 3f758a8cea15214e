"""Bad input: malformed and oversized JSON, unknown fields, SQL-injection strings in every string
field, and an OpenAPI document that lists every route."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.app import ALL_ROUTES, create_app
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
INJECTIONS = [
    "x'; DROP TABLE tenants; --",
    "' OR '1'='1",
    '"; DELETE FROM credentials WHERE ""="',
    "1); UPDATE plans SET max_topics = 0; --",
    "$1 $$ \\' %s %%",
]
TABLES = (
    "tenants",
    "plans",
    "topics",
    "topic_placements",
    "consumer_groups",
    "credentials",
    "broker_groups",
    "broker_hosts",
    "signing_keys",
    "usage_records",
    "quota_overrides",
)


async def snapshot(cp: ControlPlaneHarness) -> dict[str, Any]:
    counts = {t: await cp.services.pool.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}
    plans = [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM plans ORDER BY name")]
    return {"counts": counts, "plans": plans}


async def test_malformed_json_gets_400_with_a_clear_message(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    cases: dict[bytes, str] = {
        b'{"id": "acme",': "not valid JSON",
        b"": "empty",
        b"[1, 2]": "must be a JSON object",
        b'"acme"': "must be a JSON object",
        b"\xff\xfe": "not valid JSON",
    }
    for raw, words in cases.items():
        reply = await cp.call(
            "POST", "/v1/tenants", operator=True, data=raw, headers={"Content-Type": "application/json"}
        )
        assert reply.status == 400, raw
        assert reply.body["error"]["code"] == "malformed_json"
        assert words in reply.body["error"]["message"], (raw, reply.body)
    unknown = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "acme", "owner": "me"})
    assert unknown.status == 400
    assert unknown.body["error"]["details"] == {"unknown_fields": ["owner"]}
    typed = await cp.call("PUT", "/v1/plans/x1z", operator=True, json={"max_topics": "5"})
    assert typed.status == 400
    assert typed.body["error"]["code"] == "invalid_field"


async def test_an_oversized_body_gets_413_with_the_limit(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    big = {"id": "acme", "display_name": "x" * (64 * 1024)}
    reply = await cp.call("POST", "/v1/tenants", operator=True, json=big)
    assert reply.status == 413
    assert reply.body["error"]["code"] == "payload_too_large"
    assert reply.body["error"]["details"] == {"limit_bytes": 65536}
    assert "65536" in reply.body["error"]["message"]


async def test_unknown_routes_and_methods_answer_in_the_error_shape(control_plane: ControlPlaneHarness) -> None:
    nowhere = await control_plane.call("GET", "/v2/nothing", operator=True)
    assert nowhere.status == 404
    assert nowhere.body["error"]["code"] == "not_found"
    method = await control_plane.call("PUT", "/v1/tenants", operator=True, json={})
    assert method.status == 405
    assert method.body["error"]["code"] == "method_not_allowed"


async def test_sql_injection_strings_are_stored_literally_or_refused_and_change_nothing_else(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    for i, evil in enumerate(INJECTIONS):
        before = await snapshot(cp)
        # free text: stored exactly as sent
        tenant = await cp.call("POST", "/v1/tenants", operator=True, json={"id": f"evil-{i}", "display_name": evil})
        assert tenant.status == 201
        assert tenant.body["display_name"] == evil
        cred = await cp.call("POST", "/v1/tenants/acme/credentials", token=admin, json={"description": evil})
        assert cred.status == 201
        assert cred.body["description"] == evil
        topic = await cp.call(
            "POST", "/v1/tenants/acme/topics", token=admin, json={"name": f"t{i}", "description": evil}
        )
        assert topic.status == 201
        assert topic.body["description"] == evil
        group = await cp.call(
            "POST", "/v1/tenants/acme/groups", token=admin, json={"name": f"g{i}", "description": evil}
        )
        assert group.status == 201
        assert group.body["description"] == evil
        # names, enums, addresses, patterns, path and query parts: refused, never executed
        refused = [
            await cp.call("POST", "/v1/tenants", operator=True, json={"id": evil}),
            await cp.call("POST", "/v1/tenants", operator=True, json={"id": f"e2vil-{i}", "plan": evil}),
            await cp.call("POST", "/v1/tenants/acme/topics", token=admin, json={"name": evil}),
            await cp.call("POST", "/v1/tenants/acme/topics", token=admin, json={"name": "ok", "message_type": evil}),
            await cp.call("POST", "/v1/tenants/acme/groups", token=admin, json={"name": evil}),
            await cp.call("POST", "/v1/tenants/acme/groups", token=admin, json={"name": "ok", "retry_policy": evil}),
            await cp.call(
                "POST",
                "/v1/fleet/broker-groups",
                operator=True,
                json={"name": evil, "max_queues": 1, "max_msgs_per_s": 1, "storage_bytes": 1},
            ),
            await cp.call(
                "POST",
                "/v1/fleet/broker-groups",
                operator=True,
                json={"name": "bx", "namesrv_addrs": [evil], "max_queues": 1, "max_msgs_per_s": 1, "storage_bytes": 1},
            ),
            await cp.call(
                "POST",
                "/v1/fleet/broker-groups/broker-a/hosts",
                operator=True,
                json={"broker_id": 0, "host": evil, "address": "10.0.0.1:1"},
            ),
            await cp.call(
                "PUT",
                "/v1/tenants/acme/credentials/AK1/grants",
                token=admin,
                json={"grants": [{"resource": "topic", "pattern": evil, "actions": ["publish"]}]},
            ),
            await cp.call("GET", "/v1/tenants/acme/usage?granularity=" + evil.replace("#", ""), token=admin),
            await cp.call("GET", "/v1/tenants/acme/usage?from=" + evil.replace("#", ""), token=admin),
            await cp.token_request(evil, evil),
            await cp.call(
                "POST",
                "/internal/v1/usage",
                operator=True,
                json={"records": [{"report_id": evil, "broker": "b", "tenant": "acme", "minute": 0}]},
            ),
        ]
        for reply in refused:
            assert reply.status in (400, 401, 404), reply.body
        after = await snapshot(cp)
        expected = dict(before["counts"])
        for table, added in (
            ("tenants", 1),
            ("credentials", 1),
            ("topics", 1),
            ("consumer_groups", 1),
            ("topic_placements", 1),
        ):
            expected[table] += added
        assert after["counts"] == expected
        assert after["plans"] == before["plans"]
    display = await cp.services.pool.fetchval("SELECT display_name FROM tenants WHERE id = 'evil-0'")
    assert display == INJECTIONS[0]
    nul = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "nul-byte", "display_name": "a\x00b"})
    assert nul.status == 400
    assert nul.body["error"]["details"]["field"] == "display_name"


async def test_the_openapi_document_lists_every_route(control_plane: ControlPlaneHarness) -> None:
    doc = (await control_plane.call("GET", "/openapi.json")).body
    assert doc["openapi"].startswith("3.")
    app = create_app(control_plane.settings, services=control_plane.services)
    registered = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"
        and route.resource is not None
        and not route.resource.canonical.startswith("/console")  # the web console's HTML pages: not the API
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert registered == documented
    assert len(documented) == len(ALL_ROUTES) >= 40
    for path in ("/v1/tenants/{tenant}/topics", "/oauth/token", "/.well-known/jwks.json", "/internal/v1/usage"):
        assert path in doc["paths"]
    assert (
        "topic_not_found" in doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    )
