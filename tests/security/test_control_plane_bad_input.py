"""Bad input to the control plane from outside, over HTTP: NUL characters (PostgreSQL text cannot
hold them), malformed and over-long Authorization headers, integers past what their columns
hold, and times past what the server can compute with. Each is answered 400 in the endpoint's
error shape, naming the field; none reaches PostgreSQL, none is logged with a traceback, and the
next valid request succeeds."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from control_plane.repositories.plans import LIMIT_COLUMNS
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    Reply,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.asyncio]

INTEGER_MAX = 2**31 - 1  # PostgreSQL integer
BIGINT_OVER = 2**63  # one past PostgreSQL bigint
GRANT = "client_credentials"
VALID_LIMITS = {
    "publish_msgs_per_s": 10,
    "publish_bytes_per_s": 10,
    "consume_msgs_per_s": 10,
    "consume_bytes_per_s": 10,
    "max_topics": 10,
    "max_queues": 100,
    "storage_bytes": 10,
    "max_retention_hours": 24,
    "max_tiered_bytes": 10,
}
INTEGER_LIMITS = (
    "max_topics",
    "max_queues",
    "max_retention_hours",
    "max_connections",
    "max_inflight_requests",
)  # `integer` columns
BIGINT_LIMITS = tuple(f for f in VALID_LIMITS if f not in INTEGER_LIMITS)  # `bigint` columns


def api_refused(reply: Reply, field: str, what: object = "") -> None:
    """400 in the API's error shape, naming ``field``."""
    assert reply.status == 400, (field, what, reply.status, reply.body)
    error = reply.body["error"]
    assert error["code"] == "invalid_field", (field, what, reply.body)
    assert field in error["details"]["field"], (field, what, reply.body)
    assert field in error["message"], (field, what, reply.body)


def oauth_refused(reply: Reply, field: str, what: object = "") -> None:
    """400 in OAuth's error shape (RFC 6749 §5.2), naming ``field``."""
    assert reply.status == 400, (field, what, reply.status, reply.body)
    assert reply.body["error"] == "invalid_request", (field, what, reply.body)
    assert field in reply.body["error_description"], (field, what, reply.body)


async def still_healthy(cp: ControlPlaneHarness, caplog: pytest.LogCaptureFixture) -> None:
    """The server answers valid requests and logged no error or traceback."""
    assert (await cp.call("GET", "/healthz")).status == 200
    assert (await cp.call("GET", "/v1/tenants", operator=True)).status == 200
    logged = [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    assert not logged, [f"{r.name}: {r.getMessage()}" for r in logged]


async def raw_request(
    cp: ControlPlaneHarness, method: str, path: bytes, headers: dict[str, bytes], body: bytes = b""
) -> Reply:
    """One request written byte for byte, so headers may hold bytes no HTTP client would send."""
    url = urlsplit(cp.url)
    assert url.hostname is not None
    assert url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: " + url.netloc.encode(), b"Connection: close"]
        lines += [name.encode() + b": " + value for name, value in headers.items()]
        lines.append(b"Content-Length: " + str(len(body)).encode())
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    sent = dict(line.split(": ", 1) for line in header_lines)
    is_json = sent.get("Content-Type", "").startswith("application/json")
    return Reply(int(status_line.split(" ")[1]), orjson.loads(payload) if is_json else payload, sent)


@pytest.fixture(autouse=True)
def _capture_warnings_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)


