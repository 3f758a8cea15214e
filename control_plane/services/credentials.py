"""Credentials: issue (secret shown once), list, revoke, grants; client-credentials login; the
operator bootstrap; and the decrypted view for the reconciler.

The secret is stored twice, never in plain text: an scrypt hash (checked by the token endpoint)
and an AES-GCM-sealed copy under the master key (brokers need the secret itself to check
RocketMQ ACL HMAC signatures). Neither the secret nor a token is ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import os
import secrets
from typing import Any, NotRequired, TypedDict

import orjson

from control_plane import secret_hash
from control_plane.db import Connection, Pool, Record
from control_plane.errors import InvalidToken, TenantSuspended, Unauthenticated
from control_plane.grants import Grant, GrantDict, default_grants, grants_from_json, grants_to_json
from control_plane.names import OPERATOR_TENANT
from control_plane.principal import SYSTEM_SUBJECT, Principal, Role
from control_plane.repositories import credentials as repo
from control_plane.repositories import jsonable
from control_plane.repositories import tenants as tenants_repo
from control_plane.sealing import Sealer
from control_plane.services.tokens import TokenService
from control_plane.settings import write_private_file
from control_plane.verified_secrets import VerifiedSecrets

log = logging.getLogger(__name__)
SECRET_BYTES = 32  # token_urlsafe(32): 43 url-safe characters
BOOTSTRAP_LOCK_KEY = 7_206_381_002


class InvalidClient(Unauthenticated):
    """The token endpoint's refusal; answered in OAuth's shape ``{"error": "invalid_client"}``."""

    code = "invalid_client"


class DecryptedCredential(TypedDict):
    access_key: str
    tenant: str  # "*" for operator and broker credentials
    role: Role
    grants: list[GrantDict]
    secret: str  # "" once revoked
    status: str  # "active" | "revoked"
    # A broker credential bound to one host of one broker group: name servers take its
    # registrations from that host, for that group, only.
    broker_group: NotRequired[str]
    host: NotRequired[str]


@dataclasses.dataclass(frozen=True, slots=True)
class MintedSecret:
    """A credential not stored yet: its access key, its secret and the secret's scrypt hash."""

    access_key: str
    secret: str = dataclasses.field(repr=False)
    secret_hash: str = dataclasses.field(repr=False)


def new_access_key() -> str:
    return "AK" + base64.b32encode(os.urandom(15)).decode()[:20]


def _context(access_key: str) -> bytes:
    return b"credential:" + access_key.encode()


