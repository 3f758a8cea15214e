"""The database seam: asyncpg behind small typed protocols.

asyncpg ships no type information, so this is the one module importing it; everything else
types against ``Connection`` / ``Pool`` here. ``jsonb`` columns are decoded and encoded with
orjson by the pool's connection set-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, cast

import asyncpg  # type: ignore[import-untyped]
import orjson

Record = Mapping[str, Any]

PostgresError: type[Exception] = asyncpg.PostgresError
UniqueViolation: type[Exception] = asyncpg.UniqueViolationError
ForeignKeyViolation: type[Exception] = asyncpg.ForeignKeyViolationError
DuplicateDatabase: type[Exception] = asyncpg.DuplicateDatabaseError


class Connection(Protocol):
    async def execute(self, query: str, *args: Any) -> str: ...
    async def executemany(self, query: str, args: Any) -> None: ...
    async def fetch(self, query: str, *args: Any) -> list[Record]: ...
    async def fetchrow(self, query: str, *args: Any) -> Record | None: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...
    def transaction(self, *, isolation: str | None = None) -> AbstractAsyncContextManager[Any]: ...


class Pool(Connection, Protocol):
    def acquire(self) -> AbstractAsyncContextManager[Connection]: ...
    async def close(self) -> None: ...


async def _init_connection(conn: Any) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: orjson.dumps(v).decode(),
        decoder=orjson.loads,
        schema="pg_catalog",
    )


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> Pool:
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection, server_settings={"timezone": "UTC"}
    )
    return cast(Pool, pool)


async def connect(dsn: str) -> Connection:
    """One connection (no jsonb codec): for migrations and administrative statements."""
    return cast(Connection, await asyncpg.connect(dsn))


async def close(conn: Connection) -> None:
    await cast(Any, conn).close()
