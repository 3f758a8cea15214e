"""Orbit's multi-tenancy put together for end-to-end tests: the real control plane (in this
process, with its reconciler), a real name server and a real broker process with authentication,
quotas and metering on, all on 127.0.0.1.

    from tests.integration.tenancy_cluster import tenancy_fixture  # noqa: F401   (fixture ``tenancy``)
    from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

    async def test_x(tenancy: TenancyCluster) -> None:
        acme = await tenancy.new_tenant("acme")
        await tenancy.create_topic(acme, "orders")         # waits until it is active on the broker

The control plane's HTTP server can be stopped and started again on the same port
(``stop_control_plane`` / ``start_control_plane``): the broker keeps its URL. Brokers are started
through ``start_broker`` in a worker thread, since a starting broker fetches the JWKS from the
control plane served by this very event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest_asyncio
from aiohttp import web

from control_plane import db
from control_plane.app import create_app
from control_plane.context import RECONCILER
from control_plane.reconciler import Reconciler
from control_plane.services import Services
from control_plane.settings import Settings
from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk.credentials import ClientCredentials
from tests.integration import helpers
from tests.integration.conftest import ServerProcess
from tests.postgres_fixture import ControlPlaneHarness, make_settings

GROUP = "broker-a"  # the broker group in the control plane, and the broker's name
RECONCILE_INTERVAL_S = 0.5
# Small store files; no DISK_FULL refusals on a busy shared disk (disk policy is not tested here).
STORE_FLAGS = ["--store-set", "commit_log_file_size_bytes=8388608", *helpers.NO_DISK_POLICY]


# ``helpers.until`` with this module's pace: the conditions here are requests to the control plane.
until = functools.partial(helpers.until, timeout_s=15.0, every_s=0.05)


@dataclass
class Tenant:
    id: str
    access_key: str
    secret: str
    token: str  # a JWT of its default credential, from the token endpoint

    def credentials(self, cluster: TenancyCluster) -> ClientCredentials:
        """OAuth client credentials for the SDK (closed with the cluster)."""
        creds = ClientCredentials(self.access_key, self.secret, cluster.cp.url + "/oauth/token")
        cluster.to_close.append(creds)
        return creds


@dataclass
class TenancyCluster:
    cp: ControlPlaneHarness
    settings: Settings
    services: Services
    namesrv: ServerProcess
    tmp: Path
    spawn_broker: Callable[..., ServerProcess]
    broker: ServerProcess | None = None
    broker_credentials_file: Path | None = None
    port: int = 0
    registered: bool = False  # broker group GROUP exists in the control plane
    runner: web.AppRunner | None = None
    wire: RemotingClient = field(default_factory=RemotingClient)
    to_close: list[ClientCredentials] = field(default_factory=list)

    # --- the control plane ---------------------------------------------------------------------
    async def start_control_plane(self) -> None:
        """Serve the app (with its reconciler) again on ``self.port``."""
        self.runner, self.port = await serve_control_plane(self.settings, self.services, self.port)
        self.cp.url = f"http://127.0.0.1:{self.port}"

    async def stop_control_plane(self) -> None:
        """Close the HTTP server and its connections, and stop the reconciler."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def reconciler(self) -> Reconciler:
        assert self.runner is not None, "the control plane is stopped"
        return self.runner.app[RECONCILER]

    async def reconciled(self, rounds: int = 2, timeout_s: float = 15.0) -> None:
        """Wait until ``rounds`` whole reconcile rounds started after this call (kicking one now)
        and the last one reached the broker and the name server without errors."""
        rec = self.reconciler
        start = rec.rounds
        rec.kick()

        def done() -> bool:
            if rec.rounds < start + rounds:
                rec.kick()
                return False
            synced = all(not r.errors and r.tenancy_version for r in rec.last_reports) and bool(rec.last_reports)
            return synced and not rec.namesrv_errors

        await until(done, "reconcile rounds without errors", timeout_s=timeout_s)

    # --- the broker ------------------------------------------------------------------------------
    def broker_flags(self, *extra: str) -> list[str]:
        assert self.broker_credentials_file is not None
        return [
            *STORE_FLAGS,
            "--set",
            "auth_enabled=true",
            "--set",
            f"control_plane_url={self.cp.url}",
            "--set",
            f"broker_credentials_file={self.broker_credentials_file}",
            "--set",
            "usage_roll_interval_s=1",
            "--set",
            "usage_report_interval_s=1",
            "--set",
            "load_report_interval_s=0.5",
            *extra,
        ]

    async def start_broker(self, *extra: str) -> ServerProcess:
        """The broker process (same store dir every time), and its address in the broker group."""
        p = await asyncio.to_thread(self.spawn_broker, self.namesrv.address, *self.broker_flags(*extra), name=GROUP)
        self.broker = p
        if self.runner is not None and self.registered:
            reply = await self.cp.call(
                "PATCH", f"/v1/fleet/broker-groups/{GROUP}", operator=True, json={"broker_addrs": [p.address]}
            )
            assert reply.status == 200, reply.body
        return p

    async def stop_broker(self) -> None:
        assert self.broker is not None
        broker, self.broker = self.broker, None
        await asyncio.to_thread(broker.stop)
        self.wire.close_connection(broker.address)

    @property
    def broker_addr(self) -> str:
        assert self.broker is not None
        return self.broker.address

    async def invoke(
        self, cmd: RemotingCommand, *, token: str | None = None, timeout_ms: int = 5000
    ) -> RemotingCommand:
        """One request to the broker, with ``Authorization: Bearer token`` when given."""
        if token is not None:
            cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {token}"}
        return await self.wire.invoke(self.broker_addr, cmd, timeout_ms)

    async def operator_json(self, code: int) -> dict[str, Any]:
        resp = await self.invoke(RemotingCommand(code), token=self.cp.operator_token)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        return bodies.loads_object(resp.body_bytes())

    async def broker_topics(self) -> dict[str, Any]:
        table: dict[str, Any] = (await self.operator_json(RequestCode.GET_ALL_TOPIC_CONFIG)).get("topicConfigTable", {})
        return table

    async def broker_groups(self) -> dict[str, Any]:
        table: dict[str, Any] = (await self.operator_json(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).get(
            "subscriptionGroupTable", {}
        )
        return table

    # --- tenants and their resources -------------------------------------------------------------
    async def new_tenant(self, tenant_id: str, *, plan: str = "standard") -> Tenant:
        made, token = await self.cp.new_tenant(tenant_id, plan=plan)
        return Tenant(tenant_id, made["access_key"], made["secret"], token)

    async def create_topic(self, tenant: Tenant, name: str, **spec: Any) -> dict[str, Any]:
        """POST the topic with the tenant's token; wait until it is active (on the broker)."""
        reply = await self.cp.call(
            "POST", f"/v1/tenants/{tenant.id}/topics", token=tenant.token, json={"name": name, **spec}
        )
        assert reply.status == 201, reply.body
        path = f"/v1/tenants/{tenant.id}/topics/{name}"

        async def active() -> bool:
            got = await self.cp.call("GET", path, token=tenant.token)
            return got.status == 200 and got.body["status"] == "active"

        await until(active, f"topic {tenant.id}%{name} active")
        # The tenancy snapshot (its credentials, limits) reaches the broker in the same round.
        await self.reconciled(rounds=1)
        return dict(reply.body)

    async def create_group(self, tenant: Tenant, name: str, **spec: Any) -> None:
        """POST the consumer group; wait until the broker has its subscription group."""
        reply = await self.cp.call(
            "POST", f"/v1/tenants/{tenant.id}/groups", token=tenant.token, json={"name": name, **spec}
        )
        assert reply.status == 201, reply.body

        async def on_broker() -> bool:
            return f"{tenant.id}%{name}" in await self.broker_groups()

        await until(on_broker, f"group {tenant.id}%{name} on the broker")

    async def close(self) -> None:
        for c in self.to_close:
            await c.aclose()
        await self.wire.close()


def tenancy_namesrv_flags(control_plane_url: str, state_dir: Path) -> list[str]:
    """``orbit namesrv`` flags of a multi-tenant cluster's name server."""
    return ["--tenancy", "--control-plane-url", control_plane_url, "--state-dir", str(state_dir)]


async def serve_control_plane(settings: Settings, services: Services, port: int = 0) -> tuple[web.AppRunner, int]:
    """The control plane's app (with its reconciler) served on 127.0.0.1:``port`` (0: a port the
    system picks): its runner and port."""
    runner = web.AppRunner(create_app(settings, services=services))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    return runner, int(runner.addresses[0][1])


@pytest_asyncio.fixture(name="tenancy")
async def tenancy_fixture(
    postgres_dsn: str,
    tmp_path: Path,
    start_namesrv: Callable[..., ServerProcess],
    start_broker: Callable[..., ServerProcess],
) -> AsyncIterator[TenancyCluster]:
    """Control plane (reconciling every 0.5 s) + a multi-tenant name server (checking credentials
    against the control plane's keys and the access keys and fleet its reconciler sends) + one
    authenticating broker, registered as broker group ``broker-a`` with its real address."""
    settings = make_settings(postgres_dsn, tmp_path, reconcile_interval_s=RECONCILE_INTERVAL_S)
    pool = await db.create_pool(settings.database_url, min_size=1, max_size=settings.pool_max_size)
    cluster: TenancyCluster | None = None
    try:
        services = Services.create(pool, settings)
        await services.start()
        async with aiohttp.ClientSession() as session:
            harness = ControlPlaneHarness.of_operator("", settings, services, session)
            # The control plane serves first, on a port of its own choosing (none picked free
            # beforehand, which another process could take in between); the name server is then
            # told its URL, and finds it answering.
            runner, cp_port = await serve_control_plane(settings, services)
            harness.url = f"http://127.0.0.1:{cp_port}"
            try:
                # (off the loop: the control plane on it answers the name server's first JWKS fetch)
                flags = tenancy_namesrv_flags(harness.url, tmp_path / "namesrv-state")
                namesrv = await asyncio.to_thread(start_namesrv, *flags)
                cluster = TenancyCluster(harness, settings, services, namesrv, tmp_path, start_broker,
                                         port=cp_port, runner=runner)  # fmt: skip
            finally:
                if cluster is None:
                    await runner.cleanup()
            await harness.log_in_operator()
            made = await harness.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
            assert made.status == 201, made.body
            cred_file = tmp_path / f"broker-credentials-{uuid.uuid4().hex[:6]}.json"
            cred_file.write_bytes(orjson.dumps({"access_key": made.body["access_key"], "secret": made.body["secret"]}))
            os.chmod(cred_file, 0o600)
            cluster.broker_credentials_file = cred_file
            broker = await cluster.start_broker()
            reply = await harness.call(
                "POST",
                "/v1/fleet/broker-groups",
                operator=True,
                json={
                    "name": GROUP,
                    "namesrv_addrs": [namesrv.address],
                    "broker_addrs": [broker.address],
                    "max_queues": 1000,
                    "max_msgs_per_s": 100_000,
                    "storage_bytes": 1 << 40,
                },
            )
            assert reply.status == 201, reply.body
            cluster.registered = True
            await cluster.reconciled(rounds=1)
            try:
                yield cluster
            finally:
                await cluster.close()
                await cluster.stop_control_plane()
    finally:
        await pool.close()


# --- a flooding client, in its own process (``python -m tests.integration.tenancy_cluster``) ----
async def flood(
    namesrv: str,
    token_url: str,
    access_key: str,
    secret: str,
    topic: str,
    concurrency: int,
    seconds: float,
    saturated_after: int,
    connections: int = 1,
) -> dict[str, int]:
    """``concurrency`` SDK senders over ``connections`` client instances (a connection each),
    each sending one message after another for ``seconds`` or until stdin is closed; prints
    ``{"started": true}`` once ``saturated_after`` sends were acknowledged (past the bucket's
    burst, the flood is then held to the quota), and at the end its counts as JSON."""
    import sys

    from sdk import Message, Producer
    from sdk.errors import FlowControlError, OrbitError

    creds = ClientCredentials(access_key, secret, token_url)
    acked = flow_errors = other_errors = requests = refusals = 0
    started = False
    producers = [
        Producer(
            f"{topic.partition('%')[0]}%flood",
            namesrv_addrs=namesrv,
            credentials=creds,
            send_timeout_ms=2000,
            instance_name=f"flood-{i}",
        )
        for i in range(max(1, connections))
    ]
    try:
        async with contextlib.AsyncExitStack() as stack:
            for p in producers:
                await stack.enter_async_context(p)
                inst = p.instance

                def counting(plain_invoke: Any) -> Any:
                    async def counting_invoke(addr: str, cmd: Any, timeout_ms: int | None = None) -> Any:
                        nonlocal requests, refusals
                        resp = await plain_invoke(addr, cmd, timeout_ms)
                        requests += 1
                        refusals += resp.code == ResponseCode.FLOW_CONTROL
                        return resp

                    return counting_invoke

                inst.invoke = counting(inst.invoke)  # type: ignore[method-assign]  # counts what the broker answered
            end = time.monotonic() + seconds
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader()
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

            async def watch_stdin() -> None:
                await reader.read()
                stop.set()

            watcher = loop.create_task(watch_stdin())

            async def sender(p: Producer) -> None:
                nonlocal acked, flow_errors, other_errors, started
                while time.monotonic() < end and not stop.is_set():
                    try:
                        await p.send(Message(topic, b"x" * 256))
                    except FlowControlError:
                        flow_errors += 1
                        continue
                    except OrbitError:  # a send timeout at the end of the run
                        other_errors += 1
                        continue
                    acked += 1
                    if not started and acked >= saturated_after:
                        started = True
                        sys.stdout.write('{"started": true}\n')
                        sys.stdout.flush()

            await asyncio.gather(*(sender(producers[i % len(producers)]) for i in range(concurrency)))
            watcher.cancel()
    finally:
        await creds.aclose()
    return {
        "acked": acked,
        "flow_control_errors": flow_errors,
        "other_errors": other_errors,
        "requests": requests,
        "refused": refusals,
        "cpu_ms": round(time.process_time() * 1000),
    }


def _main() -> None:
    import argparse
    import sys

    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["flood"])
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--token-url", required=True)
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--saturated-after", type=int, default=1)
    ap.add_argument("--connections", type=int, default=1)
    a = ap.parse_args()
    out = asyncio.run(
        flood(
            a.namesrv,
            a.token_url,
            a.access_key,
            a.secret,
            a.topic,
            a.concurrency,
            a.seconds,
            a.saturated_after,
            a.connections,
        )
    )
    sys.stdout.write(orjson.dumps(out).decode() + "\n")


if __name__ == "__main__":
    _main()
