"""The web console over plain HTTP (no browser): its security promises — CSRF tokens, the
Content-Security-Policy, the session cookie's flags, expiry, sign-out, one tenant's session
kept out of another's pages — and that its forms change what the API shows."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from control_plane import db
from control_plane.app import create_app
from control_plane.console.render import CSP
from control_plane.services import Services
from data_plane.tls import CA_FILE, CERT_FILE, KEY_FILE, ServerTls, client_context, make_local_ca
from tests.integration.console_support import ConsoleClient, FormFields
from tests.integration.load_support import reported_empty, send, stored_backlog, taker
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture  # noqa: F401
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    make_settings,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest_asyncio.fixture(name="console")
async def console_fixture(control_plane: ControlPlaneHarness) -> AsyncIterator[ConsoleClient]:
    client = ConsoleClient(control_plane.url)
    yield client
    await client.close()


async def signed_in_tenant(cp: ControlPlaneHarness, console: ConsoleClient, tenant: str) -> dict[str, str]:
    made, _token = await cp.new_tenant(tenant)
    page = await console.sign_in(made["access_key"], made["secret"])
    assert page.status == 303, page.text
    return {"access_key": made["access_key"], "secret": made["secret"]}


async def test_signing_in_sets_an_httponly_strict_session_cookie_for_the_console_only(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    made, _ = await control_plane.new_tenant("acme")
    page = await console.sign_in(made["access_key"], made["secret"])
    assert (page.status, page.location) == (303, "/console/")
    session = page.set_cookies["orbit_session"]
    assert session["httponly"] is True
    assert session["samesite"] == "Strict"
    assert session["path"] == "/console/"
    assert not session["secure"]  # plain HTTP here; Secure whenever the control plane serves HTTPS
    assert int(session["max-age"]) == control_plane.settings.token_lifetime_s
    home = await console.get("/console/")
    assert (home.status, home.location) == (303, "/console/t/acme/topics")
    topics = await console.get("/console/t/acme/topics")
    assert topics.status == 200
    assert made["secret"] not in topics.text


async def test_signing_in_goes_back_to_a_console_page_and_nowhere_else(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    made, _ = await control_plane.new_tenant("acme")
    for target, lands in (("/console/t/acme/groups", "/console/t/acme/groups"), ("https://evil.example/", "/console/"),
                          ("//evil.example/console/", "/console/")):  # fmt: skip
        form = await console.get("/console/sign-in")
        fields = {"client_id": made["access_key"], "client_secret": made["secret"], "next": target}
        page = await console.post("/console/sign-in", fields, csrf=form.csrf)
        assert (page.status, page.location) == (303, lands), target


async def test_under_tls_the_session_cookie_is_secure(postgres_dsn: str, tmp_path: Path) -> None:
    files = make_local_ca(str(tmp_path / "tls"))
    server_tls = ServerTls("enforcing", files[CERT_FILE], files[KEY_FILE]).context()
    settings = make_settings(postgres_dsn, tmp_path)
    pool = await db.create_pool(settings.database_url, min_size=1, max_size=2)
    runner: web.AppRunner | None = None
    try:
        services = Services.create(pool, settings)
        await services.start()
        runner = web.AppRunner(create_app(settings, services=services))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls).start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}"
        operator = orjson.loads(await asyncio.to_thread(Path(settings.bootstrap_credentials_file).read_bytes))
        console = ConsoleClient(url, ssl_context=client_context(ca_file=files[CA_FILE]))
        try:
            page = await console.sign_in(operator["access_key"], operator["secret"])
            assert page.status == 303
            session = page.set_cookies["orbit_session"]
            assert session["secure"] is True
            assert session["httponly"] is True
            assert session["samesite"] == "Strict"
        finally:
            await console.close()
    finally:
        if runner is not None:
            await runner.cleanup()
        await pool.close()


async def test_a_wrong_secret_is_refused_with_a_message_and_no_session(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    made, _ = await control_plane.new_tenant("acme")
    page = await console.sign_in(made["access_key"], "not-the-secret")
    assert page.status == 401
    assert "wrong secret" in page.text
    assert "orbit_session" not in page.set_cookies


async def test_failed_sign_ins_are_limited_as_the_token_endpoints_are(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    made, _ = await control_plane.new_tenant("acme")
    for _ in range(10):  # the limiter's failures per address
        assert (await console.sign_in(made["access_key"], "guess")).status == 401
    held = await console.sign_in(made["access_key"], made["secret"])
    assert held.status == 429
    assert "Too many failed sign-ins" in held.text
    # The same limiter as POST /oauth/token's: that answers 429 too.
    assert (await control_plane.token_request(made["access_key"], made["secret"])).status == 429


async def test_every_page_carries_a_strict_content_security_policy(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    assert "script-src 'self'" in CSP
    assert "unsafe-inline" not in CSP
    assert "frame-ancestors 'none'" in CSP
    await control_plane.new_broker_group("broker-a")
    await signed_in_tenant(control_plane, console, "acme")
    for path in ("/console/sign-in", "/console/t/acme/topics", "/console/t/acme/groups", "/console/t/acme/usage",
                 "/console/t/acme/credentials", "/console/t/beta/topics"):  # fmt: skip
        page = await console.get(path)
        assert page.headers["Content-Security-Policy"] == CSP, path
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert page.headers["Cache-Control"] == "no-store"
        assert "<script>" not in page.text
        assert " on" + "click=" not in page.text
    asset = await console.get("/console/static/console.js")
    assert asset.status == 200
    assert asset.headers["Content-Type"].startswith(("application/javascript", "text/javascript"))


async def test_every_form_field_has_a_label(control_plane: ControlPlaneHarness, console: ConsoleClient) -> None:
    cp = control_plane
    await cp.new_broker_group("broker-a")
    await signed_in_tenant(cp, console, "acme")
    assert (await cp.call("POST", "/v1/tenants/acme/topics", operator=True, json={"name": "orders"})).status == 201
    assert (await cp.call("POST", "/v1/tenants/acme/groups", operator=True, json={"name": "billing"})).status == 201
    pages = ["/console/t/acme/topics", "/console/t/acme/topics/orders/delete", "/console/t/acme/groups",
             "/console/t/acme/messages", "/console/t/acme/credentials", "/console/t/acme/usage"]  # fmt: skip
    operator = ConsoleClient(cp.url)
    try:
        assert (await operator.sign_in(cp.operator_access_key, cp.operator_secret)).status == 303
        ops_pages = ["/console/ops/tenants", "/console/ops/tenants/acme", "/console/ops/plans",
                     "/console/ops/plans/standard"]  # fmt: skip
        for client, paths in ((console, pages), (operator, ops_pages)):
            for path in paths:
                page = await client.get(path)
                assert page.status == 200, path
                assert FormFields().unlabelled(page.text) == [], path
        signed_out = ConsoleClient(cp.url)
        try:
            assert FormFields().unlabelled((await signed_out.get("/console/sign-in")).text) == []
        finally:
            await signed_out.close()
    finally:
        await operator.close()


async def test_a_post_without_the_pages_csrf_token_changes_nothing(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    await control_plane.new_broker_group("broker-a")
    await signed_in_tenant(control_plane, console, "acme")
    missing = await console.post("/console/t/acme/topics", {"name": "orders"}, csrf=None)
    assert missing.status == 403
    assert "CSRF" in missing.text
    forged = await console.post("/console/t/acme/topics", {"name": "orders"}, csrf="0" * 64)
    assert forged.status == 403
    listed = await control_plane.call("GET", "/v1/tenants/acme/topics", operator=True)
    assert listed.body["topics"] == []
    # The sign-in form has its own token, bound to a nonce cookie.
    fresh = ConsoleClient(control_plane.url)
    try:
        refused = await fresh.post("/console/sign-in", {"client_id": "AKX", "client_secret": "x"}, csrf="f" * 64)
        assert refused.status == 403
    finally:
        await fresh.close()


async def test_forms_create_and_delete_a_topic_and_a_group_through_the_api(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    await control_plane.new_broker_group("broker-a")
    await signed_in_tenant(control_plane, console, "acme")
    made = await console.submit(
        "/console/t/acme/topics",
        "/console/t/acme/topics",
        {"name": "orders", "message_type": "FIFO", "throughput_hint_msgs_per_s": "9000", "retention_hours": "24"},
    )
    assert (made.status, made.location) == (303, "/console/t/acme/topics/orders")
    topic = (await control_plane.call("GET", "/v1/tenants/acme/topics/orders", operator=True)).body
    assert (topic["message_type"], topic["retention_hours"]) == ("FIFO", 24)
    assert sum(p["queue_count"] for p in topic["placements"]) == 9
    shown = await console.get("/console/t/acme/topics/orders")
    assert "Topic orders created with 9 queues." in shown.text
    assert "broker-a" in shown.text  # its queue placement
    bad = await console.submit("/console/t/acme/topics", "/console/t/acme/topics", {"name": "no spaces"})
    assert bad.status == 400
    assert "name" in bad.text
    too_long = await console.submit(
        "/console/t/acme/topics", "/console/t/acme/topics", {"name": "x", "retention_hours": "99999"}
    )
    assert too_long.status == 400
    assert "retention_hours" in too_long.text
    group = await console.submit(
        "/console/t/acme/groups", "/console/t/acme/groups", {"name": "billing", "max_retries": "3"}
    )
    assert group.status == 303
    got = (await control_plane.call("GET", "/v1/tenants/acme/groups/billing", operator=True)).body
    assert got["max_retries"] == 3
    # Deleting asks for the name again.
    confirm = "/console/t/acme/topics/orders/delete"
    wrong = await console.submit(confirm, confirm, {"confirm_name": "order"})
    assert wrong.status == 400
    assert (await control_plane.call("GET", "/v1/tenants/acme/topics/orders", operator=True)).status == 200
    deleted = await console.submit(confirm, confirm, {"confirm_name": "orders"})
    assert (deleted.status, deleted.location) == (303, "/console/t/acme/topics")
    assert (await control_plane.call("GET", "/v1/tenants/acme/topics/orders", operator=True)).status == 404


async def test_a_tenants_session_is_refused_on_another_tenants_pages_and_on_operator_pages(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    await control_plane.new_broker_group("broker-a")
    await control_plane.new_tenant("beta")
    beta_topic = await control_plane.call("POST", "/v1/tenants/beta/topics", operator=True, json={"name": "loot"})
    assert beta_topic.status == 201
    await signed_in_tenant(control_plane, console, "acme")
    for path in ("/console/t/beta/topics", "/console/t/beta/topics/loot", "/console/t/beta/groups",
                 "/console/t/beta/credentials", "/console/t/beta/usage", "/console/t/beta/messages",
                 "/console/ops/tenants", "/console/ops/fleet", "/console/ops/tenants/beta"):  # fmt: skip
        page = await console.get(path)
        assert page.status == 403, path
        assert "loot" not in page.text
    own = await console.get("/console/t/acme/topics")
    deleted = await console.post("/console/t/beta/topics/loot/delete", {"confirm_name": "loot"}, csrf=own.csrf)
    assert deleted.status == 403
    suspended = await console.post("/console/ops/tenants/beta/suspend", {}, csrf=own.csrf)
    assert suspended.status == 403
    assert (await control_plane.call("GET", "/v1/tenants/beta/topics/loot", operator=True)).status == 200
    assert (await control_plane.call("GET", "/v1/tenants/beta", operator=True)).body["status"] == "active"


async def test_an_expired_session_goes_back_to_sign_in_and_loses_its_cookie(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    creds = await signed_in_tenant(control_plane, console, "acme")
    tokens = control_plane.services.tokens
    real_clock = tokens.clock_s
    tokens.clock_s = lambda: time.time() - 2 * control_plane.settings.token_lifetime_s
    try:
        old, _ = await control_plane.services.credentials.login(creds["access_key"], creds["secret"])
    finally:
        tokens.clock_s = real_clock
    console.set_cookie("orbit_session", old)
    page = await console.get("/console/t/acme/topics")
    assert page.status == 303
    assert page.location.startswith("/console/sign-in?next=")
    assert page.set_cookies["orbit_session"].value == ""  # cleared
    again = await console.get(page.location)
    assert "Your session has ended" in again.text


async def test_signing_out_clears_the_session(control_plane: ControlPlaneHarness, console: ConsoleClient) -> None:
    await signed_in_tenant(control_plane, console, "acme")
    topics = await console.get("/console/t/acme/topics")
    out = await console.post("/console/sign-out", {}, csrf=topics.csrf)
    assert (out.status, out.location) == (303, "/console/sign-in")
    assert out.set_cookies["orbit_session"].value == ""
    assert console.cookie("orbit_session") in (None, "")
    after = await console.get("/console/t/acme/topics")
    assert after.status == 303
    assert after.location.startswith("/console/sign-in")


async def test_a_credentials_secret_is_shown_once_and_revoking_it_ends_its_sessions(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    await signed_in_tenant(control_plane, console, "acme")
    made = await console.submit(
        "/console/t/acme/credentials",
        "/console/t/acme/credentials",
        {"description": "billing service", "grants": "topic orders publish\ngroup billing subscribe"},
    )
    assert made.status == 200
    assert made.headers["Cache-Control"] == "no-store"
    access_key = made.text.split('id="new-access-key">')[1].split("<")[0]
    secret = made.text.split('id="new-secret">')[1].split("<")[0]
    listed = await console.get("/console/t/acme/credentials")
    assert access_key in listed.text
    assert secret not in listed.text
    got = (await control_plane.call("GET", "/v1/tenants/acme/credentials", operator=True)).body["credentials"]
    (new,) = [c for c in got if c["access_key"] == access_key]
    assert sorted((g["resource"], g["pattern"], tuple(g["actions"])) for g in new["grants"]) == [
        ("group", "billing", ("subscribe",)),
        ("topic", "orders", ("publish",)),
    ]
    other = ConsoleClient(control_plane.url)
    try:
        assert (await other.sign_in(access_key, secret)).status == 303
        # A publish-only credential sees only what its grants cover, and no credentials page.
        assert (await other.get("/console/t/acme/credentials")).status == 403
        revoked = await console.submit(
            "/console/t/acme/credentials", f"/console/t/acme/credentials/{access_key}/revoke", {}
        )
        assert revoked.status == 303
        after = await other.get("/console/t/acme/topics")
        assert after.status == 303
        assert after.location.startswith("/console/sign-in")
    finally:
        await other.close()


async def test_an_operator_creates_suspends_and_resumes_a_tenant(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    cp = control_plane
    assert (await console.sign_in(cp.operator_access_key, cp.operator_secret)).status == 303
    assert (await console.get("/console/")).location == "/console/ops/tenants"
    made = await console.submit("/console/ops/tenants", "/console/ops/tenants", {"id": "gamma", "plan": "standard"})
    assert (made.status, made.location) == (303, "/console/ops/tenants/gamma")
    cred = (await cp.call("POST", "/v1/tenants/gamma/credentials", operator=True, json={})).body
    tenant_console = ConsoleClient(cp.url)
    try:
        assert (await tenant_console.sign_in(cred["access_key"], cred["secret"])).status == 303
        page = "/console/ops/tenants/gamma"
        assert (await console.submit(page, page + "/suspend", {})).status == 303
        assert (await cp.call("GET", "/v1/tenants/gamma", operator=True)).body["status"] == "suspended"
        refused = await tenant_console.get("/console/t/gamma/topics")  # the API's check, at once
        assert refused.status == 403
        assert "suspended" in refused.text
        assert (await console.submit(page, page + "/resume", {})).status == 303
        assert (await console.submit(page, page + "/plan", {"plan": "free"})).status == 303
        quota = await console.submit(page, page + "/quota", {"max_topics": "7", "unlimited_retention": ""})
        assert quota.status == 303
        got = (await cp.call("GET", "/v1/tenants/gamma/quota", operator=True)).body
        assert (got["plan"], got["effective"]["max_topics"]) == ("free", 7)
        assert (await cp.call("GET", "/v1/tenants/gamma", operator=True)).body["status"] == "active"
    finally:
        await tenant_console.close()
    for path in ("/console/ops/plans", "/console/ops/fleet", "/console/t/gamma/topics"):
        assert (await console.get(path)).status == 200, path


async def test_an_operator_creates_and_changes_a_plan(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    cp = control_plane
    assert (await console.sign_in(cp.operator_access_key, cp.operator_secret)).status == 303
    opened = await console.get("/console/ops/new-plan?name=gold")
    assert (opened.status, opened.location) == (303, "/console/ops/plans/gold")
    limits = {"publish_msgs_per_s": "10", "publish_bytes_per_s": "1000", "consume_msgs_per_s": "20",
              "consume_bytes_per_s": "2000", "max_topics": "3", "max_queues": "12", "storage_bytes": "10000",
              "max_retention_hours": "2", "unlimited_retention": "false"}  # fmt: skip
    page = "/console/ops/plans/gold"
    missing = await console.submit(page, page, {k: v for k, v in limits.items() if k != "max_topics"})
    assert missing.status == 400
    assert "max_topics" in missing.text
    made = await console.submit(page, page, limits)
    assert (made.status, made.location) == (303, "/console/ops/plans")
    got = (await cp.call("GET", "/v1/plans/gold", operator=True)).body
    assert (got["max_topics"], got["max_connections"], got["max_tiered_bytes"]) == (3, 1000, None)
    changed = await console.submit(page, page, {**limits, "max_topics": "5", "unlimited_retention": "true"})
    assert changed.status == 303
    got = (await cp.call("GET", "/v1/plans/gold", operator=True)).body
    assert (got["max_topics"], got["unlimited_retention"]) == (5, True)
    assert "gold" in (await console.get("/console/ops/plans")).text


def figure(page_text: str, field: str) -> str:
    """The usage page's figure of ``field``: its caption, chart and table of figures."""
    found = re.search(rf'<figure id="chart-{field}">(.*?)</figure>', page_text, re.S)
    assert found is not None, f"no chart of {field}"
    return found.group(1)


