"""Credentials: access key, role, scrypt hash and sealed copy of the secret, grants, status.
The public column list never includes the hash or the sealed secret."""

from __future__ import annotations

from typing import Any

from control_plane.db import Connection, Record
from control_plane.errors import CredentialNotFound

PUBLIC_COLUMNS = "access_key, tenant_id, role, grants, description, status, created_at, revoked_at"


def _not_found(access_key: str) -> CredentialNotFound:
    return CredentialNotFound(f"no credential {access_key!r} here", access_key=access_key)


async def insert_credential(
    conn: Connection,
    *,
    access_key: str,
    tenant_id: str | None,
    role: str,
    secret_hash: str,
    secret_sealed: bytes,
    grants: list[Any],
    description: str,
) -> Record:
    row = await conn.fetchrow(
        f"""INSERT INTO credentials (access_key, tenant_id, role, secret_hash, secret_sealed, grants, description)
            VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {PUBLIC_COLUMNS}""",
        access_key,
        tenant_id,
        role,
        secret_hash,
        secret_sealed,
        grants,
        description,
    )
    assert row is not None
    return row


async def get_for_login(conn: Connection, access_key: str) -> Record | None:
    """The credential with its secret hash and its tenant's status (None for operators)."""
    return await conn.fetchrow(
        f"""SELECT {", ".join("c." + c for c in PUBLIC_COLUMNS.split(", "))}, c.secret_hash,
                   t.status AS tenant_status
            FROM credentials c LEFT JOIN tenants t ON t.id = c.tenant_id
            WHERE c.access_key = $1""",
        access_key,
    )


async def get_status(conn: Connection, access_key: str) -> Record | None:
    """Credential status and tenant status, checked on every authenticated API request."""
    return await conn.fetchrow(
        """SELECT c.status, c.role, c.tenant_id, c.grants, t.status AS tenant_status
           FROM credentials c LEFT JOIN tenants t ON t.id = c.tenant_id WHERE c.access_key = $1""",
        access_key,
    )


async def require_credential(conn: Connection, *, tenant_id: str | None, access_key: str) -> Record:
    row = await conn.fetchrow(
        f"SELECT {PUBLIC_COLUMNS} FROM credentials WHERE access_key = $1 AND tenant_id IS NOT DISTINCT FROM $2",
        access_key,
        tenant_id,
    )
    if row is None:
        raise _not_found(access_key)
    return row


async def list_credentials(conn: Connection, *, tenant_id: str | None) -> list[Record]:
    """A tenant's credentials, or (``tenant_id=None``) the operator and broker credentials."""
    return await conn.fetch(
        f"SELECT {PUBLIC_COLUMNS} FROM credentials WHERE tenant_id IS NOT DISTINCT FROM $1"
        " ORDER BY created_at, access_key",
        tenant_id,
    )


async def revoke(conn: Connection, *, tenant_id: str | None, access_key: str) -> Record:
    """Revoke and forget the sealed secret (only the hash, useless for signing, stays)."""
    row = await conn.fetchrow(
        f"""UPDATE credentials SET status = 'revoked', secret_sealed = NULL,
                   revoked_at = COALESCE(revoked_at, now())
            WHERE access_key = $1 AND tenant_id IS NOT DISTINCT FROM $2 RETURNING {PUBLIC_COLUMNS}""",
        access_key,
        tenant_id,
    )
    if row is None:
        raise _not_found(access_key)
    return row


async def revoke_operator_and_broker(conn: Connection, *, access_keys: list[str]) -> list[Record]:
    """Revoke these operator or broker credentials (tenant credentials are left alone) and forget
    their sealed secrets; already revoked ones keep their ``revoked_at``."""
    return await conn.fetch(
        f"""UPDATE credentials SET status = 'revoked', secret_sealed = NULL,
                   revoked_at = COALESCE(revoked_at, now())
            WHERE access_key = ANY($1::text[]) AND tenant_id IS NULL RETURNING {PUBLIC_COLUMNS}""",
        access_keys,
    )


async def revoke_all_of_tenant(conn: Connection, *, tenant_id: str) -> None:
    await conn.execute(
        """UPDATE credentials SET status = 'revoked', secret_sealed = NULL, revoked_at = COALESCE(revoked_at, now())
           WHERE tenant_id = $1""",
        tenant_id,
    )


async def set_grants(conn: Connection, *, tenant_id: str, access_key: str, grants: list[Any]) -> Record:
    row = await conn.fetchrow(
        f"UPDATE credentials SET grants = $3 WHERE access_key = $1 AND tenant_id = $2 RETURNING {PUBLIC_COLUMNS}",
        access_key,
        tenant_id,
        grants,
    )
    if row is None:
        raise _not_found(access_key)
    return row


async def count_active_operators(conn: Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM credentials WHERE role = 'operator' AND status = 'active'"))


async def sealed_secrets(conn: Connection, *, tenant_ids: list[str]) -> list[Record]:
    """For desired state: the given tenants' credentials plus every operator and broker
    credential, with the sealed secret, and for a broker credential bound to one host of a broker
    group (broker_host_credentials) that group and host (``bound_group``, ``bound_host``)."""
    return await conn.fetch(
        f"""SELECT c.*, h.broker_group AS bound_group, h.host AS bound_host
            FROM (SELECT {PUBLIC_COLUMNS}, secret_sealed FROM credentials
                  WHERE tenant_id = ANY($1::text[]) OR tenant_id IS NULL) c
            LEFT JOIN broker_host_credentials h USING (access_key)
            ORDER BY access_key""",
        tenant_ids,
    )
