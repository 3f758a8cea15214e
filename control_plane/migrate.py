"""Migrations: the numbered SQL files of ``control_plane/migrations`` applied in order, each in
its own transaction together with its row in ``schema_migrations`` (version, name, sha256).

Numbers are unique, not necessarily contiguous: migrations written on separate branches may
land in either order, and one whose number is below an applied one is applied when it appears
(each file must therefore stand on its own against the schema of the files numbered before it).

Several control planes may start at once: a session advisory lock lets one apply while the
others wait, then find nothing left to do. An applied file whose text changed is refused
(``MigrationError``): migrations are append-only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from control_plane.db import Connection, PostgresError
from control_plane.errors import MigrationError

ADVISORY_LOCK_KEY = 7_206_381_001  # an arbitrary constant shared by every instance
FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    sha256      text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("control_plane.migrations").iterdir():
        m = FILE_NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    found.sort(key=lambda x: x.version)
    versions = [x.version for x in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise MigrationError(f"migration numbers must be unique and start at 1 or later: {versions}")
    return found


async def apply_migrations(conn: Connection, migrations: list[Migration] | None = None) -> list[int]:
    """Apply what is not applied yet; returns the versions applied by this call."""
    migrations = load_migrations() if migrations is None else migrations
    applied_now: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(CREATE_TABLE)
        rows = await conn.fetch("SELECT version, sha256 FROM schema_migrations")
        done = {r["version"]: r["sha256"] for r in rows}
        for m in migrations:
            if m.version in done:
                if done[m.version] != m.sha256:
                    raise MigrationError(f"migration {m.version:04d}_{m.name} changed after it was applied")
                continue
            async with conn.transaction():
                try:
                    await conn.execute(m.sql)
                except PostgresError as e:
                    raise MigrationError(f"migration {m.version:04d}_{m.name} failed: {e}") from e
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
                    m.version,
                    m.name,
                    m.sha256,
                )
            applied_now.append(m.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
    return applied_now