async def test_the_usage_page_charts_messages_and_throttled_requests_with_their_totals(
    control_plane: ControlPlaneHarness, console: ConsoleClient
) -> None:
    cp = control_plane
    await signed_in_tenant(cp, console, "acme")
    await cp.new_tenant("beta")
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    broker = await cp.token_for(made.body["access_key"], made.body["secret"])
    now_ms = int(time.time() * 1000)
    records = [
        {"report_id": f"r-{i}", "broker": "broker-a", "tenant": tenant, "minute": now_ms - ago_min * 60_000,
         "requests_4k": 1, "bytes_in": 0, "bytes_out": 0, "stored_bytes": 0, **counts}
        for i, (tenant, ago_min, counts) in enumerate([
            ("acme", 5, {"messages_in": 10, "messages_out": 4, "throttled_requests": 2}),
            ("acme", 3, {"messages_in": 6, "messages_out": 17, "throttled_requests": 1}),
            ("beta", 3, {"messages_in": 999, "messages_out": 999, "throttled_requests": 999}),  # not acme's
        ])
    ]  # fmt: skip
    reply = await cp.call("POST", "/internal/v1/usage", token=broker, json={"records": records})
    assert reply.body == {"accepted": 3, "duplicates": 0}
    for view in ("minute", "day"):
        page = await console.get(f"/console/t/acme/usage?view={view}")
        assert page.status == 200, page.text
        for field, title, total, peak in [
            ("messages_in", "Messages published", 16, 10 if view == "minute" else 16),
            ("messages_out", "Messages consumed", 21, 17 if view == "minute" else 21),
            ("throttled_requests", "Throttled requests", 3, 2 if view == "minute" else 3),
        ]:
            shown = figure(page.text, field)
            assert f"<figcaption>{title} <small" in shown
            assert f"total {total}</small>" in shown, (view, field, shown)
            assert f"peak {peak}" in shown  # the chart's label (its highest point)
            assert "999" not in shown
        assert '<small class="total">peak 0 B</small>' in figure(page.text, "stored_bytes")  # a gauge: its peak


