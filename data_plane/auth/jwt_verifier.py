"""TokenVerifier: synchronous, cached verification of the control plane's JWTs.

A token is accepted when: its header's ``alg`` is ``EdDSA`` or ``RS256`` (never ``none``, never
an HMAC algorithm — a public key must not double as a shared secret); its ``kid`` is in the JWKS
cache and that key verifies that ``alg``; the signature verifies; ``iss`` and ``aud`` are
``"orbit"``; ``sub``, ``tenant``, ``role``, ``grants``, ``iat``, ``exp`` and ``jti`` are present;
``exp`` is in the future and ``nbf``/``iat`` are not (each within ``leeway_s``); the claims make a
valid principal (tenant name, role, grants).

Clients send the same token with every request, so verified tokens are kept by their exact string
(bounded LRU, ``cache_max``) with their principal until ``exp``: a hit costs one dict lookup
and one clock read. The cache is dropped whenever the JWKS key set changes (a removed kid revokes
its tokens). The clock is injected (``clock_s``, seconds since the epoch).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import jwt

from data_plane.auth.errors import AuthError, UnknownKeyIdError
from data_plane.auth.jwks import JwkKey
from data_plane.auth.principal import AuthConfigError, Principal, parse_grants

ALLOWED_ALGS: Final = frozenset(("EdDSA", "RS256"))
REQUIRED_CLAIMS: Final = ("iss", "aud", "sub", "tenant", "role", "grants", "iat", "exp", "jti")
MAX_TOKEN_CHARS: Final = 16 * 1024
_DECODE_OPTIONS: Final = {
    # Signature only: the claims are checked below, with our clock and clear remarks.
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "require": [],
}


class KeySource(Protocol):
    generation: int

    def key(self, kid: str) -> JwkKey | None: ...


def _number(claims: Mapping[str, Any], name: str) -> float:
    v = claims[name]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise AuthError(f"token claim '{name}' is not a number")
    return float(v)


class TokenVerifier:
    def __init__(
        self,
        keys: KeySource,
        *,
        issuer: str = "orbit",
        audience: str = "orbit",
        leeway_s: float = 30.0,
        cache_max: int = 10_000,
        clock_s: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.issuer = issuer
        self.audience = audience
        self.leeway_s = leeway_s
        self.cache_max = cache_max
        self.clock_s = clock_s
        self._cache: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._generation = keys.generation

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()

    def verify(self, token: str) -> Principal:
        """The token's principal; raises AuthError (UnknownKeyIdError for an unknown kid)."""
        cache = self._cache
        if self.keys.generation != self._generation:
            cache.clear()
            self._generation = self.keys.generation
        hit = cache.get(token)
        if hit is not None:
            if self.clock_s() < hit[1]:
                cache.move_to_end(token)
                return hit[0]
            del cache[token]
            raise AuthError("token expired")
        principal, valid_until = self._verify_uncached(token)
        cache[token] = (principal, valid_until)
        if len(cache) > self.cache_max:
            cache.popitem(last=False)
        return principal

    def _verify_uncached(self, token: str) -> tuple[Principal, float]:
        if len(token) > MAX_TOKEN_CHARS:
            raise AuthError(f"token is longer than {MAX_TOKEN_CHARS} characters")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise AuthError("token is not a well-formed JWT") from None
        alg = header.get("alg")
        if alg not in ALLOWED_ALGS:
            raise AuthError(f"token algorithm {str(alg)[:20]!r} is not accepted (EdDSA or RS256 only)")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AuthError("token header has no kid")
        key = self.keys.key(kid)
        if key is None:
            raise UnknownKeyIdError(kid)
        if key.alg != alg:
            raise AuthError(f"token algorithm {alg} does not match key {kid!r} ({key.alg})")
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg], options=_DECODE_OPTIONS)  # type: ignore[arg-type]
        except jwt.InvalidSignatureError:
            raise AuthError("token signature does not verify") from None
        except jwt.InvalidTokenError:
            raise AuthError("token is not a well-formed JWT") from None
        for name in REQUIRED_CLAIMS:
            if name not in claims:
                raise AuthError(f"token lacks claim '{name}'")
        if claims["iss"] != self.issuer:
            raise AuthError("token issuer is not accepted")
        aud = claims["aud"]
        if not (aud == self.audience or (isinstance(aud, list) and self.audience in aud)):
            raise AuthError("token audience is not accepted")
        exp = _number(claims, "exp")
        iat = _number(claims, "iat")
        now = self.clock_s()
        leeway = self.leeway_s
        if now >= exp + leeway:
            raise AuthError("token expired")
        if "nbf" in claims and now + leeway < _number(claims, "nbf"):
            raise AuthError("token not yet valid")
        if now + leeway < iat:
            raise AuthError("token not yet valid (issued in the future)")
        if not isinstance(claims["jti"], str) or not claims["jti"]:
            raise AuthError("token claim 'jti' is not a string")
        sub, tenant, role = claims["sub"], claims["tenant"], claims["role"]
        if not (isinstance(sub, str) and isinstance(tenant, str) and isinstance(role, str)):
            raise AuthError("token claims 'sub', 'tenant' and 'role' must be strings")
        try:
            principal = Principal.build(
                subject=sub, tenant=tenant, role=role, grants=parse_grants(claims["grants"]), source="jwt"
            )
        except AuthConfigError as e:
            raise AuthError(f"token claims are invalid: {e}") from None
        return principal, exp + leeway
