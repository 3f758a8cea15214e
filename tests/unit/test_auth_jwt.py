"""data_plane/auth/jwt_verifier.py: which tokens are accepted, which are refused and why, and
the cache of verified tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, generate_private_key
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm

from data_plane.auth.errors import AuthError, UnknownKeyIdError
from data_plane.auth.jwks import JwksCache
from data_plane.auth.jwt_verifier import TokenVerifier

NOW = 1_700_000_000.0
GRANTS = [{"resource": "topic", "pattern": "orders-*", "actions": ["publish"]}]


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ed_jwk(kid: str) -> tuple[Ed25519PrivateKey, dict[str, Any]]:
    priv = Ed25519PrivateKey.generate()
    jwk: dict[str, Any] = OKPAlgorithm.to_jwk(priv.public_key(), as_dict=True)
    jwk.update(kid=kid, alg="EdDSA", use="sig")
    return priv, jwk


@pytest.fixture(scope="module")
def rsa_key() -> RSAPrivateKey:
    return generate_private_key(public_exponent=65537, key_size=2048)


def rsa_jwk(priv: RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(priv.public_key(), as_dict=True)
    jwk.update(kid=kid, alg="RS256")
    return jwk


def claims(**over: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "iss": "orbit",
        "aud": "orbit",
        "sub": "ci_123",
        "tenant": "acme",
        "role": "tenant",
        "grants": GRANTS,
        "iat": int(NOW) - 10,
        "exp": int(NOW) + 600,
        "jti": "j1",
    }
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def mint(priv: Any, kid: str, alg: str = "EdDSA", **over: Any) -> str:
    return jwt.encode(claims(**over), priv, algorithm=alg, headers={"kid": kid})


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def handmade(header: Mapping[str, Any], payload: Mapping[str, Any], sign: Any = None) -> str:
    head = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(payload).encode())
    sig = sign(head.encode()) if sign is not None else b""
    return head + "." + _b64(sig)


async def _never() -> Mapping[str, Any]:
    raise AssertionError("no fetch expected")


def keyset(*jwks: dict[str, Any]) -> JwksCache:
    cache = JwksCache(fetcher=_never)
    cache.set_jwks({"keys": list(jwks)})
    return cache


@pytest.fixture
def ed() -> tuple[Ed25519PrivateKey, dict[str, Any]]:
    return ed_jwk("k1")


@pytest.fixture
def verifier(ed: tuple[Ed25519PrivateKey, dict[str, Any]]) -> TokenVerifier:
    return TokenVerifier(keyset(ed[1]), clock_s=Clock())


def refused(v: TokenVerifier, token: str) -> str:
    with pytest.raises(AuthError) as info:
        v.verify(token)
    return info.value.remark


def test_a_valid_eddsa_token_yields_its_principal(verifier: TokenVerifier, ed: Any) -> None:
    p = verifier.verify(mint(ed[0], "k1"))
    assert (p.subject, p.tenant, p.role, p.source) == ("ci_123", "acme", "tenant", "jwt")
    assert p.allows("topic", "orders-eu", "publish")
    assert not p.allows("topic", "orders-eu", "subscribe")


def test_a_valid_rs256_token_is_accepted(rsa_key: RSAPrivateKey) -> None:
    v = TokenVerifier(keyset(rsa_jwk(rsa_key, "r1")), clock_s=Clock())
    p = v.verify(mint(rsa_key, "r1", "RS256", role="operator", tenant="*"))
    assert p.role == "operator"
    assert p.is_privileged


def test_audience_may_be_a_list(verifier: TokenVerifier, ed: Any) -> None:
    assert verifier.verify(mint(ed[0], "k1", aud=["other", "orbit"])).tenant == "acme"


def test_expired_tokens_are_refused(verifier: TokenVerifier, ed: Any) -> None:
    assert refused(verifier, mint(ed[0], "k1", exp=int(NOW) - 31)) == "token expired"


def test_expiry_has_a_small_leeway(verifier: TokenVerifier, ed: Any) -> None:
    assert verifier.verify(mint(ed[0], "k1", exp=int(NOW) - 5)).tenant == "acme"


def test_not_yet_valid_tokens_are_refused(verifier: TokenVerifier, ed: Any) -> None:
    assert refused(verifier, mint(ed[0], "k1", nbf=int(NOW) + 120)) == "token not yet valid"
    assert "issued in the future" in refused(verifier, mint(ed[0], "k1", iat=int(NOW) + 120))


def test_tampered_tokens_are_refused(verifier: TokenVerifier, ed: Any) -> None:
    token = mint(ed[0], "k1")
    head, _payload, sig = token.split(".")
    forged_payload = _b64(json.dumps(claims(tenant="evil", role="operator")).encode())
    assert refused(verifier, f"{head}.{forged_payload}.{sig}") == "token signature does not verify"
    flipped = sig[:-2] + ("A" if sig[-2] != "A" else "B") + sig[-1]
    assert refused(verifier, f"{head}.{token.split('.')[1]}.{flipped}") == "token signature does not verify"


def test_tokens_signed_by_another_key_under_a_known_kid_are_refused(verifier: TokenVerifier) -> None:
    other, _ = ed_jwk("k1")
    assert refused(verifier, mint(other, "k1")) == "token signature does not verify"


def test_unknown_kid_raises_its_own_error(verifier: TokenVerifier, ed: Any) -> None:
    with pytest.raises(UnknownKeyIdError) as info:
        verifier.verify(mint(ed[0], "k9"))
    assert info.value.kid == "k9"


def test_alg_none_is_refused(verifier: TokenVerifier) -> None:
    token = handmade({"alg": "none", "kid": "k1", "typ": "JWT"}, claims())
    assert "algorithm 'none' is not accepted" in refused(verifier, token)


def test_hs256_signed_with_the_public_key_is_refused(verifier: TokenVerifier, ed: Any) -> None:
    """The classic key-confusion attack: HMAC keyed with the (public) verification key."""
    public = ed[0].public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    for alg, digest in (("HS256", hashlib.sha256), ("HS512", hashlib.sha512)):
        token = handmade({"alg": alg, "kid": "k1"}, claims(), lambda m, d=digest: hmac.new(public, m, d).digest())
        assert f"algorithm '{alg}' is not accepted" in refused(verifier, token)


def test_alg_must_match_the_key_type(rsa_key: RSAPrivateKey, ed: Any) -> None:
    v = TokenVerifier(keyset(rsa_jwk(rsa_key, "r1"), ed[1]), clock_s=Clock())
    token = mint(ed[0], "r1", "EdDSA")  # an EdDSA token naming the RSA key
    assert "does not match key 'r1'" in refused(v, token)


@pytest.mark.parametrize(("claim", "value"), [("iss", "someone"), ("aud", "other"), ("aud", ["a", "b"])])
def test_wrong_issuer_or_audience_is_refused(verifier: TokenVerifier, ed: Any, claim: str, value: Any) -> None:
    remark = refused(verifier, mint(ed[0], "k1", **{claim: value}))
    assert remark == ("token issuer is not accepted" if claim == "iss" else "token audience is not accepted")


@pytest.mark.parametrize("claim", ["iss", "aud", "sub", "tenant", "role", "grants", "iat", "exp", "jti"])
def test_each_missing_claim_is_refused(ed: Any, claim: str) -> None:
    v = TokenVerifier(keyset(ed[1]), clock_s=Clock())
    payload = claims()
    del payload[claim]
    token = jwt.encode(payload, ed[0], algorithm="EdDSA", headers={"kid": "k1"})
    assert refused(v, token) == f"token lacks claim '{claim}'"


@pytest.mark.parametrize(
    "over",
    [
        {"tenant": "Not_A_Tenant"},
        {"role": "root"},
        {"role": "operator"},  # operators have tenant "*"
        {"grants": [{"resource": "topic", "pattern": "acme%x", "actions": ["publish"]}]},
        {"grants": "all"},
        {"exp": "tomorrow"},
        {"sub": 42},
    ],
)
def test_claims_that_make_no_valid_principal_are_refused(verifier: TokenVerifier, ed: Any, over: Any) -> None:
    assert refused(verifier, mint(ed[0], "k1", **over))


def test_garbage_is_refused(verifier: TokenVerifier) -> None:
    assert refused(verifier, "not-a-jwt") == "token is not a well-formed JWT"
    assert "longer than" in refused(verifier, "a" * 20_000)
    assert refused(verifier, handmade({"alg": "EdDSA"}, claims())) == "token header has no kid"


def test_verified_tokens_are_cached_until_they_expire(ed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    v = TokenVerifier(keyset(ed[1]), clock_s=clock, leeway_s=0)
    token = mint(ed[0], "k1", exp=int(NOW) + 60)
    first = v.verify(token)
    calls = 0
    real = jwt.decode

    def counting(*a: Any, **k: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*a, **k)

    monkeypatch.setattr(jwt, "decode", counting)
    assert v.verify(token) is first  # same principal object: decisions cache on it
    assert calls == 0
    clock.t = NOW + 60
    assert refused(v, token) == "token expired"
    assert len(v) == 0


def test_the_cache_is_bounded(ed: Any) -> None:
    v = TokenVerifier(keyset(ed[1]), clock_s=Clock(), cache_max=3)
    tokens = [mint(ed[0], "k1", jti=f"j{i}") for i in range(5)]
    for t in tokens:
        v.verify(t)
    assert len(v) == 3


def test_a_key_removed_from_the_jwks_revokes_its_cached_tokens(ed: Any) -> None:
    keys = keyset(ed[1])
    v = TokenVerifier(keys, clock_s=Clock())
    token = mint(ed[0], "k1")
    v.verify(token)
    _, other = ed_jwk("k2")
    keys.set_jwks({"keys": [other]})
    with pytest.raises(UnknownKeyIdError):
        v.verify(token)