async def test_the_group_page_draws_the_stored_lag_history_on_its_first_look(tenancy: TenancyCluster) -> None:
    """Nobody looked at the page while the group consumed: its first look draws the backlog and
    the consume rate from the brokers' load reports kept by the control plane, beside the live
    per-queue table; the topic's page draws its publish rate."""
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    await reported_empty(tenancy, "orders")
    await send(tenancy, acme, "orders", 20)
    async with taker(tenancy, acme, "billing", "orders") as consumer:
        await consumer.take(5)
        await stored_backlog(tenancy, acme, "billing", "orders", 15)
        await consumer.take(3)
        await stored_backlog(tenancy, acme, "billing", "orders", 12)
    console = ConsoleClient(tenancy.cp.url)
    try:
        assert (await console.sign_in(acme.access_key, acme.secret)).status == 303
        page = await console.get("/console/t/acme/groups/billing?topic=orders")
        assert page.status == 200, page.text
        assert "<strong data-total-lag>12</strong>" in page.text  # live, from the broker
        # Each minute shows its last figure: 12 now; the peak, 15 (or 20 had the consumer stored
        # its starting offsets before its first commit, and a report caught them at a minute's end).
        points, peak = chart(page.text, "Backlog of billing on orders")
        assert points >= 1
        assert 12 <= peak <= 20
        assert "Backlog of billing on orders, last hour: now 12<" in page.text
        assert chart(page.text, "Consume rate of billing on orders (messages/s)")[1] > 0
        assert re.search(r"<strong data-rate>[\d.]+</strong> messages/s", page.text)
        day = await console.get("/console/t/acme/groups/billing?topic=orders&range=day")
        assert day.status == 200
        assert 'href="/console/t/acme/groups/billing?topic=orders&amp;range=day" aria-current="page"' in day.text
        assert chart(day.text, "Backlog of billing on orders")[1] >= 12
        assert "Backlog of billing on orders, last day: now 12<" in day.text
        assert (await console.get("/console/t/acme/groups/billing?topic=orders&range=week")).status == 400
        topic = await console.get("/console/t/acme/topics/orders")
        assert chart(topic.text, "Publish rate of orders (messages/s)")[1] > 0
    finally:
        await console.close()


def chart(html: str, title: str) -> tuple[int, float]:
    """The points and the peak of the page's chart titled ``title`` (from its aria-label)."""
    found = re.search(f'aria-label="{re.escape(title)}: (\\d+) points, peak ([\\d.]+)"', html)
    assert found is not None, f"no chart {title!r} in {html}"
    return int(found[1]), float(found[2])
