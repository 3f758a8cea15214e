"""The web console in a real browser (headless Chromium, Selenium), against the real control
plane, a real name server and a real authenticating broker: a tenant signs in with the keyboard,
creates a topic and groups, produces with the SDK and watches the lag fall while a consumer
runs, finds a message by key and opens its trace, resends a dead letter, creates and revokes a
credential, and is refused another tenant's pages; then an operator looks at the fleet and
suspends a tenant. One browser for the module, one cluster for the scenario."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from selenium import webdriver

from control_plane.console.tenant_pages import CHARTED
from data_plane.dev_tenancy import DEMO_TOPIC, ControlPlaneAPI, ensure_demo
from sdk import ConsumeResult, Message, MessageExt, Producer, PushConsumer
from sdk.admin import AdminClient
from tests.integration.console_browser import Browser, start_chromium
from tests.integration.helpers import QUICK
from tests.integration.load_support import stored_backlog
from tests.integration.tenancy_cluster import (
    TenancyCluster,
    Tenant,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
SENT = 20


@pytest.fixture(scope="module", name="chromium")
def chromium_fixture() -> Iterator[webdriver.Chrome]:
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest_asyncio.fixture(name="browser")
async def browser_fixture(chromium: webdriver.Chrome, tenancy: TenancyCluster) -> AsyncIterator[Browser]:
    browser = Browser(chromium, tenancy.cp.url)
    await browser.go("/console/sign-in")
    await browser.forget_cookies()
    yield browser


async def sign_in(browser: Browser, access_key: str, secret: str) -> None:
    """With the keyboard alone: type the id, the secret, Enter."""
    await browser.go("/console/")
    assert (await browser.path()).startswith("/console/sign-in")
    await browser.type("client_id", access_key)
    await browser.type("client_secret", secret, enter=True)

    async def signed_in() -> bool:
        return not (await browser.path()).startswith("/console/sign-in")

    await until(signed_in, "the first page after signing in")


async def topic_active(tenancy: TenancyCluster, tenant: Tenant, name: str) -> None:
    async def active() -> bool:
        got = await tenancy.cp.call("GET", f"/v1/tenants/{tenant.id}/topics/{name}", token=tenant.token)
        return got.status == 200 and got.body["status"] == "active"

    await until(active, f"topic {name} active")
    await tenancy.reconciled(rounds=1)


async def group_on_broker(tenancy: TenancyCluster, tenant: Tenant, name: str) -> None:
    async def there() -> bool:
        return f"{tenant.id}%{name}" in await tenancy.broker_groups()

    await until(there, f"group {name} on the broker")


async def total_lag(browser: Browser) -> int:
    await browser.reload()
    return int(await browser.text("[data-total-lag]"))


async def demo_tenant(tenancy: TenancyCluster, tmp_path: Path) -> Tenant:
    """The demo tenant as ``orbit dev up`` makes it (its topic, group and credential)."""
    api = ControlPlaneAPI(tenancy.cp.url)
    await asyncio.to_thread(api.login, tenancy.cp.operator_access_key, tenancy.cp.operator_secret)
    demo = await asyncio.to_thread(ensure_demo, api, str(tmp_path / "demo.json"))
    return Tenant(demo.tenant, demo.access_key, demo.secret, await tenancy.cp.token_for(demo.access_key, demo.secret))


async def test_a_tenant_runs_its_queues_and_an_operator_suspends_a_tenant_from_the_console(
    tenancy: TenancyCluster, browser: Browser, tmp_path: Path
) -> None:
    """One cluster for both (starting one takes most of the time). The tenant is the demo tenant
    ``orbit dev up`` makes, signed in with the credential it prints."""
    demo = await demo_tenant(tenancy, tmp_path)
    beta = await tenancy.new_tenant("beta")
    await sign_in(browser, demo.access_key, demo.secret)
    assert await browser.path() == "/console/t/demo/topics"
    assert DEMO_TOPIC in await browser.text("#topics")  # what dev up made for it

    # A topic and two groups, through the forms.
    await browser.type("topic-name", "orders")
    await browser.type("topic-retention", "48")
    await browser.press("Create topic")
    assert await browser.path() == "/console/t/demo/topics/orders"
    assert "Topic orders created with 4 queues." in await browser.text(".flash")
    await topic_active(tenancy, demo, "orders")
    await browser.go("/console/t/demo/groups")
    await browser.type("group-name", "billing")
    await browser.press("Create group")
    await browser.go("/console/t/demo/groups")
    await browser.type("group-name", "audit")
    await browser.type("group-retries", "0")
    await browser.press("Create group")
    await group_on_broker(tenancy, demo, "billing")
    await group_on_broker(tenancy, demo, "audit")
    await browser.go("/console/t/demo/topics")
    await browser.screenshot("topics")

    # Produce with the SDK; the group's page shows the lag, then watches it fall.
    creds = demo.credentials(tenancy)
    ns = tenancy.namesrv.address
    before = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=1)
    async with Producer("demo%shop", namesrv_addrs=ns, credentials=creds) as producer:
        for i in range(SENT):
            await producer.send(Message("demo%orders", f"body-{i}".encode(), keys=f"order-{i}"))
    await browser.go("/console/t/demo/groups/billing?topic=orders")
    assert await total_lag(browser) == SENT
    consumed: list[bytes] = []

    def ok(msgs: list[MessageExt]) -> ConsumeResult:
        consumed.extend(m.body for m in msgs)
        return ConsumeResult.SUCCESS

    billing = PushConsumer("demo%billing", namesrv_addrs=ns, credentials=creds, instance_name="billing", **QUICK)
    billing.subscribe("demo%orders")
    billing.on_message(ok)
    await billing.start()
    try:
        seen_lag: list[int] = []

        async def drained() -> bool:
            seen_lag.append(await total_lag(browser))
            return seen_lag[-1] == 0

        await until(drained, "the console's lag at 0", timeout_s=30)
        # The charts: the backlog and consume rate the brokers' load reports left in the control plane.
        await stored_backlog(tenancy, demo, "billing", "orders", 0)
        await browser.reload()
        chart = await browser.attribute("svg.chart", "aria-label")
        assert chart.startswith("Backlog of billing on orders: ")
        assert (await browser.text("#consume-rate")).startswith("Consume rate: ")
        await browser.screenshot("group-lag", whole_page=True)
        assert len(consumed) >= SENT
        assert "0 consumers online" not in await browser.text("#total-lag")

        # Find a message by key, then open its trace.
        await browser.go("/console/t/demo/messages")
        await browser.choose("search-topic", "orders")
        await browser.type("search-key", "order-7", enter=True)

        async def answered() -> bool:
            return (await browser.path()).startswith("/console/t/demo/messages?")

        await until(answered, "the search's answer")
        (row,) = await browser.texts("#found tbody tr")
        assert "order-7" in row
        assert "body-7" in row
        await browser.screenshot("messages")
        msg_id = row.split()[0]
        await browser.follow(msg_id)
        assert await browser.text("h1") == f"Message {msg_id}"
        events = await browser.texts("#trace-events tbody tr")
        assert any("stored" in e for e in events), events
        await browser.screenshot("trace")
        # By the time they were stored, read through the billing group.
        after = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=1)
        span = f"from={before:%Y-%m-%dT%H:%M:%S}&to={after:%Y-%m-%dT%H:%M:%S}"
        await browser.go(f"/console/t/demo/messages?topic=orders&{span}&group=billing")
        assert await browser.text("#found caption") == f"{SENT} messages found in orders"

        # A consumer that fails one message: it goes to the dead letters (no retries), and the
        # console sends it back to the topic, where the failing consumer gets it again.
        poisoned: list[int] = []

        def fail_poison(msgs: list[MessageExt]) -> ConsumeResult:
            if any(m.body == b"poison" for m in msgs):
                poisoned.append(msgs[0].reconsume_times)
                return ConsumeResult.RECONSUME_LATER
            return ConsumeResult.SUCCESS

        audit = PushConsumer(
            "demo%audit", namesrv_addrs=ns, credentials=creds, instance_name="audit", max_reconsume_times=0, **QUICK
        )
        audit.subscribe("demo%orders")
        audit.on_message(fail_poison)
        await audit.start()
        try:
            async with Producer("demo%shop", namesrv_addrs=ns, credentials=creds) as producer:
                await producer.send(Message("demo%orders", b"poison", keys="bad"))
            await browser.go("/console/t/demo/groups/audit/dead-letters")

            async def parked() -> bool:
                await browser.reload()
                return len(await browser.texts("#dead-letters tbody input[name=msg_id]")) == 1

            await until(parked, "the poison message among audit's dead letters", timeout_s=30)
            (dead_row,) = await browser.texts("#dead-letters tbody tr")
            assert "demo%orders" in dead_row
            assert "poison" in dead_row
            await browser.screenshot("dead-letters")
            dead_id = dead_row.split()[0]
            await browser.press(f"Resend {dead_id}")
            assert "Resent 1 dead letter" in await browser.text(".flash")
            await until(lambda: len(poisoned) >= 2, "the resent message consumed again", timeout_s=30)
            # It failed again: two dead letters now; "select all" (console.js) and resend both.

            async def two_parked() -> bool:
                await browser.reload()
                return len(await browser.texts("#dead-letters tbody input[name=msg_id]")) == 2

            await until(two_parked, "the resent copy among the dead letters too", timeout_s=30)
            await browser.tick("input[data-select-all]")
            await browser.press("Resend selected")
            assert "Resent 2 dead letters" in await browser.text(".flash")
            await until(lambda: len(poisoned) >= 4, "both resent messages consumed again", timeout_s=30)
        finally:
            await audit.shutdown()
    finally:
        await billing.shutdown()

    # A credential: made with its secret shown once, then revoked; the new one works until then.
    await browser.go("/console/t/demo/credentials")
    await browser.type("cred-description", "reporting job")
    await browser.press("Create credential")
    access_key = await browser.text("#new-access-key")
    secret = await browser.text("#new-secret")
    assert len(secret) >= 32
    await browser.screenshot("credential-created")
    await browser.go("/console/t/demo/credentials")
    assert secret not in await browser.source()
    await browser.screenshot("credentials")
    async with AdminClient([ns], credentials=Tenant("demo", access_key, secret, "").credentials(tenancy)) as admin:
        assert await admin.group_progress("demo%billing", "demo%orders")
    question = await browser.press_and_confirm(f"Revoke {access_key}")
    assert question.startswith(f"Revoke {access_key}?")
    assert f"Credential {access_key} revoked." in await browser.text(".flash")
    row = await browser.text(f'tr[data-access-key="{access_key}"] .status')
    assert row == "revoked"

    # Usage and quotas render (charts as SVG).
    await browser.go("/console/t/demo/usage")
    assert len(await browser.texts("svg.chart")) == len(CHARTED)

    async def metered() -> bool:  # the broker reports usage every second here
        await browser.reload()
        published = int((await browser.text("#chart-messages_in .total")).split()[-1])
        consumed = int((await browser.text("#chart-messages_out .total")).split()[-1])
        return published >= SENT + 1 and consumed >= SENT + 1  # the orders and the poison, at least

    await until(metered, "the messages published and consumed on the usage charts", timeout_s=30)
    assert "max_topics" in await browser.text("#quotas")
    await browser.screenshot("usage", whole_page=True)

    # Another tenant's pages and resources are refused, whatever the URL says.
    for path in ("/console/t/beta/topics", "/console/t/beta/groups/thief/dead-letters", "/console/ops/tenants"):
        await browser.go(path)
        assert "forbidden" in await browser.text(".error"), path
    assert beta.id not in await browser.text("h1")

    # An operator: the tenants, the fleet as the brokers answer, a topic's placement; suspends beta.
    await tenancy.create_topic(beta, "loot")
    await browser.go("/console/t/demo/topics")
    await browser.press("Sign out")
    assert "Signed out." in await browser.text(".flash")
    cp = tenancy.cp
    await sign_in(browser, cp.operator_access_key, cp.operator_secret)
    assert await browser.path() == "/console/ops/tenants"
    assert "beta" in await browser.text("#tenants")
    await browser.screenshot("ops-tenants")
    await browser.go("/console/ops/fleet")
    brokers = await browser.texts("#brokers tbody tr")
    assert any("broker-a" in b and "MASTER" in b for b in brokers), brokers
    await browser.screenshot("ops-fleet")
    await browser.follow("broker-a")  # a group's page: its capacity, hosts and their credentials
    assert await browser.text("h1") == "Broker group broker-a"
    assert "127.0.0.1" in await browser.text("#group-hosts")
    await browser.screenshot("ops-group", whole_page=True)
    await browser.go("/console/t/beta/topics/loot")  # an operator reaches any tenant's topic: its placement
    assert "broker-a" in await browser.text("table")
    await browser.go("/console/ops/tenants/beta")
    question = await browser.press_and_confirm("Suspend beta")
    assert "Suspend beta?" in question
    assert await browser.text("#tenant-status") == "suspended"
    assert (await cp.call("GET", "/v1/tenants/beta", operator=True)).body["status"] == "suspended"
    refused = await cp.token_request(beta.access_key, beta.secret)
    assert refused.status == 401
