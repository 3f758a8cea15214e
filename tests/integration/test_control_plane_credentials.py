"""Credentials: the secret is shown once, stored only hashed and sealed, never logged; revoking
takes effect at once; grants limit what a credential may do."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from control_plane.grants import default_grants, grants_to_json
from control_plane.secret_hash import verify_secret
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
T = "/v1/tenants/acme"


async def test_the_secret_is_shown_once_and_stored_only_hashed_and_sealed(
    control_plane: ControlPlaneHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    made = await cp.call("POST", T + "/credentials", token=admin, json={"description": "ci publisher"})
    assert made.status == 201
    assert made.headers["Cache-Control"] == "no-store"
    access_key, secret = made.body["access_key"], made.body["secret"]
    assert access_key.startswith("AK")
    assert len(access_key) == 22
    assert len(secret) >= 32
    assert made.body["grants"] == list(grants_to_json(default_grants()))
    token = await cp.token_for(access_key, secret)

    listed = await cp.call("GET", T + "/credentials", token=admin)
    assert access_key in {c["access_key"] for c in listed.body["credentials"]}
    assert secret not in str(listed.body)
    assert all("secret" not in c for c in listed.body["credentials"])

    row = await cp.services.pool.fetchrow("SELECT * FROM credentials WHERE access_key = $1", access_key)
    assert row is not None
    dump = repr(dict(row)).encode() + b"".join(v for v in row.values() if isinstance(v, bytes))
    assert secret.encode() not in dump
    assert verify_secret(secret, row["secret_hash"])
    assert row["secret_sealed"] is not None
    decrypted = await cp.services.decrypted_credentials(tenant_ids=["acme"])
    assert {c["access_key"]: c["secret"] for c in decrypted}[access_key] == secret

    await cp.call("GET", T + "/topics", token=token)
    logged = caplog.text
    for sensitive in (secret, token, admin, cp.operator_secret, cp.operator_token):
        assert sensitive not in logged
    assert access_key in logged  # access keys are identifiers and may be logged


async def test_revoking_refuses_tokens_at_once(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    made = (await cp.call("POST", T + "/credentials", token=admin, json={})).body
    token = await cp.token_for(made["access_key"], made["secret"])
    revoked = await cp.call("DELETE", f"{T}/credentials/{made['access_key']}", token=admin)
    assert revoked.status == 200
    assert revoked.body["status"] == "revoked"
    refused = await cp.token_request(made["access_key"], made["secret"])
    assert refused.status == 401
    assert refused.body["error"] == "invalid_client"
    assert (await cp.call("GET", T + "/topics", token=token)).status == 401
    sealed = await cp.services.pool.fetchval(
        "SELECT secret_sealed FROM credentials WHERE access_key = $1", made["access_key"]
    )
    assert sealed is None  # the recoverable copy is gone
    again = await cp.call("DELETE", f"{T}/credentials/AKNOSUCHKEY", token=admin)
    assert again.status == 404
    assert again.body["error"]["code"] == "credential_not_found"


async def test_grants_limit_what_a_credential_may_do(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    _, admin = await cp.new_tenant("acme")
    await cp.new_broker_group("broker-a")
    for name in ("orders-eu", "orders-us", "payments"):
        await cp.call("POST", T + "/topics", token=admin, json={"name": name})
    grants = [{"resource": "topic", "pattern": "orders-*", "actions": ["publish", "subscribe"]}]
    made = (await cp.call("POST", T + "/credentials", token=admin, json={"grants": grants})).body
    assert made["grants"] == grants
    limited = await cp.token_for(made["access_key"], made["secret"])
    listed = await cp.call("GET", T + "/topics", token=limited)
    assert [t["name"] for t in listed.body["topics"]] == ["orders-eu", "orders-us"]
    assert (await cp.call("GET", T + "/topics/payments", token=limited)).status == 403
    assert (await cp.call("POST", T + "/topics", token=limited, json={"name": "orders-x"})).status == 403
    assert (await cp.call("GET", T + "/credentials", token=limited)).status == 403
    assert (await cp.call("GET", T + "/groups", token=limited)).status == 403
    # widening the grants takes effect on the next request, with the same token
    wider = [*grants, {"resource": "topic", "pattern": "orders-*", "actions": ["admin"]}]
    put = await cp.call("PUT", f"{T}/credentials/{made['access_key']}/grants", token=admin, json={"grants": wider})
    assert put.status == 200
    assert (await cp.call("POST", T + "/topics", token=limited, json={"name": "orders-x"})).status == 201
    acls = (await cp.call("GET", T + "/acls", token=admin)).body["acls"]
    assert {"access_key": made["access_key"], "grants": wider} in acls
    escape = [{"resource": "topic", "pattern": "other%orders", "actions": ["publish"]}]
    bad = await cp.call("PUT", f"{T}/credentials/{made['access_key']}/grants", token=admin, json={"grants": escape})
    assert bad.status == 400
    assert bad.body["error"]["details"]["field"] == "grants[0].pattern"


async def test_operators_issue_broker_credentials(control_plane: ControlPlaneHarness) -> None:
    cp = control_plane
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    assert made.status == 201
    assert made.body["role"] == "broker"
    assert made.body["tenant_id"] is None
    listed = (await cp.call("GET", "/v1/admin/credentials", operator=True)).body["credentials"]
    assert {c["role"] for c in listed} == {"operator", "broker"}
    assert (await cp.call("DELETE", f"/v1/admin/credentials/{made.body['access_key']}", operator=True)).status == 200


async def test_the_bootstrap_operator_is_made_once(control_plane: ControlPlaneHarness) -> None:
    again = await control_plane.services.credentials.bootstrap_operator(
        control_plane.settings.bootstrap_credentials_file
    )
    assert again is None
    assert stat.S_IMODE(os.stat(control_plane.settings.bootstrap_credentials_file).st_mode) == 0o600
