"""OAuth client-credentials tokens, JWKS, key rotation, and every kind of refused token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def jwks_keys(cp: ControlPlaneHarness) -> dict[str, jwt.PyJWK]:
    reply = await cp.call("GET", "/.well-known/jwks.json")
    assert reply.status == 200
    return {k["kid"]: jwt.PyJWK.from_dict(k) for k in reply.body["keys"]}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_by_hand(claims: dict[str, object], *, kid: str, key: bytes) -> str:
    """An HS256 token keyed with the public key's bytes: the algorithm-confusion attack."""
    signing_input = (
        b64url(orjson.dumps({"alg": "HS256", "typ": "JWT", "kid": kid})) + "." + b64url(orjson.dumps(claims))
    )
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64url(signature)


def verify_with_jwks(token: str, keys: dict[str, jwt.PyJWK]) -> dict[str, object]:
    kid = jwt.get_unverified_header(token)["kid"]
    key = keys[kid]
    return jwt.decode(token, key.key, algorithms=["EdDSA"], audience="orbit", issuer="orbit")


async def test_client_credentials_token_verifies_against_jwks(control_plane: ControlPlaneHarness) -> None:
    cred, token = await control_plane.new_tenant("acme")
    claims = verify_with_jwks(token, await jwks_keys(control_plane))
    assert claims["sub"] == cred["access_key"]
    assert claims["tenant"] == "acme"
    assert claims["role"] == "tenant"
    assert claims["grants"] == cred["grants"]
    assert int(claims["exp"]) - int(claims["iat"]) == 900  # type: ignore[call-overload]
    assert jwt.get_unverified_header(token)["alg"] == "EdDSA"
    operator_claims = verify_with_jwks(control_plane.operator_token, await jwks_keys(control_plane))
    assert (operator_claims["tenant"], operator_claims["role"]) == ("*", "operator")


async def test_the_token_endpoint_takes_basic_form_or_json(control_plane: ControlPlaneHarness) -> None:
    cred, _ = await control_plane.new_tenant("acme")
    ak, secret = cred["access_key"], cred["secret"]
    form = await control_plane.token_request(ak, secret)
    as_json = await control_plane.call(
        "POST", "/oauth/token", json={"grant_type": "client_credentials", "client_id": ak, "client_secret": secret}
    )
    for reply in (form, as_json):
        assert reply.status == 200, reply.body
        assert reply.body["token_type"] == "Bearer"
        assert reply.body["expires_in"] == 900
        assert reply.headers["Cache-Control"] == "no-store"
    wrong = await control_plane.token_request(ak, "nope")
    unknown = await control_plane.token_request("AKX", secret)
    for reply in (wrong, unknown):
        assert reply.status == 401
        assert reply.body["error"] == "invalid_client"
    grant = await control_plane.call("POST", "/oauth/token", data={"grant_type": "password"})
    assert grant.status == 400
    assert grant.body["error"] == "unsupported_grant_type"


async def test_rotation_keeps_old_tokens_valid_and_signs_new_ones_with_the_new_kid(
    control_plane: ControlPlaneHarness,
) -> None:
    cred, old_token = await control_plane.new_tenant("acme")
    old_kid = jwt.get_unverified_header(old_token)["kid"]
    rotated = await control_plane.call("POST", "/v1/admin/signing-keys/rotate", operator=True)
    assert rotated.status == 200
    assert rotated.body["retired_kid"] == old_kid
    new_token = await control_plane.token_for(cred["access_key"], cred["secret"])
    assert jwt.get_unverified_header(new_token)["kid"] == rotated.body["kid"] != old_kid
    keys = await jwks_keys(control_plane)
    assert set(keys) == {old_kid, rotated.body["kid"]}
    verify_with_jwks(old_token, keys)
    verify_with_jwks(new_token, keys)
    for token in (old_token, new_token):  # the API takes both
        assert (await control_plane.call("GET", "/v1/tenants/acme/topics", token=token)).status == 200
    # a tenant may not rotate
    assert (await control_plane.call("POST", "/v1/admin/signing-keys/rotate", token=new_token)).status == 403


async def test_a_retired_key_leaves_the_jwks_after_one_token_lifetime(control_plane: ControlPlaneHarness) -> None:
    first = (await control_plane.call("POST", "/v1/admin/signing-keys/rotate", operator=True)).body
    await control_plane.services.pool.execute(
        "UPDATE signing_keys SET retired_at = now() - interval '901 seconds' WHERE kid = $1", first["retired_kid"]
    )
    assert set(await jwks_keys(control_plane)) == {first["kid"]}


