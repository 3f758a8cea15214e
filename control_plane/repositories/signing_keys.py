"""JWT signing keys: one active, retired ones kept while tokens they signed may still be valid."""

from __future__ import annotations

from typing import Any

from control_plane.db import Connection, Record

_COLUMNS = "kid, algorithm, public_jwk, private_key_sealed, status, created_at, retired_at"


async def insert_key(
    conn: Connection, *, kid: str, algorithm: str, public_jwk: dict[str, Any], private_key_sealed: bytes
) -> None:
    await conn.execute(
        """INSERT INTO signing_keys (kid, algorithm, public_jwk, private_key_sealed, status)
           VALUES ($1, $2, $3, $4, 'active')""",
        kid,
        algorithm,
        public_jwk,
        private_key_sealed,
    )


async def get_active(conn: Connection, *, for_update: bool = False) -> Record | None:
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {_COLUMNS} FROM signing_keys WHERE status = 'active'{lock}")


async def retire(conn: Connection, kid: str) -> None:
    await conn.execute("UPDATE signing_keys SET status = 'retired', retired_at = now() WHERE kid = $1", kid)


async def published(conn: Connection, *, token_lifetime_s: int) -> list[Record]:
    """Keys that may have signed a still-valid token: the active one, and retired ones until
    ``retired_at + token_lifetime_s``."""
    return await conn.fetch(
        f"""SELECT {_COLUMNS} FROM signing_keys
            WHERE status = 'active' OR retired_at + make_interval(secs => $1) > now()
            ORDER BY created_at DESC""",
        token_lifetime_s,
    )