class CredentialService:
    def __init__(self, pool: Pool, sealer: Sealer, tokens: TokenService) -> None:
        self.pool = pool
        self.sealer = sealer
        self.tokens = tokens
        self.verified = VerifiedSecrets()

    async def create(
        self, *, tenant_id: str | None, role: Role, grants: list[Grant] | None = None, description: str = ""
    ) -> dict[str, Any]:
        """A new credential; the answer holds ``secret``, the only time it is ever shown."""
        minted = await self.mint()
        async with self.pool.acquire() as conn, conn.transaction():
            if tenant_id is not None:
                await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            made = await self.insert(
                conn, minted, tenant_id=tenant_id, role=role, grants=grants, description=description
            )
        log.info("credential %s created (role %s, tenant %s)", minted.access_key, role, tenant_id or OPERATOR_TENANT)
        return made

    async def mint(self) -> MintedSecret:
        """A new access key and secret with the secret's scrypt hash (slow: done in a thread, and
        before any transaction so no row lock waits on it)."""
        access_key = new_access_key()
        secret = secrets.token_urlsafe(SECRET_BYTES)
        return MintedSecret(access_key, secret, await asyncio.to_thread(secret_hash.hash_secret, secret))

    async def insert(
        self,
        conn: Connection,
        minted: MintedSecret,
        *,
        tenant_id: str | None,
        role: Role,
        grants: list[Grant] | None = None,
        description: str = "",
    ) -> dict[str, Any]:
        """Store ``minted`` as a credential inside the caller's transaction (which logs it once
        committed); the answer holds ``secret``, the only time it is ever shown."""
        grants = (default_grants() if grants is None else grants) if role == "tenant" else []
        row = await repo.insert_credential(
            conn,
            access_key=minted.access_key,
            tenant_id=tenant_id,
            role=role,
            secret_hash=minted.secret_hash,
            secret_sealed=self.sealer.seal(minted.secret.encode(), context=_context(minted.access_key)),
            grants=list(grants_to_json(grants)),
            description=description,
        )
        return {**jsonable(row), "secret": minted.secret}

    async def list_credentials(self, *, tenant_id: str | None) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            if tenant_id is not None:
                await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            return [jsonable(r) for r in await repo.list_credentials(conn, tenant_id=tenant_id)]

    async def get(self, *, tenant_id: str | None, access_key: str) -> dict[str, Any]:
        return jsonable(await repo.require_credential(self.pool, tenant_id=tenant_id, access_key=access_key))

    async def revoke(self, *, tenant_id: str | None, access_key: str) -> dict[str, Any]:
        row = await repo.revoke(self.pool, tenant_id=tenant_id, access_key=access_key)
        log.info("credential %s revoked", access_key)
        return jsonable(row)

    async def set_grants(self, *, tenant_id: str, access_key: str, grants: list[Grant]) -> dict[str, Any]:
        row = await repo.set_grants(
            self.pool, tenant_id=tenant_id, access_key=access_key, grants=list(grants_to_json(grants))
        )
        return jsonable(row)

    async def login(self, access_key: str, secret: str) -> tuple[str, int]:
        """Client-credentials grant: a JWT and its lifetime, or InvalidClient."""
        row = await repo.get_for_login(self.pool, access_key)
        stored = secret_hash.DUMMY_HASH if row is None else str(row["secret_hash"])
        if row is None:
            ok = await asyncio.to_thread(secret_hash.verify_secret, secret, stored)  # (as long as a wrong secret)
        else:
            ok = await self.verified.check(secret, stored)
        if row is None or not ok or row["status"] != "active":
            raise InvalidClient("unknown client, wrong secret, or revoked credential")
        if row["role"] == "tenant" and row["tenant_status"] != "active":
            raise InvalidClient("the credential's tenant is not active")
        return await self.tokens.mint(
            access_key=access_key,
            tenant=str(row["tenant_id"] or OPERATOR_TENANT),
            role=row["role"],
            grants=grants_from_json(row["grants"]),
        )

    async def check_current(self, principal: Principal) -> Principal:
        """The principal as it stands now: a token whose credential was revoked, or whose tenant
        was suspended or deleted since it was minted, is refused at once, and grants are the
        credential's current ones (tokens are short-lived, but the API answers the present)."""
        if principal.access_key == SYSTEM_SUBJECT and principal.role == "operator":
            return principal
        row = await repo.get_status(self.pool, principal.access_key)
        if row is None or row["status"] != "active":
            raise InvalidToken("the token's credential is revoked")
        if row["role"] == "tenant":
            if row["tenant_status"] == "suspended":
                raise TenantSuspended(f"tenant {row['tenant_id']!r} is suspended", tenant=row["tenant_id"])
            if row["tenant_status"] != "active":
                raise InvalidToken("the token's tenant no longer exists")
        return dataclasses.replace(principal, grants=tuple(grants_from_json(row["grants"])))

    async def bootstrap_operator(self, path: str) -> str | None:
        """When no active operator credential exists, make one and write it to ``path`` (0600).
        Returns the new access key, or None when there was one already."""
        async with self.pool.acquire() as conn:
            # instances starting together on an empty database: one bootstraps, the others see it
            await conn.execute("SELECT pg_advisory_lock($1)", BOOTSTRAP_LOCK_KEY)
            try:
                if await repo.count_active_operators(conn) > 0:
                    return None
                made = await self.create(tenant_id=None, role="operator", description="bootstrap operator")
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", BOOTSTRAP_LOCK_KEY)
        doc = {"access_key": made["access_key"], "secret": made["secret"]}
        write_private_file(path, orjson.dumps(doc).decode() + "\n")
        log.info("bootstrap operator credential %s written to %s", made["access_key"], path)
        return str(made["access_key"])

    def decrypt(self, row: Record) -> DecryptedCredential:
        sealed = row["secret_sealed"]
        secret = "" if sealed is None else self.sealer.open(bytes(sealed), context=_context(row["access_key"])).decode()
        out: DecryptedCredential = {
            "access_key": row["access_key"],
            "tenant": row["tenant_id"] or OPERATOR_TENANT,
            "role": row["role"],
            "grants": list(row["grants"]),
            "secret": secret if row["status"] == "active" else "",
            "status": row["status"],
        }
        if row.get("bound_host") is not None:  # (rows of sealed_secrets only)
            out["broker_group"] = row["bound_group"]
            out["host"] = row["bound_host"]
        return out

    async def decrypted_credentials(self, *, tenant_ids: list[str]) -> list[DecryptedCredential]:
        """For the reconciler only, never served over HTTP: the tenants' credentials and every
        operator and broker credential, secrets decrypted."""
        return [self.decrypt(r) for r in await repo.sealed_secrets(self.pool, tenant_ids=tenant_ids)]
