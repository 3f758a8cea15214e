"""Migrations: applied once, in order, recorded; an applied file that changed is refused."""

from __future__ import annotations

import dataclasses

import pytest

from control_plane import db
from control_plane.errors import MigrationError
from control_plane.migrate import apply_migrations, load_migrations
from control_plane.postgres import EmbeddedPostgres
from tests.postgres_fixture import postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_migrations_are_applied_once_and_recorded(postgres_server: EmbeddedPostgres) -> None:
    dsn = postgres_server.create_database("migrations_once")
    try:
        conn = await db.connect(dsn)
        try:
            migrations = load_migrations()
            versions = [m.version for m in migrations]
            assert versions == sorted(set(versions))
            assert versions[0] == 1
            assert await apply_migrations(conn) == [m.version for m in migrations]
            assert await apply_migrations(conn) == []
            rows = await conn.fetch("SELECT version, name, sha256 FROM schema_migrations ORDER BY version")
            assert [(r["version"], r["name"], r["sha256"]) for r in rows] == [
                (m.version, m.name, m.sha256) for m in migrations
            ]
            assert await conn.fetchval("SELECT count(*) FROM plans") == 3
            changed = [dataclasses.replace(migrations[0], sql=migrations[0].sql + "\n-- edited"), *migrations[1:]]
            with pytest.raises(MigrationError, match="changed after it was applied"):
                await apply_migrations(conn, changed)
        finally:
            await db.close(conn)
    finally:
        postgres_server.drop_database("migrations_once")
