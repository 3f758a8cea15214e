"""The partition tier (docs/partitions.md): one broker group, its members' paths behind proxies,
shared by a module's tests (``harness``), over the run's PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from control_plane.postgres import EmbeddedPostgres
from loadtest.partition.cluster import ClusterOptions
from loadtest.partition.run import Harness
from tests.postgres_fixture import TEMPLATE_DATABASE, postgres_server_fixture  # noqa: F401


@pytest_asyncio.fixture(scope="module", loop_scope="module", name="harness")
async def harness_fixture(
    postgres_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Harness]:
    """A running group (default lease settings) with its load and monitor, for a whole module;
    each test leaves it healed and settled for the next."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    dsn = postgres_server.create_database(name, template=TEMPLATE_DATABASE)
    root = tmp_path_factory.mktemp("partition")
    h = Harness(ClusterOptions(database_url=dsn), root=str(root), log=lambda m: print(m, flush=True))
    try:
        await h.start()
        yield h
    finally:
        await h.stop()
        postgres_server.drop_database(name)