async def test_refused_tokens(control_plane: ControlPlaneHarness) -> None:
    cred, token = await control_plane.new_tenant("acme")
    await control_plane.new_tenant("other")
    tokens = control_plane.services.tokens
    header_b64, payload_b64, signature = token.split(".")
    claims = orjson.loads(base64.urlsafe_b64decode(payload_b64 + "=="))
    kid = jwt.get_unverified_header(token)["kid"]

    tokens.clock_s = lambda: time.time() - 2000  # minted long ago: expired
    try:
        expired, _ = await tokens.mint(access_key=cred["access_key"], tenant="acme", role="tenant", grants=[])
    finally:
        tokens.clock_s = time.time
    forged_claims = base64.urlsafe_b64encode(orjson.dumps({**claims, "tenant": "other"})).rstrip(b"=").decode()
    tampered = f"{header_b64}.{forged_claims}.{signature}"
    wrong_key = jwt.encode(claims, Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": kid})
    alg_none = jwt.encode(claims, None, algorithm="none", headers={"kid": kid})  # type: ignore[arg-type]
    no_kid = jwt.encode(claims, Ed25519PrivateKey.generate(), algorithm="EdDSA")
    public_jwk = (await control_plane.call("GET", "/.well-known/jwks.json")).body["keys"][0]
    hmac_confusion = hs256_by_hand(claims, kid=kid, key=base64.urlsafe_b64decode(public_jwk["x"] + "=="))
    cases = {
        "expired": expired,
        "tampered": tampered,
        "wrong key": wrong_key,
        "alg=none": alg_none,
        "no kid": no_kid,
        "HS256 with the public key": hmac_confusion,
        "garbage": "not.a.jwt",
    }
    for what, bad in cases.items():
        reply = await control_plane.call("GET", "/v1/tenants/acme/topics", token=bad)
        assert reply.status == 401, what
        assert reply.body["error"]["code"] == "invalid_token", what
    missing = await control_plane.call("GET", "/v1/tenants/acme/topics")
    assert missing.status == 401
    assert missing.body["error"]["code"] == "unauthenticated"
    assert (await control_plane.call("GET", "/v1/tenants/acme/topics", token=token)).status == 200


async def test_a_tenant_token_cannot_reach_another_tenant(control_plane: ControlPlaneHarness) -> None:
    _, acme = await control_plane.new_tenant("acme")
    other_cred, other = await control_plane.new_tenant("other")
    await control_plane.new_broker_group("broker-a")
    created = await control_plane.call("POST", "/v1/tenants/other/topics", token=other, json={"name": "secret-orders"})
    assert created.status == 201
    await control_plane.call("POST", "/v1/tenants/other/groups", token=other, json={"name": "billing"})
    o = "/v1/tenants/other"
    attempts: list[tuple[str, str, dict[str, object] | None]] = [
        ("GET", o + "/topics", None),
        ("GET", o + "/topics/secret-orders", None),
        ("POST", o + "/topics", {"name": "mine-now"}),
        ("PATCH", o + "/topics/secret-orders", {"retention_hours": 1}),
        ("DELETE", o + "/topics/secret-orders", None),
        ("GET", o + "/groups", None),
        ("GET", o + "/groups/billing", None),
        ("POST", o + "/groups", {"name": "g"}),
        ("DELETE", o + "/groups/billing", None),
        ("GET", o + "/credentials", None),
        ("POST", o + "/credentials", {}),
        ("DELETE", o + f"/credentials/{other_cred['access_key']}", None),
        ("PUT", o + f"/credentials/{other_cred['access_key']}/grants", {"grants": []}),
        ("GET", o + "/acls", None),
        ("GET", o + "/usage", None),
        ("GET", o + "/quota", None),
        ("GET", "/v1/tenants/nobody-here/topics", None),  # 403 too: no hint whether it exists
        ("GET", "/v1/tenants", None),
        ("GET", "/v1/fleet/broker-groups", None),
        ("POST", "/internal/v1/usage", {"records": []}),
    ]
    for method, path, body in attempts:
        reply = await control_plane.call(method, path, token=acme, json=body)
        assert reply.status == 403, (method, path, reply.body)
        assert reply.body["error"]["code"] == "forbidden"
    still = await control_plane.call("GET", o + "/topics/secret-orders", token=other)
    assert still.status == 200
    groups = await control_plane.call("GET", o + "/groups", token=other)
    assert [g["name"] for g in groups.body["groups"]] == ["billing"]


async def test_failed_logins_are_slowed_down_before_any_secret_is_hashed(control_plane: ControlPlaneHarness) -> None:
    cred, _ = await control_plane.new_tenant("acme")
    basic = {"Authorization": "Basic " + base64.b64encode(f"{cred['access_key']}:wrong-secret".encode()).decode()}
    form = {"grant_type": "client_credentials"}
    codes = [(await control_plane.call("POST", "/oauth/token", data=form, headers=basic)).status for _ in range(10)]
    assert codes == [401] * 10
    started = time.monotonic()
    limited = await control_plane.call("POST", "/oauth/token", data=form, headers=basic)
    answered_in = time.monotonic() - started
    assert limited.status == 429, limited.body
    assert limited.body["error"] == "too_many_requests"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert answered_in < 0.5, "no scrypt was run for a refused attempt"
    # From this address, even the right secret waits until the window has passed.
    right = {"Authorization": "Basic " + base64.b64encode(f"{cred['access_key']}:{cred['secret']}".encode()).decode()}
    assert (await control_plane.call("POST", "/oauth/token", data=form, headers=right)).status == 429
    # The limiter's own rules, with a controlled clock: per client id too, and the window slides.
    from control_plane.login_limiter import LoginLimiter

    now = [0.0]
    limiter = LoginLimiter(max_failures_per_address=3, max_failures_per_client=2, window_s=10, clock_s=lambda: now[0])
    limiter.failed("10.0.0.1", "AK1")
    limiter.failed("10.0.0.2", "AK1")
    assert limiter.retry_after_s("10.0.0.3", "AK1") == 10, "two failures for AK1 from anywhere lock AK1"
    assert limiter.retry_after_s("10.0.0.3", "AK2") == 0
    now[0] = 10.5
    assert limiter.retry_after_s("10.0.0.3", "AK1") == 0, "failures leave the window"