async def test_the_token_endpoint_refuses_nul_and_over_long_client_credentials_in_every_encoding(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    cred, _ = await cp.new_tenant("acme")
    ak, secret = cred["access_key"], cred["secret"]
    cases = [
        ("client_id", ak + "\x00", secret),
        ("client_id", "\x00", secret),
        ("client_id", "A" * 65, secret),
        ("client_secret", ak, secret + "\x00"),
        ("client_secret", ak, "s" * 257),
    ]
    for field, client_id, client_secret in cases:
        form = {"grant_type": GRANT, "client_id": client_id, "client_secret": client_secret}
        basic = base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
        for encoding, reply in (
            ("form", await cp.call("POST", "/oauth/token", data=form)),
            ("json", await cp.call("POST", "/oauth/token", json=form)),
            (
                "basic",
                await cp.call(
                    "POST", "/oauth/token", data={"grant_type": GRANT}, headers={"Authorization": f"Basic {basic}"}
                ),
            ),
        ):
            oauth_refused(reply, field, (encoding, client_id[:70]))
            assert reply.headers["Cache-Control"] == "no-store"
    assert (await cp.token_request(ak, secret)).status == 200
    await still_healthy(cp, caplog)


async def test_malformed_basic_authorization_is_refused_as_a_bad_request(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    form = {"Content-Type": b"application/x-www-form-urlencoded"}
    for value in (
        b"Basic \xff\xfe",  # not UTF-8
        "Basic \u00e9t\u00e9".encode(),  # UTF-8, but not base64
        b"Basic !!!!",
        b"Basic " + base64.b64encode(b"\xff\xfe:secret"),  # decodes to bytes that are not UTF-8
    ):
        headers = {**form, "Authorization": value}
        reply = await raw_request(cp, "POST", b"/oauth/token", headers, b"grant_type=client_credentials")
        oauth_refused(reply, "Authorization", value)
    await still_healthy(cp, caplog)


async def test_malformed_and_over_long_bearer_tokens_are_refused_naming_the_header(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    await cp.new_tenant("acme")
    bad_tokens = [
        b"\xff\xfe\xfd",  # not UTF-8
        cp.operator_token.encode() + b"\xff",
        "\u00e9.\u00e9.\u00e9".encode(),  # UTF-8, but not token characters
        b"a" * 8193,  # past the token limit, within the server's header limit
        b"a" * 16000,
    ]
    paths = [b"/v1/tenants", b"/v1/tenants/acme/topics", b"/v1/endpoints", b"/internal/v1/ha/heartbeat"]
    for token in bad_tokens:
        for path in paths:
            method = "POST" if path.startswith(b"/internal/") else "GET"
            reply = await raw_request(cp, method, path, {"Authorization": b"Bearer " + token})
            api_refused(reply, "Authorization", (path, token[:40]))
            assert token not in orjson.dumps(reply.body)  # the answer never echoes the token
    await still_healthy(cp, caplog)


async def test_nul_in_a_header_is_refused_before_the_app_sees_it(control_plane: ControlPlaneHarness) -> None:
    """aiohttp's parser refuses control characters in header values with its own 400 (and logs
    it); the app never sees them. The server stays up."""
    cp = control_plane
    reply = await raw_request(cp, "GET", b"/v1/tenants", {"Authorization": b"Bearer a\x00b"})
    assert reply.status == 400
    assert (await cp.call("GET", "/healthz")).status == 200
    assert (await cp.call("GET", "/v1/tenants", operator=True)).status == 200


async def test_nul_in_names_text_paths_and_queries_is_refused_naming_the_field(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    broker = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    broker_token = await cp.token_for(broker.body["access_key"], broker.body["secret"])
    nul = "a\x00b"
    record = {"report_id": "r1", "broker": "broker-a", "tenant": "acme", "minute": 0}
    heartbeat = {"cluster": "c1", "broker_name": "broker-y", "member_id": 0, "addr": "127.0.0.1:1",
                 "max_offset": 0, "epoch": 0, "lease_s": 5}  # fmt: skip
    group = {"name": "bx", "max_queues": 1, "max_msgs_per_s": 1, "storage_bytes": 1}
    cases: list[tuple[str, str, str, dict[str, Any] | None, str | None]] = [
        # (field, method, path, JSON body, token: None = operator)
        ("id", "POST", "/v1/tenants", {"id": nul}, None),
        ("display_name", "POST", "/v1/tenants", {"id": "beta", "display_name": nul}, None),
        ("plan", "POST", "/v1/tenants", {"id": "beta", "plan": nul}, None),
        ("display_name", "PATCH", "/v1/tenants/acme", {"display_name": nul}, None),
        ("tenant", "GET", "/v1/tenants/ac%00me", None, None),
        ("tenant", "GET", "/v1/tenants/acme%00/topics", None, admin),
        ("plan", "GET", "/v1/plans/fr%00ee", None, None),
        ("name", "POST", "/v1/tenants/acme/topics", {"name": nul}, admin),
        ("description", "POST", "/v1/tenants/acme/topics", {"name": "t1", "description": nul}, admin),
        ("message_type", "POST", "/v1/tenants/acme/topics", {"name": "t1", "message_type": "NORMAL\x00"}, admin),
        ("name", "GET", "/v1/tenants/acme/topics/t%00", None, admin),
        ("name", "POST", "/v1/tenants/acme/groups", {"name": nul}, admin),
        ("description", "POST", "/v1/tenants/acme/groups", {"name": "g1", "description": nul}, admin),
        ("name", "DELETE", "/v1/tenants/acme/groups/g%00", None, admin),
        ("description", "POST", "/v1/tenants/acme/credentials", {"description": nul}, admin),
        (
            "grants[0].pattern",
            "POST",
            "/v1/tenants/acme/credentials",
            {"grants": [{"resource": "topic", "pattern": nul, "actions": ["publish"]}]},
            admin,
        ),
        ("access_key", "DELETE", "/v1/tenants/acme/credentials/AK%00", None, admin),
        ("description", "POST", "/v1/admin/credentials", {"role": "broker", "description": nul}, None),
        ("name", "POST", "/v1/fleet/broker-groups", {**group, "name": nul}, None),
        ("namesrv_addrs[0]", "POST", "/v1/fleet/broker-groups", {**group, "namesrv_addrs": [nul]}, None),
        ("group", "GET", "/v1/fleet/broker-groups/broker%00", None, None),
        (
            "host",
            "POST",
            "/v1/fleet/broker-groups/broker-a/hosts",
            {"broker_id": 0, "host": nul, "address": "10.0.0.1:1"},
            None,
        ),
        ("granularity", "GET", "/v1/tenants/acme/usage?granularity=hour%00", None, admin),
        ("from", "GET", "/v1/tenants/acme/usage?from=2024-01-01%00", None, admin),
        ("to", "GET", "/v1/tenants/acme/usage?to=%00", None, admin),
        ("report_id", "POST", "/internal/v1/usage", {"records": [{**record, "report_id": nul}]}, broker_token),
        ("broker", "POST", "/internal/v1/usage", {"records": [{**record, "broker": nul}]}, broker_token),
        ("minute", "POST", "/internal/v1/usage", {"records": [{**record, "minute": nul}]}, broker_token),
        ("cluster", "POST", "/internal/v1/ha/heartbeat", {**heartbeat, "cluster": nul}, broker_token),
        ("addr", "POST", "/internal/v1/ha/heartbeat", {**heartbeat, "addr": nul}, broker_token),
    ]
    for field, method, path, body, token in cases:
        reply = await cp.call(method, path, json=body, token=token, operator=token is None)
        api_refused(reply, field, (method, path, body))
    key = await cp.call("POST", "/v1/tenants", operator=True, json={"id": "beta", "a\x00b": 1})
    assert key.status == 400, key.body
    deep = b"[" * 1000 + b'"a\\u0000b"' + b"]" * 1000  # deeper than Python's recursion limit
    raw = b'{"id": "beta", "display_name": ' + deep + b"}"
    json_type = {"Content-Type": "application/json"}
    nested = await cp.call("POST", "/v1/tenants", operator=True, data=raw, headers=json_type)
    api_refused(nested, "display_name")
    assert await cp.services.pool.fetchval("SELECT count(*) FROM tenants") == 1
    assert await cp.services.pool.fetchval("SELECT count(*) FROM topics") == 0
    await still_healthy(cp, caplog)


def integer_cases(topic: str, group: str) -> list[tuple[str, int, str, str, dict[str, Any]]]:
    """(field, value, method, path, body) for every integer the API takes, at one past what its
    column holds and at -1: (2**31 for `integer` columns, 2**63 for `bigint` ones)."""
    heartbeat = {"cluster": "c1", "broker_name": "broker-y", "member_id": 0, "addr": "127.0.0.1:1",
                 "max_offset": 0, "epoch": 0, "lease_s": 5}  # fmt: skip
    record = {"report_id": "r1", "broker": "broker-a", "tenant": "acme", "minute": 0}
    new_group = {"name": "bx", "max_queues": 1, "max_msgs_per_s": 1, "storage_bytes": 1}
    t, g = f"/v1/tenants/acme/topics/{topic}", f"/v1/tenants/acme/groups/{group}"
    cases: list[tuple[str, int, str, str, dict[str, Any]]] = []
    for value in (2**31, -1):
        for f in INTEGER_LIMITS:
            cases.append((f, value, "PUT", "/v1/plans/big", {**VALID_LIMITS, f: value}))
            cases.append((f, value, "PUT", "/v1/tenants/acme/quota", {f: value}))
        for f in ("retention_hours", "local_retention_hours", "throughput_hint_msgs_per_s"):
            cases.append((f, value, "POST", "/v1/tenants/acme/topics", {"name": "t2", f: value}))
            cases.append((f, value, "PATCH", t, {f: value}))
        for f in ("fixed_interval_ms", "max_retries"):
            cases.append((f, value, "POST", "/v1/tenants/acme/groups", {"name": "g2", f: value}))
            cases.append((f, value, "PATCH", g, {f: value}))
        cases.append(("max_queues", value, "POST", "/v1/fleet/broker-groups", {**new_group, "max_queues": value}))
        cases.append(("max_queues", value, "PATCH", "/v1/fleet/broker-groups/broker-a", {"max_queues": value}))
        host = {"broker_id": value, "host": "h1", "address": "10.0.0.1:1"}
        cases.append(("broker_id", value, "POST", "/v1/fleet/broker-groups/broker-a/hosts", host))
        cases.append(("member_id", value, "POST", "/internal/v1/ha/heartbeat", {**heartbeat, "member_id": value}))
    for value in (BIGINT_OVER, -1):
        for f in BIGINT_LIMITS:
            cases.append((f, value, "PUT", "/v1/plans/big", {**VALID_LIMITS, f: value}))
            cases.append((f, value, "PUT", "/v1/tenants/acme/quota", {f: value}))
        for f in ("max_msgs_per_s", "storage_bytes"):
            cases.append((f, value, "POST", "/v1/fleet/broker-groups", {**new_group, f: value}))
            cases.append((f, value, "PATCH", "/v1/fleet/broker-groups/broker-a", {f: value}))
        for f in ("max_offset", "epoch", "lag_bytes"):
            cases.append((f, value, "POST", "/internal/v1/ha/heartbeat", {**heartbeat, f: value}))
        usage_counters = ("messages_in", "messages_out", "throttled_requests")
        for f in ("requests_4k", "bytes_in", "bytes_out", "stored_bytes", "tiered_bytes", *usage_counters):
            cases.append((f, value, "POST", "/internal/v1/usage", {"records": [{**record, f: value}]}))
    return cases


async def test_every_integer_past_its_column_or_negative_is_refused_naming_the_field(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    assert (await cp.call("POST", "/v1/tenants/acme/topics", token=admin, json={"name": "t1"})).status == 201
    assert (await cp.call("POST", "/v1/tenants/acme/groups", token=admin, json={"name": "g1"})).status == 201
    before = {
        "plans": [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM plans ORDER BY name")],
        "topics": [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM topics")],
        "groups": [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM consumer_groups")],
    }
    for field, value, method, path, body in integer_cases("t1", "g1"):
        admin_route = path.startswith("/v1/tenants/acme/") and not path.endswith("/quota")
        token = admin if admin_route else None
        reply = await cp.call(method, path, json=body, token=token, operator=token is None)
        api_refused(reply, field, (method, path, value))
    after = {
        "plans": [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM plans ORDER BY name")],
        "topics": [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM topics")],
        "groups": [dict(r) for r in await cp.services.pool.fetch("SELECT * FROM consumer_groups")],
    }
    assert after == before
    await still_healthy(cp, caplog)


async def test_plan_and_quota_limits_take_exactly_what_their_columns_hold(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """The validator's bound is the column's: the largest `integer` is stored, one more is refused."""
    cp = control_plane
    await cp.new_tenant("acme")
    largest = {**VALID_LIMITS, **dict.fromkeys(INTEGER_LIMITS, INTEGER_MAX)}
    plan = await cp.call("PUT", "/v1/plans/big", operator=True, json=largest)
    assert plan.status == 201, plan.body
    assert {f: plan.body[f] for f in INTEGER_LIMITS} == dict.fromkeys(INTEGER_LIMITS, INTEGER_MAX)
    quota = await cp.call(
        "PUT", "/v1/tenants/acme/quota", operator=True, json=dict.fromkeys(INTEGER_LIMITS, INTEGER_MAX)
    )
    assert quota.status == 200, quota.body
    assert quota.body["effective"]["max_queues"] == INTEGER_MAX
    for f in INTEGER_LIMITS:
        api_refused(await cp.call("PUT", "/v1/plans/big", operator=True, json={**largest, f: INTEGER_MAX + 1}), f)
        api_refused(await cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={f: INTEGER_MAX + 1}), f)
    columns = await cp.services.pool.fetch(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
        " WHERE table_name IN ('plans', 'quota_overrides') AND column_name = ANY($1::text[])",
        list(LIMIT_COLUMNS),
    )
    assert len(columns) == 2 * len(LIMIT_COLUMNS)
    for c in columns:  # the validator's idea of each column is the migrations'
        assert c["data_type"] == LIMIT_COLUMNS[c["column_name"]], dict(c)
        assert (c["column_name"] in INTEGER_LIMITS) == (c["data_type"] == "integer"), dict(c)
    stored = await cp.services.pool.fetchrow("SELECT * FROM plans WHERE name = 'big'")
    assert stored is not None
    assert stored["max_topics"] == INTEGER_MAX
    await still_healthy(cp, caplog)


async def test_times_past_the_calendar_are_refused_naming_the_field(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    broker = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    broker_token = await cp.token_for(broker.body["access_key"], broker.body["secret"])
    for query, field in (
        ("to=0001-01-01T00:00:00Z", "to"),
        ("to=0001-01-01T00:00:00%2B14:00", "to"),
        ("from=9999-12-31T23:59:59-12:00", "from"),
    ):
        api_refused(await cp.call("GET", f"/v1/tenants/acme/usage?{query}", token=admin), field, query)
    record = {"report_id": "r1", "broker": "broker-a", "tenant": "acme"}
    for minute in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-12:00", 2**48 - 1):
        body = {"records": [{**record, "minute": minute}]}
        api_refused(await cp.call("POST", "/internal/v1/usage", token=broker_token, json=body), "minute", minute)
    assert await cp.services.pool.fetchval("SELECT count(*) FROM usage_records") == 0
    await still_healthy(cp, caplog)
