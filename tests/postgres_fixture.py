"""PostgreSQL for the test run, a fresh database per test, and a running control plane.

    from tests.postgres_fixture import (  # noqa: F401
        control_plane_fixture, postgres_dsn_fixture, postgres_server_fixture)

(each fixture function is named ``*_fixture`` and registered under the name before it, so a test
module imports the functions and asks for ``postgres_server``, ``postgres_dsn``, ``control_plane``)

- ``postgres_server`` (session): one ``EmbeddedPostgres`` for the whole run (system binaries,
  or the PyPI-packaged fallback), fsync off, in a directory under /tmp (when root, PostgreSQL runs
  as the ``postgres`` user, who must be able to enter it). A template database
  ``orbit_template`` gets the control plane's migrations once.
- ``postgres_dsn`` (function): a new database cloned from that template (``CREATE DATABASE …
  TEMPLATE``, a few milliseconds), dropped after the test.
- ``control_plane`` (async, function): the real aiohttp app on 127.0.0.1 port 0 over that
  database, with an operator credential; ``ControlPlaneHarness.call`` sends requests.
  ``serve_control_plane`` is the same as an async context manager (optionally with a Telemetry
  of the test's); ``ControlPlaneHarness.of_operator`` / ``log_in_operator`` build a harness for
  a control plane served some other way.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import secrets
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from control_plane import db
from control_plane.app import create_app
from control_plane.migrate import apply_migrations
from control_plane.postgres import EmbeddedPostgres
from control_plane.services import Services
from control_plane.settings import MasterKey, Settings

if TYPE_CHECKING:
    from data_plane.telemetry import Telemetry

TEMPLATE_DATABASE = "orbit_template"


async def _migrate(dsn: str) -> None:
    conn = await db.connect(dsn)
    try:
        await apply_migrations(conn)
    finally:
        await db.close(conn)


@pytest.fixture(scope="session", name="postgres_server")
def postgres_server_fixture() -> Iterator[EmbeddedPostgres]:
    data_dir = tempfile.mkdtemp(prefix="orbit-pg-")
    server = EmbeddedPostgres(data_dir, durable=False)
    try:
        server.start()
        dsn = server.create_database(TEMPLATE_DATABASE)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, _migrate(dsn)).result()
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(name="postgres_dsn")
def postgres_dsn_fixture(postgres_server: EmbeddedPostgres) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    dsn = postgres_server.create_database(name, template=TEMPLATE_DATABASE)
    try:
        yield dsn
    finally:
        postgres_server.drop_database(name)


def make_settings(dsn: str, tmp_path: Path, **changes: Any) -> Settings:
    values: dict[str, Any] = {
        "master_key": MasterKey(secrets.token_bytes(32)),
        "database_url": dsn,
        "listen": "127.0.0.1:0",
        "bootstrap_credentials_file": str(tmp_path / "operator.json"),
        "pool_min_size": 1,
        "pool_max_size": 5,
        "reconcile_interval_s": 0,  # tests that want the reconciler ask for it
        "autoscale_interval_s": 0,  # and the autoscaler
    }
    values.update(changes)
    return Settings(**values)


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class ControlPlaneHarness:
    url: str
    settings: Settings
    services: Services
    session: aiohttp.ClientSession
    operator_access_key: str
    operator_secret: str
    operator_token: str

    @classmethod
    def of_operator(
        cls, url: str, settings: Settings, services: Services, session: aiohttp.ClientSession
    ) -> ControlPlaneHarness:
        """A harness holding the bootstrap operator credential the control plane wrote at start
        (no token yet: ``log_in_operator`` once it serves)."""
        with open(settings.bootstrap_credentials_file, "rb") as f:
            operator = orjson.loads(f.read())
        return cls(
            url=url,
            settings=settings,
            services=services,
            session=session,
            operator_access_key=operator["access_key"],
            operator_secret=operator["secret"],
            operator_token="",
        )

    async def log_in_operator(self) -> None:
        """Fetch the operator's token from the token endpoint (``call(..., operator=True)`` sends it)."""
        self.operator_token = await self.token_for(self.operator_access_key, self.operator_secret)

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        json: Any = None,
        data: bytes | str | dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        operator: bool = False,
    ) -> Reply:
        """One request; ``operator=True`` sends the operator token. The body is parsed as JSON
        when it is JSON."""
        sent = dict(headers or {})
        bearer = self.operator_token if operator else token
        if bearer is not None:
            sent["Authorization"] = f"Bearer {bearer}"
        payload: Any = data
        if json is not None:
            payload = orjson.dumps(json)
            sent.setdefault("Content-Type", "application/json")
        async with self.session.request(method, self.url + path, data=payload, headers=sent) as resp:
            raw = await resp.read()
            body: Any = orjson.loads(raw) if resp.content_type == "application/json" and raw else raw
            return Reply(resp.status, body, dict(resp.headers))

    async def token_request(self, client_id: str, client_secret: str) -> Reply:
        """The token endpoint's answer to a client-credentials grant with the credential in the form."""
        form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
        return await self.call("POST", "/oauth/token", data=form)

    async def token_for(self, access_key: str, secret: str) -> str:
        basic = base64.b64encode(f"{access_key}:{secret}".encode()).decode()
        headers = {"Authorization": f"Basic {basic}"}
        reply = await self.call("POST", "/oauth/token", data={"grant_type": "client_credentials"}, headers=headers)
        assert reply.status == 200, reply.body
        return str(reply.body["access_token"])

    async def new_tenant(self, tenant_id: str, *, plan: str = "standard") -> tuple[dict[str, Any], str]:
        """A tenant with one default credential; returns (credential with secret, its token)."""
        reply = await self.call("POST", "/v1/tenants", operator=True, json={"id": tenant_id, "plan": plan})
        assert reply.status == 201, reply.body
        made = await self.call("POST", f"/v1/tenants/{tenant_id}/credentials", operator=True, json={})
        assert made.status == 201, made.body
        return made.body, await self.token_for(made.body["access_key"], made.body["secret"])

    async def new_broker_group(self, name: str, *, max_queues: int = 1000) -> dict[str, Any]:
        reply = await self.call(
            "POST",
            "/v1/fleet/broker-groups",
            operator=True,
            json={
                "name": name,
                "namesrv_addrs": ["127.0.0.1:9876"],
                "broker_addrs": ["127.0.0.1:10911"],
                "max_queues": max_queues,
                "max_msgs_per_s": 100_000,
                "storage_bytes": 1 << 40,
            },
        )
        assert reply.status == 201, reply.body
        return dict(reply.body)


