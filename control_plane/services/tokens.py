"""Tokens: signing keys kept in PostgreSQL (private halves sealed), JWT minting and checking,
the JWKS document and key rotation.

Rotation without downtime: the new key signs from now on; the old one is retired and stays in
the JWKS (and keeps verifying) for one token lifetime, after which nothing it signed is valid.
Verification keys are cached for ``KEY_CACHE_S`` so that a rotation done by another control-plane
instance is seen within that time.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from jwt.algorithms import OKPAlgorithm

from control_plane.db import Pool, Record, UniqueViolation
from control_plane.errors import InvalidToken
from control_plane.grants import Grant, grants_from_json, grants_to_json
from control_plane.principal import ROLES, Claims, Principal, Role
from control_plane.repositories import signing_keys as repo
from control_plane.sealing import Sealer
from control_plane.settings import Settings

ALGORITHM = "EdDSA"
KEY_CACHE_S = 10.0
REQUIRED_CLAIMS = ["iss", "aud", "sub", "tenant", "role", "grants", "iat", "exp", "jti"]


@dataclass(frozen=True, slots=True)
class _VerifyKey:
    key: Ed25519PublicKey
    algorithm: str
    fetched_at: float


def _context(kid: str) -> bytes:
    return b"signing-key:" + kid.encode()


class TokenService:
    def __init__(self, pool: Pool, sealer: Sealer, settings: Settings, *, clock_s: Callable[[], float] = time.time):
        self.pool = pool
        self.sealer = sealer
        self.settings = settings
        self.clock_s = clock_s
        self._signing: dict[str, Ed25519PrivateKey] = {}
        self._verify: dict[str, _VerifyKey] = {}

    # --- keys -----------------------------------------------------------------------------
    async def _insert_new_key(self, conn: Any) -> str:
        kid = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4)
        private = Ed25519PrivateKey.generate()
        jwk = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
        jwk.update({"kid": kid, "alg": ALGORITHM, "use": "sig"})
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        await repo.insert_key(
            conn,
            kid=kid,
            algorithm=ALGORITHM,
            public_jwk=jwk,
            private_key_sealed=self.sealer.seal(pem, context=_context(kid)),
        )
        return kid

    async def ensure_signing_key(self) -> str:
        """The active key's kid, creating the first key when there is none."""
        async with self.pool.acquire() as conn:
            row = await repo.get_active(conn)
            if row is not None:
                return str(row["kid"])
            try:
                async with conn.transaction():
                    return await self._insert_new_key(conn)
            except UniqueViolation:  # another instance created it first
                row = await repo.get_active(conn)
                assert row is not None
                return str(row["kid"])

    async def rotate(self) -> dict[str, str | None]:
        """A new active key; the old one is retired (still published for one token lifetime)."""
        async with self.pool.acquire() as conn, conn.transaction():
            old = await repo.get_active(conn, for_update=True)
            if old is not None:
                await repo.retire(conn, str(old["kid"]))
            kid = await self._insert_new_key(conn)
        return {"kid": kid, "retired_kid": None if old is None else str(old["kid"])}

    async def jwks(self) -> dict[str, list[dict[str, Any]]]:
        rows = await repo.published(self.pool, token_lifetime_s=self.settings.token_lifetime_s)
        return {"keys": [dict(r["public_jwk"]) for r in rows]}

    def _private_key(self, row: Record) -> Ed25519PrivateKey:
        kid = str(row["kid"])
        if kid not in self._signing:
            pem = self.sealer.open(bytes(row["private_key_sealed"]), context=_context(kid))
            key = serialization.load_pem_private_key(pem, password=None)
            assert isinstance(key, Ed25519PrivateKey)
            self._signing[kid] = key
        return self._signing[kid]

    # --- tokens ---------------------------------------------------------------------------
    async def mint(
        self, *, access_key: str, tenant: str, role: Role, grants: list[Grant], lifetime_s: int | None = None
    ) -> tuple[str, int]:
        """A signed JWT and its lifetime in seconds."""
        lifetime = min(lifetime_s or self.settings.token_lifetime_s, self.settings.token_lifetime_s)
        row = await repo.get_active(self.pool)
        if row is None:
            await self.ensure_signing_key()
            row = await repo.get_active(self.pool)
            assert row is not None
        now = int(self.clock_s())
        claims: Claims = {
            "iss": self.settings.issuer,
            "aud": self.settings.audience,
            "sub": access_key,
            "tenant": tenant,
            "role": role,
            "grants": grants_to_json(grants),
            "iat": now,
            "exp": now + lifetime,
            "jti": secrets.token_urlsafe(12),
        }
        token = jwt.encode(dict(claims), self._private_key(row), algorithm=ALGORITHM, headers={"kid": str(row["kid"])})
        return token, lifetime

    async def _verify_key(self, kid: str) -> _VerifyKey | None:
        cached = self._verify.get(kid)
        now = time.monotonic()
        if cached is not None and now - cached.fetched_at < KEY_CACHE_S:
            return cached
        rows = await repo.published(self.pool, token_lifetime_s=self.settings.token_lifetime_s)
        self._verify = {}
        for r in rows:
            key = OKPAlgorithm.from_jwk(dict(r["public_jwk"]))
            if isinstance(key, Ed25519PublicKey):
                self._verify[str(r["kid"])] = _VerifyKey(key, str(r["algorithm"]), now)
        return self._verify.get(kid)

    async def verify(self, token: str) -> Principal:
        """The principal a token names; InvalidToken when it is not one of ours, or expired."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("the bearer token is not a JWT") from None
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise InvalidToken("the token has no kid")
        found = await self._verify_key(kid)
        if found is None:
            raise InvalidToken("the token is signed by an unknown or expired key")
        if header.get("alg") != found.algorithm:
            raise InvalidToken("the token's algorithm does not match its key")
        try:
            claims = jwt.decode(
                token,
                found.key,
                algorithms=[found.algorithm],
                audience=self.settings.audience,
                issuer=self.settings.issuer,
                options={"require": REQUIRED_CLAIMS},
            )
        except jwt.ExpiredSignatureError:
            raise InvalidToken("the token has expired") from None
        except jwt.PyJWTError as e:
            raise InvalidToken(f"the token is not valid: {e}") from None
        role, tenant, sub, grants = claims["role"], claims["tenant"], claims["sub"], claims["grants"]
        if role not in ROLES or not isinstance(tenant, str) or not isinstance(sub, str) or not isinstance(grants, list):
            raise InvalidToken("the token's claims are not Orbit's")
        try:
            parsed = grants_from_json(grants)
        except (KeyError, TypeError):
            raise InvalidToken("the token's grants are malformed") from None
        return Principal(access_key=sub, tenant=tenant, role=cast(Role, role), grants=tuple(parsed))
