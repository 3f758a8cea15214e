"""A broker group for the failover tests: the real control plane (its leases in a real
PostgreSQL), a name server, and a master and a slave process with failover on, their HA link
authenticated by a shared ha_secret_file; plus a steady load of SDK producers and a push
consumer, recording what was acknowledged and consumed."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from loadtest.partition.checks import pull_everything
from sdk import ConsumeResult, Message, MessageExt, Producer, PushConsumer, SendStatus
from sdk.admin import AdminClient
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until
from tests.postgres_fixture import ControlPlaneHarness

TOPIC = "HaLoad"
QUEUES = 4
LEASE_S = 4.0
CHECK_S = 0.5


@dataclass
class Acked:
    msg_id: str
    body: bytes
    at: float  # monotonic time of the acknowledgement


@dataclass
class HaGroup:
    cp: ControlPlaneHarness
    namesrv: ServerProcess
    start_broker: Callable[..., ServerProcess]
    tmp: Path
    credentials_file: Path
    role: str
    flush: str
    secret_file: Path
    members: dict[int, ServerProcess] = field(default_factory=dict)
    admin: AdminClient | None = None
    extra: tuple[str, ...] = ()  # more broker flags, for every member

    def flags(self, member: int) -> list[str]:
        role = "SLAVE" if member else self.role
        return [
            "--role", role, "--broker-id", str(member), "--flush", self.flush,
            "--set", "ha_listen=127.0.0.1:0", "--set", "ha_sync_timeout_ms=2000",
            "--set", "failover_enabled=true",
            "--set", f"failover_lease_s={LEASE_S}", "--set", f"failover_check_interval_s={CHECK_S}",
            "--set", f"control_plane_url={self.cp.url}",
            "--set", f"broker_credentials_file={self.credentials_file}",
            "--set", "register_interval_s=2",
            "--set", f"ha_secret_file={self.secret_file}",
            *self.extra,
        ]  # fmt: skip

    async def start(self, member: int) -> ServerProcess:
        store = self.tmp / "stores" / f"member-{member}"
        p = await asyncio.to_thread(
            self.start_broker, self.namesrv.address, *self.flags(member), name="broker-a", store_dir=store
        )
        self.members[member] = p
        return p

    async def status(self, member: int) -> dict[str, str]:
        assert self.admin is not None
        return await self.admin.broker_status(self.members[member].address)

    async def wait_role(self, member: int, role: str, timeout_s: float = 20.0) -> None:
        async def ok() -> bool:
            st = await self.status(member)
            if role == "SLAVE":
                return st["brokerRole"] == "SLAVE" and st.get("haConnected") == "True"
            return st["brokerRole"] == role and st.get("haFenced") == "False"

        try:
            await until(ok, f"member {member} {role}", timeout_s=timeout_s)
        except BaseException:
            print("fleet view:", (await self.cp.call("GET", "/v1/fleet/ha", operator=True)).body)
            raise

    async def wait_in_sync(self, member: int, timeout_s: float = 20.0) -> None:
        """Until the master has reported ``member`` in its in-sync set: only then is it
        electable (a master killed before that leaves the group waiting for it)."""

        async def ok() -> bool:
            view = await self.cp.call("GET", "/v1/fleet/ha", operator=True)
            groups = [g for g in view.body["broker_groups"] if g["broker_name"] == "broker-a"]
            return bool(groups) and member in (groups[0]["sync_set"] or [])

        await until(ok, f"member {member} in the in-sync set", timeout_s=timeout_s)


async def new_group(
    cp: ControlPlaneHarness, namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp: Path,
    *, role: str, flush: str, extra: tuple[str, ...] = (),
) -> HaGroup:  # fmt: skip
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    assert made.status == 201, made.body
    creds = tmp / "broker-credentials.json"
    creds.write_bytes(orjson.dumps({"access_key": made.body["access_key"], "secret": made.body["secret"]}))
    os.chmod(creds, 0o600)
    secret_file = tmp / "ha.secret"
    secret_file.write_text(secrets.token_urlsafe(32))
    os.chmod(secret_file, 0o600)
    g = HaGroup(cp, namesrv, start_broker, tmp, creds, role, flush, secret_file, extra=extra)
    g.admin = AdminClient(namesrv.address)
    await g.start(0)
    await g.wait_role(0, role)
    await g.start(1)
    await g.wait_role(1, "SLAVE")
    await g.wait_in_sync(1)
    return g


@dataclass
class Load:
    """Producers sending numbered messages until stopped; only SEND_OK counts as acknowledged."""

    namesrv: str
    senders: int = 4
    acked: list[Acked] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _producer: Producer | None = None

    async def start(self) -> None:
        self._producer = Producer(
            "ha-load", namesrv_addrs=self.namesrv, instance_name="ha-load", route_refresh_interval_ms=500,
            send_timeout_ms=3000, retry_times=0,
        )  # fmt: skip
        await self._producer.start()
        await self._producer.create_topic(TOPIC, queue_nums=QUEUES)
        self._tasks = [asyncio.create_task(self._send(i)) for i in range(self.senders)]

    async def _send(self, sender: int) -> None:
        assert self._producer is not None
        n = 0
        while not self._stop.is_set():
            body = f"s{sender}-{n}-".encode() + os.urandom(200)
            n += 1
            try:
                r = await self._producer.send(Message(TOPIC, body))
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.05)
                continue
            self.statuses[r.status.value] = self.statuses.get(r.status.value, 0) + 1
            if r.status is SendStatus.SEND_OK:
                self.acked.append(Acked(r.msg_id, body, time.monotonic()))

    def acked_since(self, t: float) -> int:
        return sum(1 for a in self.acked if a.at > t)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._producer is not None:
            await self._producer.shutdown()


@dataclass
class Consumer:
    namesrv: str
    got: dict[str, int] = field(default_factory=dict)
    consumer: PushConsumer | None = None

    async def start(self) -> None:
        async def handle(msgs: list[MessageExt]) -> ConsumeResult:
            for m in msgs:
                self.got[m.msg_id] = self.got.get(m.msg_id, 0) + 1
            return ConsumeResult.SUCCESS

        self.consumer = PushConsumer(
            "ha-load-readers", namesrv_addrs=self.namesrv, instance_name="ha-readers", consume_from="FIRST_OFFSET",
            persist_interval_ms=200, pull_retry_delay_ms=100, route_refresh_interval_ms=500,
        )  # fmt: skip
        self.consumer.subscribe(TOPIC, "*")
        self.consumer.on_message(handle)
        await self.consumer.start()

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.shutdown()


async def read_all(admin: AdminClient, addr: str) -> dict[str, bytes]:
    """Every message of TOPIC stored at ``addr``, by message id (UNIQ_KEY), read with pulls."""
    return {m.msg_id: m.body for m in await pull_everything(admin, addr, TOPIC, "broker-a", QUEUES)}