@contextlib.asynccontextmanager
async def serve_control_plane(
    postgres_dsn: str, tmp_path: Path, *, telemetry: Telemetry | None = None, **changes: Any
) -> AsyncIterator[ControlPlaneHarness]:
    """The real app (``telemetry``: the caller's, else none) on 127.0.0.1 port 0 over the
    database, with its operator logged in; stopped, and its pool closed, on exit. ``changes``
    override settings (``reconcile_interval_s=0.5`` runs the reconciler)."""
    settings = make_settings(postgres_dsn, tmp_path, **changes)
    pool = await db.create_pool(settings.database_url, min_size=1, max_size=settings.pool_max_size)
    runner: web.AppRunner | None = None
    try:
        services = Services.create(pool, settings)
        await services.start()
        runner = web.AppRunner(create_app(settings, services=services, telemetry=telemetry))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        port = server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession() as session:
            harness = ControlPlaneHarness.of_operator(f"http://127.0.0.1:{port}", settings, services, session)
            await harness.log_in_operator()
            yield harness
    finally:
        if runner is not None:
            await runner.cleanup()
        await pool.close()


@pytest_asyncio.fixture(name="control_plane")
async def control_plane_fixture(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[ControlPlaneHarness]:
    async with serve_control_plane(postgres_dsn, tmp_path) as harness:
        yield harness
