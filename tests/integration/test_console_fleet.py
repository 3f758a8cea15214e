"""The console's fleet pages over plain HTTP: an operator adds, changes, drains and removes a
broker group, adds its hosts, issues, rotates and revokes a host's broker credential (the secret
shown once, and working at the token endpoint until revoked), and rotates the token signing key
— each change visible through the API; tenants reach none of it."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.integration.console_support import ConsoleClient, FormFields, Page
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
FLEET = "/console/ops/fleet"
ACCESS = "/console/ops/credentials"


@pytest_asyncio.fixture(name="operator")
async def operator_console(control_plane: ControlPlaneHarness) -> AsyncIterator[ConsoleClient]:
    client = ConsoleClient(control_plane.url)
    signed = await client.sign_in(control_plane.operator_access_key, control_plane.operator_secret)
    assert signed.status == 303, signed.text
    yield client
    await client.close()


def _text_of(page: Page, element_id: str) -> str:
    start = page.text.index(f'id="{element_id}"')
    return page.text[start : page.text.index("</", start)]


async def test_an_operator_adds_changes_and_drains_a_broker_group(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    form = {"name": "broker-b", "namesrv_addrs": "127.0.0.1:9876, 127.0.0.2:9876",
            "broker_addrs": "10.0.0.5:10911 10.0.0.6:10911", "max_queues": "64", "max_msgs_per_s": "20000",
            "storage_bytes": "1000000"}  # fmt: skip
    made = await operator.submit(FLEET, FLEET, form)
    assert (made.status, made.location) == (303, f"{FLEET}/broker-b")
    got = (await cp.call("GET", "/v1/fleet/broker-groups/broker-b", operator=True)).body
    assert got["namesrv_addrs"] == ["127.0.0.1:9876", "127.0.0.2:9876"]
    assert got["broker_addrs"] == ["10.0.0.5:10911", "10.0.0.6:10911"]
    assert (got["max_queues"], got["max_msgs_per_s"], got["storage_bytes"], got["status"]) == (
        64, 20000, 1000000, "active"
    )  # fmt: skip
    page = await operator.get(f"{FLEET}/broker-b")
    assert page.status == 200
    assert 'data-host="10.0.0.5"' in page.text
    assert 'data-host="10.0.0.6"' in page.text
    for html in (page.text, (await operator.get(FLEET)).text):
        assert FormFields().unlabelled(html) == []
    assert "broker-b" in (await operator.get(FLEET)).text

    changed = await operator.submit(
        f"{FLEET}/broker-b", f"{FLEET}/broker-b", {"max_queues": "128", "status": "draining"}
    )
    assert (changed.status, changed.location) == (303, f"{FLEET}/broker-b")
    got = (await cp.call("GET", "/v1/fleet/broker-groups/broker-b", operator=True)).body
    assert (got["max_queues"], got["status"], got["storage_bytes"]) == (128, "draining", 1000000)
    assert got["broker_addrs"] == ["10.0.0.5:10911", "10.0.0.6:10911"]  # blank: unchanged
    assert _text_of(await operator.get(f"{FLEET}/broker-b"), "group-status").endswith("draining")

    added = await operator.submit(
        f"{FLEET}/broker-b", f"{FLEET}/broker-b/hosts", {"broker_id": "1", "host": "ssd-7", "address": "10.0.0.6:10911"}
    )
    assert added.status == 303, added.text
    hosts = (await cp.call("GET", "/v1/fleet/broker-groups/broker-b", operator=True)).body["hosts"]
    assert [(h["broker_id"], h["host"], h["address"]) for h in hosts] == [(1, "ssd-7", "10.0.0.6:10911")]


async def test_bad_fleet_forms_are_refused_with_the_reason_and_change_nothing(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    base = {"name": "broker-c", "broker_addrs": "10.0.0.5:10911", "max_queues": "8", "max_msgs_per_s": "10",
            "storage_bytes": "10"}  # fmt: skip
    for bad, field in (({"broker_addrs": "10.0.0.5"}, "broker_addrs[0]"), ({"max_queues": "many"}, "max_queues"),
                       ({"name": "no spaces"}, "name"), ({"max_queues": "-1"}, "max_queues")):  # fmt: skip
        refused = await operator.submit(FLEET, FLEET, {**base, **bad})
        assert refused.status == 400, (bad, refused.status)
        assert field in refused.text, bad
    listed = (await cp.call("GET", "/v1/fleet/broker-groups", operator=True)).body["broker_groups"]
    assert [g["name"] for g in listed] == []
    assert (await operator.submit(FLEET, FLEET, base)).status == 303
    page = f"{FLEET}/broker-c"
    wrong = await operator.submit(page, page, {"status": "paused"})
    assert wrong.status == 400
    assert "status" in wrong.text
    assert (await cp.call("GET", "/v1/fleet/broker-groups/broker-c", operator=True)).body["status"] == "active"
    missing = await operator.get(f"{FLEET}/broker-z")
    assert missing.status == 404


async def test_a_host_credential_is_shown_once_rotated_and_revoked_from_the_console(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    await cp.new_broker_group("broker-a")  # broker_addrs 127.0.0.1:10911
    page = f"{FLEET}/broker-a"
    listed = await operator.get(page)
    assert "Issue credential of 127.0.0.1" in listed.text
    issued = await operator.submit(page, f"{page}/hosts/127.0.0.1/credential", {})
    assert issued.status == 200, issued.text
    assert issued.headers["Cache-Control"] == "no-store"
    first_key = _text_of(issued, "new-access-key").rpartition(">")[2]
    first_secret = _text_of(issued, "new-secret").rpartition(">")[2]
    assert (await cp.token_request(first_key, first_secret)).status == 200
    shown = await operator.get(page)
    assert first_key in shown.text
    assert first_secret not in shown.text
    assert "Rotate credential of 127.0.0.1" in shown.text

    rotated = await operator.submit(page, f"{page}/hosts/127.0.0.1/credential", {})
    assert rotated.status == 200
    second_key = _text_of(rotated, "new-access-key").rpartition(">")[2]
    second_secret = _text_of(rotated, "new-secret").rpartition(">")[2]
    assert second_key != first_key
    assert f"previous credential, {first_key}, is revoked" in rotated.text
    assert (await cp.token_request(first_key, first_secret)).status == 401
    assert (await cp.token_request(second_key, second_secret)).status == 200

    revoked = await operator.submit(page, f"{page}/hosts/127.0.0.1/revoke", {})
    assert (revoked.status, revoked.location) == (303, page)
    assert (await cp.token_request(second_key, second_secret)).status == 401
    hosts = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a/hosts", operator=True)).body["hosts"]
    assert [(h["host"], h["access_key"], h["status"]) for h in hosts] == [("127.0.0.1", second_key, "revoked")]
    unknown = await operator.submit(page, f"{page}/hosts/10.9.9.9/credential", {})
    assert unknown.status == 404
    assert "not a host of broker group" in unknown.text


async def _group_with_a_topic(cp: ControlPlaneHarness) -> str:
    """Broker group broker-a, and tenant acme's topic orders placed on it: acme's token."""
    await cp.new_broker_group("broker-a")
    _made, token = await cp.new_tenant("acme")
    assert (await cp.call("POST", "/v1/tenants/acme/topics", token=token, json={"name": "orders"})).status == 201
    return token


async def test_removing_a_group_wants_its_name_and_no_queues_on_it(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    token = await _group_with_a_topic(cp)
    page = f"{FLEET}/broker-a"
    unconfirmed = await operator.submit(page, f"{page}/delete", {"confirm_name": "broker-x"})
    assert unconfirmed.status == 400
    assert "Type broker-a to confirm" in unconfirmed.text
    in_use = await operator.submit(page, f"{page}/delete", {"confirm_name": "broker-a"})
    assert in_use.status == 409
    assert "broker_group_in_use" in in_use.text
    assert (await cp.call("DELETE", "/v1/tenants/acme/topics/orders", token=token)).status == 204
    removed = await operator.submit(page, f"{page}/delete", {"confirm_name": "broker-a"})
    assert (removed.status, removed.location) == (303, FLEET)
    assert (await cp.call("GET", "/v1/fleet/broker-groups/broker-a", operator=True)).status == 404
    assert "broker-a removed" in (await operator.get(FLEET)).text


async def test_rotating_the_signing_key_publishes_a_new_key_and_keeps_sessions(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    before = {k["kid"] for k in (await cp.call("GET", "/.well-known/jwks.json")).body["keys"]}
    rotated = await operator.submit(ACCESS, "/console/ops/signing-keys/rotate", {})
    assert (rotated.status, rotated.location) == (303, ACCESS)
    after = {k["kid"] for k in (await cp.call("GET", "/.well-known/jwks.json")).body["keys"]}
    (new,) = after - before
    assert before <= after  # the old key still verifies for a token lifetime
    page = await operator.get(ACCESS)  # the session's token, signed by the old key, still works
    assert page.status == 200
    assert f"Signing key {new} is now active" in page.text
    assert new in page.text


async def test_an_operator_creates_and_revokes_operator_and_broker_credentials(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    made = await operator.submit(ACCESS, ACCESS, {"role": "broker", "description": "rack 7 brokers"})
    assert made.status == 200, made.text
    assert made.headers["Cache-Control"] == "no-store"
    key = _text_of(made, "new-access-key").rpartition(">")[2]
    secret = _text_of(made, "new-secret").rpartition(">")[2]
    listed = (await cp.call("GET", "/v1/admin/credentials", operator=True)).body["credentials"]
    (row,) = [c for c in listed if c["access_key"] == key]
    assert (row["role"], row["description"], row["status"]) == ("broker", "rack 7 brokers", "active")
    assert (await cp.token_request(key, secret)).status == 200
    page = await operator.get(ACCESS)
    assert key in page.text
    assert secret not in page.text
    assert FormFields().unlabelled(page.text) == []
    bad = await operator.submit(ACCESS, ACCESS, {"role": "tenant"})
    assert bad.status == 400
    assert "role" in bad.text
    revoked = await operator.submit(ACCESS, f"{ACCESS}/{key}/revoke", {})
    assert (revoked.status, revoked.location) == (303, ACCESS)
    assert (await cp.token_request(key, secret)).status == 401
    own = await operator.submit(ACCESS, f"{ACCESS}/{cp.operator_access_key}/revoke", {})
    assert own.status == 400
    assert "this session signed in with it" in own.text
    assert (await operator.get(ACCESS)).status == 200  # still signed in


async def test_tenants_reach_no_fleet_page_or_change(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    await cp.new_broker_group("broker-a")
    made, _ = await cp.new_tenant("acme")
    tenant = ConsoleClient(cp.url)
    try:
        assert (await tenant.sign_in(made["access_key"], made["secret"])).status == 303
        csrf = (await tenant.get("/console/t/acme/topics")).csrf
        for path in (FLEET, f"{FLEET}/broker-a", ACCESS):
            assert (await tenant.get(path)).status == 403, path
        for path, form in ((FLEET, {"name": "mine", "max_queues": "1", "max_msgs_per_s": "1", "storage_bytes": "1"}),
                           (f"{FLEET}/broker-a", {"status": "draining"}),
                           (f"{FLEET}/broker-a/hosts/127.0.0.1/credential", {}),
                           (f"{FLEET}/broker-a/delete", {"confirm_name": "broker-a"}),
                           ("/console/ops/signing-keys/rotate", {}), (ACCESS, {"role": "operator"}),
                           (f"{ACCESS}/{cp.operator_access_key}/revoke", {})):  # fmt: skip
            refused = await tenant.post(path, form, csrf=csrf)
            assert refused.status == 403, path
    finally:
        await tenant.close()
    got = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a", operator=True)).body
    assert got["status"] == "active"
    hosts = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a/hosts", operator=True)).body["hosts"]
    assert all(h["status"] == "none" for h in hosts)
    groups = (await cp.call("GET", "/v1/fleet/broker-groups", operator=True)).body["broker_groups"]
    assert [g["name"] for g in groups] == ["broker-a"]
    admins = (await cp.call("GET", "/v1/admin/credentials", operator=True)).body["credentials"]
    assert [c["status"] for c in admins if c["role"] == "operator"] == ["active"]


async def test_a_broker_groups_page_charts_what_its_brokers_stored_and_refused(
    control_plane: ControlPlaneHarness, operator: ConsoleClient
) -> None:
    cp = control_plane
    await _group_with_a_topic(cp)
    now = dt.datetime.now(dt.UTC)
    for ago_s, offset, refused in ((150, 0, 0), (90, 1200, 9)):  # 1,200 messages stored in a minute, 9 refused
        doc = {
            "broker": "broker-a",
            "at": (now - dt.timedelta(seconds=ago_s)).isoformat(),
            "topics": [{"tenant": "acme", "topic": "orders", "queues": [{"id": 0, "max_offset": offset}],
                        "refused": refused}],
        }  # fmt: skip
        assert (await cp.call("POST", "/internal/v1/load", operator=True, json=doc)).status == 200
    page = await operator.get(f"{FLEET}/broker-a")
    assert page.status == 200, page.text
    api = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a/load", operator=True)).body["buckets"]
    rates = [b["publish_rate"] for b in api if b["publish_rate"]]
    assert rates  # the minute's growth, as the API gives it
    assert "Publish rate of broker-a (messages/s), last hour: now" in page.text
    assert "Requests broker-a refused, last hour: now" in page.text
    assert f"<td>{round(rates[-1], 2)}</td>" in page.text  # the chart's figures are the API's
    assert "<td>9</td>" in page.text
    day = await operator.get(f"{FLEET}/broker-a?range=day")
    assert day.status == 200, day.text
    assert "Publish rate of broker-a (messages/s), last day" in day.text
    assert (await operator.get(f"{FLEET}/broker-a?range=year")).status == 400
